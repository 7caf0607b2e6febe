"""Forgiving usage errors (issue 37): the psql habit of options before the command works, a
mistyped command gets a "did you mean", and each mistake a newcomer made gets one error line,
a hint where one helps, exit 2 (check: 3, UNKNOWN) and no change anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from lockdiag.core import snapshot_file
from lockdiag.demo.cluster import Cluster

from helpers.cli import run
from helpers.servers import Sessions

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INCIDENT = str(EXAMPLES / "incident.json")
REGISTRY = str(EXAMPLES / "lockdiag.toml")


def refused(result: Result, code: int = 2) -> list[str]:
    """The stderr lines of a refusal: the exit code, nothing on stdout, no traceback."""
    assert result.exit_code == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("lockdiag: error: ")
    return lines


# -- the common options before the command ----------------------------------------------------


def test_dsn_before_the_command_reads_the_server(cluster: Cluster, sessions: Sessions) -> None:
    """`lockdiag --dsn URI list`, the psql and pgcli habit, is `lockdiag list --dsn URI`."""
    holder = sessions.open("usage-holder")
    holder.run("SELECT pg_advisory_lock(4102, 73)")
    before = run("--dsn", cluster.dsn(), "--registry", REGISTRY, "list", "--format", "json")
    after = run("list", "--format", "json", "--dsn", cluster.dsn(), "--registry", REGISTRY)
    assert before.exit_code == after.exit_code == 0, before.stderr
    held = [(lock["pid"], lock["namespace"]) for lock in json.loads(before.stdout)["locks"]]
    assert held == [(lock["pid"], lock["namespace"]) for lock in json.loads(after.stdout)["locks"]]
    assert (holder.pid, "tenant_summary") in held


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            ["--from", INCIDENT, "--registry", REGISTRY, "who-holds", "tenant_summary", "73"],
            ["who-holds", "--from", INCIDENT, "--registry", REGISTRY, "tenant_summary", "73"],
        ),
        (
            [f"--from={INCIDENT}", "--format=json", "--registry", REGISTRY, "blockers"],
            ["blockers", "--registry", REGISTRY, "--format=json", f"--from={INCIDENT}"],
        ),
        (
            ["--registry", REGISTRY, "--format", "json", "key", "tenant_period", "73", "2026-11"],
            ["key", "tenant_period", "73", "2026-11", "--registry", REGISTRY, "--format", "json"],
        ),
        (
            ["--format", "json", "--registry", REGISTRY, "registry", "show"],
            ["registry", "show", "--format", "json", "--registry", REGISTRY],
        ),
        (
            ["--timeout", "2s", "--from", INCIDENT, "list", "--waiting"],
            ["list", "--waiting", "--timeout", "2s", "--from", INCIDENT],
        ),
    ],
)
def test_common_options_before_the_command(before: list[str], after: list[str]) -> None:
    """The same output, exit code and stderr as with the options after the command."""
    typed, documented = run(*before), run(*after)
    assert typed.exit_code == documented.exit_code == 0, typed.stderr
    assert (typed.stdout, typed.stderr) == (documented.stdout, documented.stderr)
    assert typed.stdout


def test_check_keeps_unknown_for_a_usage_error_before_it() -> None:
    result = run("--format=xml", "--from", INCIDENT, "check")
    assert result.exit_code == 3
    assert result.stderr.startswith("lockdiag: error: Invalid value for '--format'")
    assert run("--format", "nagios", "--from", INCIDENT, "check").stdout.startswith(
        "LOCKDIAG CRITICAL"
    )


def test_an_option_the_command_does_not_take(tmp_path: Path) -> None:
    """Said in one line naming the command; nothing is written."""
    assert refused(run("--dsn", "service=x", "key", "tenant_summary", "73")) == [
        "lockdiag: error: lockdiag key has no --dsn option"
    ]
    out = tmp_path / "out.json"
    assert refused(run("--format", "json", "snapshot", "-o", str(out))) == [
        "lockdiag: error: lockdiag snapshot has no --format option"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--dsn", "service=x"], "--dsn goes after the command: lockdiag COMMAND --dsn ..."),
        (
            ["--registry", REGISTRY, "registry"],
            "--registry goes after the command: lockdiag registry COMMAND --registry ...",
        ),
    ],
)
def test_an_option_before_no_command_names_the_order(args: list[str], line: str) -> None:
    assert refused(run(*args)) == [f"lockdiag: error: {line}"]


def test_help_and_the_settings_file_with_options_before(tmp_path: Path) -> None:
    assert run("--dsn", "service=x", "list", "--help").stdout.startswith("Usage: lockdiag list")
    assert run("--dsn", "service=x", "--help").stdout.startswith("Usage: lockdiag [OPTIONS]")
    settings = tmp_path / "config" / "lockdiag" / "settings.toml"  # conftest's XDG_CONFIG_HOME
    settings.parent.mkdir(parents=True)
    settings.write_text('[list]\nformat = "json"\n')
    assert run("--from", INCIDENT, "list").stdout.startswith("{")  # the file's format
    assert not run("--format", "plain", "--from", INCIDENT, "list").stdout.startswith("{")


def completions(words: str) -> list[str]:
    environment = {
        **os.environ,
        "_LOCKDIAG_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag"], env=environment, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_completion_with_options_before_the_command() -> None:
    assert completions("lockdiag --dsn service=x li") == ["plain,list"]
    assert completions(f"lockdiag --registry {REGISTRY} who-holds tenant_s") == [
        "plain,tenant_summary"
    ]
    assert completions(f"lockdiag --registry {REGISTRY} registry s") == ["plain,show"]


# -- did you mean; underscores ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["lsit"], "No such command 'lsit'. Did you mean 'list'?"),
        (["whoholds"], "No such command 'whoholds'. Did you mean 'who-holds'?"),
        (["--dsn", "service=x", "lsit"], "No such command 'lsit'. Did you mean 'list'?"),
        (["registry", "chek"], "No such command 'chek'. Did you mean 'check'?"),
    ],
)
def test_a_mistyped_command_gets_did_you_mean(args: list[str], line: str) -> None:
    assert refused(run(*args)) == [f"lockdiag: error: {line}"]


def test_underscores_name_the_command() -> None:
    args = ["tenant_summary", "73", "--from", INCIDENT, "--registry", REGISTRY]
    typed, named = run("who_holds", *args), run("who-holds", *args)
    assert typed.exit_code == named.exit_code == 0, typed.stderr
    assert (typed.stdout, typed.stderr) == (named.stdout, named.stderr)
    assert run("who_holds", "--help").stdout.startswith("Usage: lockdiag who-holds")


# -- decode given a name; a recording given to --from; a shell lockdiag cannot complete --------


def test_decode_given_a_namespace_points_to_key() -> None:
    assert refused(run("decode", "tenant_summary", "73", "--registry", REGISTRY)) == [
        "lockdiag: error: decode turns numbers into a name, and 'tenant_summary' is not a number",
        "lockdiag: hint: the numbers of a name: lockdiag key tenant_summary 73",
    ]
    assert refused(run("decode", "billing", "7")) == [
        "lockdiag: error: decode turns numbers into a name, and 'billing' is not a number",
        "lockdiag: hint: the numbers of a name: lockdiag key NAMESPACE RESOURCE",
    ]
    assert refused(run("decode", "4102", "x")) == ["lockdiag: error: 'x' is not an integer"]


def test_a_recording_given_to_from_points_to_watch(tmp_path: Path) -> None:
    line = snapshot_file.record_line(snapshot_file.load(Path(INCIDENT)))
    recording = tmp_path / "rec.jsonl"
    recording.write_text(f"{line}\n{line}\n")
    expected = [
        f"lockdiag: error: {recording} is a recording (watch --record: a snapshot a line), "
        "not a snapshot file",
        f"lockdiag: hint: replay it with: lockdiag watch --from {recording}",
    ]
    assert refused(run("list", "--from", str(recording))) == expected
    assert refused(run("who-holds", "--key", "4102,73", "--from", str(recording))) == expected
    assert run("watch", "--from", str(recording), "--once").exit_code == 0  # as the hint says
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"a": 1}\n{"b": 2}\n')  # two JSON lines, no recording: the JSON error
    assert refused(run("list", "--from", str(broken))) == [
        f"lockdiag: error: {broken}:2: not a snapshot file: invalid JSON (Extra data)"
    ]


@pytest.mark.parametrize(
    ("shell", "line"),
    [
        (
            "powershell",
            "no completion for 'powershell': the shells are bash, zsh and fish "
            "(PowerShell is not supported: click generates no script for it)",
        ),
        ("tcsh", "no completion for 'tcsh': the shells are bash, zsh and fish"),
    ],
)
def test_completion_names_the_shells(shell: str, line: str) -> None:
    assert refused(run("completion", shell)) == [f"lockdiag: error: {line}"]


def test_completion_of_the_shell_argument() -> None:
    assert refused(run("completion")) == ["lockdiag: error: Missing argument '{bash|zsh|fish}'."]
    assert completions("lockdiag completion ") == ["plain,bash", "plain,zsh", "plain,fish"]
    assert run("completion", "fish").stdout.startswith("function _lockdiag_completion")


def test_options_before_the_command_from_the_real_entry_point(cluster: Cluster) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "lockdiag", "--dsn", cluster.dsn(), "list", "--format", "json"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["server"]["version_num"] >= 140000
