"""A command that read ends without freeing what its answer was made of (lockdiag.cli.ending):
the process leaves as soon as its output is flushed, with the command's exit code, its output
whole and the same; the usual exit where something may want it (a thread that is no daemon,
an exit code that is a message, standard output that cannot be flushed); and a process that
runs many commands (the tests) keeps one command's readings at most."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockdiag.cli import ending
from lockdiag.core import snapshot_file

from helpers.cli import CLEAN_ENV, lockdiag, run
from helpers.snapshots import generated

# the console script's main() with an atexit handler: it runs only when the process ends the
# usual way (interpreter teardown), never after os._exit
MAIN_WITH_ATEXIT = (
    "import atexit, sys;"
    "atexit.register(lambda: sys.stderr.write('torn down\\n'));"
    "from lockdiag.cli import main;"
    "sys.argv[0] = 'lockdiag';"
    "main()"
)


class Left(Exception):
    """os._exit, as the tests see it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture()
def exits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """os._exit recorded (and turned into an exception) instead of done."""
    codes: list[int] = []

    def record(code: int) -> None:
        codes.append(code)
        raise Left(code)

    monkeypatch.setattr(os, "_exit", record)
    ending.forget()
    yield codes
    ending.forget()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ending") / "locks.json"
    snapshot_file.save(generated(20_000), path)
    return path


def _run_main(*args: str) -> Any:
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", MAIN_WITH_ATEXIT, *args],
        env=CLEAN_ENV, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_dump_leaves_without_teardown_its_output_whole(saved: Path) -> None:
    for fmt in ("json", "plain"):
        child = _run_main("list", "--from", str(saved), "--format", fmt)
        assert child.returncode == 0, child.stderr
        assert "torn down" not in child.stderr  # left at once, nothing freed
        in_process = run("list", "--from", str(saved), "--format", fmt)
        assert child.stdout == in_process.stdout  # every byte flushed before leaving
    # an answer's own exit code, kept: nobody holds the key
    child = _run_main("who-holds", "--from", str(saved), "--key", "9,9,2")
    assert child.returncode == 1 and "torn down" not in child.stderr


def test_commands_that_read_nothing_end_as_usual() -> None:
    child = _run_main("--version")
    assert child.returncode == 0 and "torn down" in child.stderr
    child = _run_main("list", "--from", "/nonexistent/locks.json")  # refused before reading
    assert child.returncode == 2 and "torn down" in child.stderr


def test_the_console_script_as_before(saved: Path) -> None:
    """python -m lockdiag (main() as the console script runs it): output and exit codes."""
    done = lockdiag("list", "--from", str(saved), "--format", "json", env=CLEAN_ENV)
    assert (
        done.returncode == 0
        and done.stdout == run("list", "--from", str(saved), "--format", "json").stdout
    )
    done = lockdiag("who-holds", "--from", str(saved), "--key", "9,9,2", env=CLEAN_ENV)
    assert done.returncode == 1


def test_end_leaves_with_the_exit_code(exits: list[int]) -> None:
    ending.keep([object()])
    with pytest.raises(Left):
        ending.end(SystemExit(None))
    ending.keep([object()])
    with pytest.raises(Left):
        ending.end(SystemExit(3))
    assert exits == [0, 3]


def test_end_as_usual_with_nothing_kept_or_a_message(exits: list[int]) -> None:
    ending.end(SystemExit(0))  # nothing kept: --help, --version, a refusal
    ending.keep([object()])
    ending.end(SystemExit("a message the usual exit prints"))
    assert exits == [] and ending.KEPT == []  # freed now, not at the last collection


def test_end_as_usual_while_a_thread_runs(exits: list[int]) -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=False)
    worker.start()
    try:
        ending.keep([object()])
        ending.end(SystemExit(0))
        assert exits == [] and ending.KEPT == []
    finally:
        release.set()
        worker.join()
    daemon = threading.Thread(target=release.wait, daemon=True)  # the deadline's kind
    release.clear()
    daemon.start()
    try:
        ending.keep([object()])
        with pytest.raises(Left):
            ending.end(SystemExit(0))
    finally:
        release.set()
        daemon.join()


def test_end_as_usual_when_output_cannot_be_flushed(
    exits: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Gone:
        def flush(self) -> None:
            raise BrokenPipeError(32, "the reader went away")

    monkeypatch.setattr(sys, "stdout", Gone())
    ending.keep([object()])
    ending.end(SystemExit(0))
    assert exits == [] and ending.KEPT == []


def test_one_command_kept_at_a_time(saved: Path) -> None:
    """In one process, each command frees the readings the one before it kept."""
    run("list", "--from", str(saved), "--format", "json")
    (first,) = ending.KEPT
    run("list", "--from", str(saved), "--format", "plain")
    assert len(ending.KEPT) == 1 and ending.KEPT[0] is not first
    run("--version")  # a command that reads nothing keeps nothing
    assert ending.KEPT == []
