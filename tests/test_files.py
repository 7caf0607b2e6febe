"""Incident files are never lost: a full disk or a killed process leaves the previous file
whole, and the message says so. Tested on a real full filesystem (a small tmpfs, as root) or,
where mounting is not allowed, on a file-size limit (RLIMIT_FSIZE) that fails writes the same
way."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockdiag.core import snapshot_file
from lockdiag.demo.cluster import Cluster

from helpers.cli import lockdiag
from helpers.paths import INCIDENT
from helpers.servers import Sessions


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str = "512k") -> Iterator[bool]:
    """A tmpfs of ``size`` at ``directory``; yields False where mounting is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True, check=False,
    ).returncode == 0  # fmt: skip
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(directory)], check=True)


def fill(directory: Path, leave: int) -> None:
    """Fill the filesystem until about ``leave`` bytes are free."""
    free = shutil.disk_usage(directory).free
    with (directory / "filler").open("wb") as out:
        out.write(b"\0" * max(0, free - leave))


def limited_lockdiag(
    args: list[str], env: dict[str, str], limit: int | None
) -> subprocess.CompletedProcess[str]:
    """``lockdiag ARGS`` as a process whose writes past ``limit`` bytes fail."""

    def limited() -> None:
        if limit is not None:  # writes past the limit fail with EFBIG, as on a full disk
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return lockdiag(*args, env=env, preexec_fn=limited)


@pytest.fixture
def many_locks(sessions: Sessions) -> None:
    """Enough locks that the snapshot file, and a recording (an aggregated read, where one
    backend's many keys of one key space come back as one span), are larger than the room
    left for them: 3,000 key spaces of one key each."""
    sessions.open("many").run(
        "SELECT count(pg_advisory_lock(g, 7)) FROM generate_series(1, 3000) g"
    )


def test_a_full_disk_leaves_the_incident_file_whole(
    cluster: Cluster, many_locks: None, tmp_path: Path
) -> None:
    where = tmp_path / "disk"
    env = {**os.environ, "LOCKDIAG_DSN": cluster.dsn()}
    with small_filesystem(where) as mounted:
        target = where / "incident.json"
        shutil.copyfile(INCIDENT, target)
        before = target.read_bytes()
        recording = where / "watch.jsonl"
        line = json.dumps(json.loads(before), separators=(",", ":"))
        recording.write_text(line + "\n")
        if mounted:
            fill(where, leave=64 * 1024)
        limit = None if mounted else max(len(before), len(line)) + 64 * 1024

        result = limited_lockdiag(["snapshot", "-o", str(target)], env, limit)
        assert result.returncode == 2, result.stderr
        assert f"cannot write snapshot file {target}" in result.stderr
        assert f"{target} is unchanged" in result.stderr
        assert "Traceback" not in result.stderr
        assert target.read_bytes() == before
        assert not list(where.glob(".*partial"))  # nothing half-written left behind

        result = limited_lockdiag(["watch", "--once", "--record", str(recording)], env, limit)
        assert result.returncode == 2, result.stderr
        assert f"cannot append to recording {recording}" in result.stderr
        assert recording.read_text() == line + "\n"  # whole lines only, as before
        snapshot_file.loads(recording.read_text().splitlines()[0], "recording")


def test_a_killed_writer_leaves_the_incident_file_whole(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    sessions.open("many").run(
        "SELECT count(pg_advisory_lock(8, g)) FROM generate_series(1, 40000) g"
    )
    target = tmp_path / "incident.json"
    shutil.copyfile(INCIDENT, target)
    before = target.read_bytes()
    env = {**os.environ, "LOCKDIAG_DSN": cluster.dsn()}
    caught = 0
    for _ in range(5):  # until the kill lands while the new file is being written
        writer = subprocess.Popen(
            [sys.executable, "-m", "lockdiag", "snapshot", "-o", str(target)], env=env,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while writer.poll() is None and time.monotonic() < deadline:
            if list(tmp_path.glob(".incident.json.*.partial")):
                writer.send_signal(signal.SIGKILL)
                caught += 1
                break
            time.sleep(0.0005)
        writer.wait(30)
        assert target.read_bytes() == before or snapshot_file.load(target).locks
        if caught:
            break
    assert caught, "the writer was never caught in the middle of writing"
    assert target.read_bytes() == before  # killed mid-write: the old file, whole
    for partial in tmp_path.glob(".incident.json.*.partial"):
        partial.unlink()  # what a SIGKILL leaves: a hidden partial file, never the target
    saved = subprocess.run(
        [sys.executable, "-m", "lockdiag", "snapshot", "-o", str(target)], env=env,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert len(snapshot_file.load(target).locks) >= 40000
