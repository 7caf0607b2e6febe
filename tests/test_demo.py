"""`lockdiag demo` on a real server: it diagnoses, and it leaves nothing behind."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from conftest import ctrl_c_reaches_child

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


@pytest.mark.parametrize("after", [0.3, 0.45, 0.6])
def test_ctrl_c_while_the_server_is_made_leaves_nothing(scratch: Path, after: float) -> None:
    """Ctrl-C 0.3 to 0.6 s in, while initdb writes the data directory (a 39 MB directory was
    left behind once): the demo's help promises nothing is left, and nothing is."""
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
