"""`lockdiag demo` on a real server: it diagnoses, and it leaves nothing behind."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from lockdiag.demo import cluster as cluster_module

from helpers.cli import ctrl_c_reaches_child

PORT = re.compile(r"is up on port (\d+)")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The demo's own temporary directory (its TMPDIR): what it leaves behind is its own, not
    another test run's on the same machine. Under /tmp, reachable by the server's user."""
    directory = Path(tempfile.mkdtemp(prefix="lockdiag-demo-test-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def left_in(scratch: Path) -> list[Path]:
    return sorted(scratch.iterdir())


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lockdiag", "demo", *args]


def test_demo_diagnoses_and_cleans_up(scratch: Path) -> None:
    result = subprocess.run(
        demo_command(), capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    headings = re.findall(r"^\$ lockdiag (.*?)  #", result.stdout, re.MULTILINE)
    assert headings == [  # every option the demo passes, as typed (issue 37)
        "list --session-age 0s",
        "who-holds tenant_summary 74",
        "blockers",
        "check --session-age 0s --wait-age 0s --idle-age 0s --max-blocked 1",
    ]
    assert "Ruby on Rails: migration lock of database shop" in result.stdout
    assert "stuck-owner" in result.stdout
    assert "first diagnosis after" in result.stderr
    match = PORT.search(result.stderr)
    assert match is not None
    assert not port_open(int(match.group(1)))
    assert not left_in(scratch)  # nothing of the demo left behind
    assert "server stopped, workers ended, files removed" in result.stderr


def test_keep_then_stop(tmp_path: Path, scratch: Path) -> None:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TMPDIR": str(scratch)}
    kept = pexpect.spawn(sys.executable, demo_command("--keep")[1:], env=environment, timeout=60)
    kept.expect(r"is up on port (\d+)")
    port = int(kept.match.group(1))
    kept.expect_exact("Ctrl-C here, or lockdiag demo --stop")
    assert port_open(port)
    assert (tmp_path / "lockdiag" / "demo.json").exists()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", (kept.before or b"").decode())  # a pty: bold
    exported = dict(re.findall(r"export (LOCKDIAG_\w+)='?([^'\r\n]+)'?", shown))
    typed_commands = re.findall(r"^\$ lockdiag (.*?)  #", shown, re.MULTILINE)
    assert len(typed_commands) == 4 and len(exported) == 2
    for typed in typed_commands:
        again = subprocess.run(  # the demo's commands, typed: their options exist
            [*demo_command()[:3], *shlex.split(typed)], env={**environment, **exported},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert again.returncode in (0, 1, 2) and not again.stderr, (typed, again.stderr)
        assert "tenant_summary" in again.stdout
    stop = subprocess.run(
        demo_command("--stop"), env=environment, capture_output=True, text=True, check=False
    )
    assert stop.returncode == 0 and "demo stopped" in stop.stdout
    kept.expect(pexpect.EOF)
    kept.close()
    assert not port_open(port)
    assert not left_in(scratch)  # nothing of the demo left behind
    assert not (tmp_path / "lockdiag" / "demo.json").exists()
    again = subprocess.run(
        demo_command("--stop"), env=environment, capture_output=True, text=True, check=False
    )
    assert again.returncode == 2 and "no demo is running" in again.stderr


def test_ctrl_c_cleans_up(tmp_path: Path, scratch: Path) -> None:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TMPDIR": str(scratch)}
    kept = pexpect.spawn(
        sys.executable, demo_command("--keep")[1:], env=environment, timeout=60,
        preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip
    kept.expect(r"is up on port (\d+)")
    port = int(kept.match.group(1))
    kept.expect_exact("Ctrl-C here")
    kept.sendintr()
    kept.expect(pexpect.EOF)
    kept.close()
    assert kept.exitstatus == 0  # Ctrl-C is how a kept demo is meant to end
    assert not port_open(port)
    assert not left_in(scratch)  # nothing of the demo left behind


@pytest.mark.parametrize("after", [0.15, 0.3, 0.45, 0.6])
def test_ctrl_c_while_the_server_is_made_leaves_nothing(scratch: Path, after: float) -> None:
    """Ctrl-C 0.15 to 0.6 s in, while initdb writes the data directory (a 39 MB directory was
    left behind once; then a file written by initdb's postgres after the directory was removed,
    once in CI): the demo's help promises nothing is left, and nothing is."""
    environment = {**os.environ, "TMPDIR": str(scratch)}
    child = pexpect.spawn(
        sys.executable, demo_command()[1:], env=environment, timeout=60,
        preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip
    child.expect_exact("starting a throwaway PostgreSQL")
    time.sleep(after)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus in (0, 130), child.before
    assert not left_in(scratch)


def orphaned_segments(owner: int) -> set[int]:
    """System V shared memory segments of ``owner`` with no process attached (a server process
    killed before it could exit leaves its own behind)."""
    rows = [row.split() for row in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    return {int(row[1]) for row in rows if int(row[7]) == owner and int(row[6]) == 0}


@pytest.mark.parametrize("after", [0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8])
def test_interrupted_initdb_leaves_no_file_and_no_shared_memory(
    scratch: Path, monkeypatch: pytest.MonkeyPatch, after: float
) -> None:
    """An interruption while initdb runs (its bootstrap postgres, then its single-user one)
    ends every process it started before the directory is removed, and removes the shared
    memory segment the bootstrap postgres, which does not catch SIGTERM, leaves behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    user = cluster_module.server_user()
    owner = os.getuid() if user is None else pwd.getpwnam(user).pw_uid
    before = orphaned_segments(owner)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    made: cluster_module.Cluster | None = None
    try:
        signal.setitimer(signal.ITIMER_REAL, after)
        with pytest.raises(KeyboardInterrupt):
            made = cluster_module.create_cluster(start=False)
            time.sleep(60)  # initdb finished first: the interruption comes here instead
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if made is not None:
            made.destroy()
    assert not left_in(scratch)
    assert orphaned_segments(owner) <= before


def test_offline_reads_the_bundled_incident_without_a_server(tmp_path: Path) -> None:
    """`demo --offline` needs no server and no checkout: the incident and its registry are
    package data, walked through as the README does, with the paths to try more."""
    result = subprocess.run(
        demo_command("--offline"), capture_output=True, text=True, cwd=tmp_path, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PG", "LOCKDIAG_"))},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tenant_summary 73 (4102, 73, 2) is held by pid 4163 (billing-worker)" in out
    assert "root blocker 1: tenant_summary 73" in out
    assert out.count("CRITICAL session-lock: tenant_summary 73") == 1
    tried = [line.strip() for line in out.splitlines() if line.strip().startswith("lockdiag list")]
    assert len(tried) == 1
    again = subprocess.run(
        [sys.executable, "-m", "lockdiag", *shlex.split(tried[0])[1:]],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and "tenant_summary 73" in again.stdout, again.stderr
