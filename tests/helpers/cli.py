"""lockdiag as the tests run it: in this process through click's runner (``run``), or as a
process of its own (``lockdiag``) where a hang, a signal, a limit or a fresh interpreter
matters; and what the tests read in its answers (its JSON, its one-line refusals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster

# a child's environment with none of the developer's lockdiag or libpq settings, and no
# COLUMNS/LINES (rich sizes its screen from them before the terminal's own size)
CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("COLUMNS", "LINES")
    and (not k.startswith(("LOCKDIAG_", "PG")) or k == "LOCKDIAG_PG_BIN")
}


def run(
    *args: str,
    env: Mapping[str, str] | None = None,
    catch_exceptions: bool = False,
    input: bytes | str | None = None,
) -> Result:
    """``lockdiag ARGS`` in this process (click's CliRunner, the program named ``lockdiag``),
    stdout and stderr kept apart. ``env``: variables set for the run over this process's;
    ``input``: its standard input. An
    exception the command does not handle fails the test with its traceback, never an exit
    code 1 a test could take for an answer; ``catch_exceptions=True`` keeps it in the result
    (``result.exception``) for a test that looks at it."""
    return CliRunner().invoke(
        cli, list(args), input=input, env=env, catch_exceptions=catch_exceptions,
        prog_name="lockdiag",
    )  # fmt: skip


def run_on(cluster: Cluster, command: str, *args: str) -> Result:
    """``lockdiag COMMAND --dsn CLUSTER ARGS``: ``run`` against a test server."""
    return run(command, "--dsn", cluster.dsn(), *args)


def run_without_traceback(*args: str) -> Result:
    """``run(ARGS)``, checked to have ended without a traceback (an error is one line)."""
    result = run(*args)
    no_traceback(result)
    return result


def no_traceback(result: Result) -> None:
    """The command ended without an exception of its own (click's exit aside) and printed no
    traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr


def refused(result: Result, name: str, reason: str, code: int = 2) -> None:
    """Exit 2 (``check``: 3, UNKNOWN), one line ``lockdiag: error: NAME...REASON`` on stderr,
    no traceback."""
    no_traceback(result)
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"lockdiag: error: {name}"), lines[0]
    assert reason in lines[0], lines[0]


def list_json(
    cluster: Cluster, *args: str, dbname: str = "postgres", user: str = "postgres"
) -> dict[str, Any]:
    """The document of ``lockdiag list --dsn CLUSTER --format json ARGS`` (connected to
    ``dbname`` as ``user``), which must exit 0."""
    result = run("list", "--dsn", cluster.dsn(dbname=dbname, user=user), "--format", "json", *args)
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def step_of(document: dict[str, Any], pid: int, kind: str = "session-lock") -> str:
    """The next step check's JSON ``document`` gives for the finding ``kind`` about ``pid``
    (the first, which must be there)."""
    found = [f for f in document["findings"] if f["pid"] == pid and f["kind"] == kind]
    assert found, json.dumps(document["findings"], indent=1)
    step: str = found[0]["next_step"]
    return step


def lockdiag(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120, **options: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m lockdiag ARGS`` as a process of its own, its output captured as text.
    ``env``: its whole environment (this process's if None); ``options``: more of
    ``subprocess.run``'s (stdin, preexec_fn, cwd). Still running after ``timeout`` seconds:
    the test fails, naming the command."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "lockdiag", *args], env=env, capture_output=True, text=True,
            timeout=timeout, check=False, **options,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"lockdiag {' '.join(args)} hung for {timeout:g}s")


def output(*args: str, codes: tuple[int, ...] = (0,), env: Mapping[str, str] = CLEAN_ENV) -> str:
    """The stdout of ``lockdiag ARGS`` as a process (``env``: none of the developer's
    settings), which must exit with one of ``codes``."""
    result = lockdiag(*args, env=env)
    assert result.returncode in codes, f"{args}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


def ctrl_c_reaches_child() -> None:
    """preexec_fn for a child that gets Ctrl-C: a suite started in the background (cmd &)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
