"""The settings file, through the real CLI: each level of the precedence (command line >
environment > file > built-in default), a named target on a real server, every kind of bad
file with its exact one-line error, and settings init|show."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from lockdiag.demo.cluster import Cluster

from helpers.cli import run
from helpers.servers import Sessions

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INCIDENT = str(EXAMPLES / "incident.json")
BUNDLED_REGISTRY = str(EXAMPLES / "lockdiag.toml")
HINT = (
    "lockdiag: hint: fix it (lockdiag settings show checks it), or run without it: "
    "LOCKDIAG_SETTINGS= lockdiag ..."
)


@pytest.fixture
def settings_file(tmp_path: Path) -> Path:
    """Where the CLI looks: conftest points XDG_CONFIG_HOME at tmp_path/config."""
    path = tmp_path / "config" / "lockdiag" / "settings.toml"
    path.parent.mkdir(parents=True)
    return path


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def flagged(result: Result) -> set[str]:
    """The flags of every lock `list --format json` printed."""
    assert result.exit_code == 0, result.stderr
    return {flag for lock in json.loads(result.stdout)["locks"] for flag in lock["flags"]}


# -- precedence: command line > environment > settings file > built-in default -----------------


def test_without_a_file_the_built_in_defaults_apply() -> None:
    result = run("list", "--from", INCIDENT, "--format", "json")
    assert "long-session-lock" in flagged(result)  # 17m idle holders, --session-age 5m
    assert run("list", "--from", INCIDENT).stdout.lstrip()[:1] != "{"  # auto: plain when piped
    assert result.stderr == ""


def test_the_file_overrides_a_built_in_default(settings_file: Path) -> None:
    write(settings_file, '[defaults]\nformat = "json"\n[list]\nsession-age = "1h"\n')
    result = run("list", "--from", INCIDENT)
    assert "long-session-lock" not in flagged(result)  # json by the file; nothing held 1h
    assert result.stderr == ""


def test_the_command_line_overrides_the_file(settings_file: Path) -> None:
    write(settings_file, '[list]\nsession-age = "1h"\nformat = "json"\n')
    assert "long-session-lock" in flagged(run("list", "--from", INCIDENT, "--session-age", "5m"))
    assert not run("list", "--from", INCIDENT, "--format", "plain").stdout.startswith("{")


def test_a_command_table_overrides_the_defaults_table(settings_file: Path) -> None:
    write(settings_file, '[defaults]\nformat = "plain"\n[list]\nformat = "json"\n')
    assert json.loads(run("list", "--from", INCIDENT).stdout)["total"] == 11


def test_the_file_shows_in_help_as_the_default(settings_file: Path) -> None:
    write(settings_file, '[check]\nwait-age = "10s,1m"\n')
    help_text = " ".join(run("check", "--help").stdout.split())
    assert "A session waiting for a lock this long. [default: 10s,1m]" in help_text


def test_the_environment_overrides_the_file_and_the_command_line_the_environment(
    settings_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(settings_file, '[defaults]\nregistry = "/from-the-file.toml"\n')
    file_only = run("list", "--from", INCIDENT)
    assert file_only.stderr.splitlines()[0] == (
        "lockdiag: warning: registry not used: /from-the-file.toml: no such file "
        "(from the settings file)"
    )
    monkeypatch.setenv("LOCKDIAG_REGISTRY", "/from-the-environment.toml")
    environment = run("list", "--from", INCIDENT)
    assert environment.stderr.splitlines()[0] == (
        "lockdiag: warning: registry not used: /from-the-environment.toml: no such file "
        "(from LOCKDIAG_REGISTRY)"
    )
    command_line = run("list", "--from", INCIDENT, "--registry", BUNDLED_REGISTRY)
    assert command_line.exit_code == 0 and command_line.stderr == ""


def test_a_registry_in_the_file_is_used(settings_file: Path) -> None:
    write(settings_file, f'[defaults]\nregistry = "{BUNDLED_REGISTRY}"\nformat = "json"\n')
    locks = json.loads(run("list", "--from", INCIDENT).stdout)["locks"]
    assert "tenant_summary" in {lock["namespace"] for lock in locks}


def test_an_empty_lockdiag_settings_runs_without_the_file(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(settings_file, "this is not toml\n")
    monkeypatch.setenv("LOCKDIAG_SETTINGS", "")
    assert run("list", "--from", INCIDENT).exit_code == 0


def test_lockdiag_settings_names_another_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = write(tmp_path / "team.toml", '[list]\nformat = "json"\n')
    monkeypatch.setenv("LOCKDIAG_SETTINGS", str(other))
    assert json.loads(run("list", "--from", INCIDENT).stdout)["total"] == 11


# -- a named target, on a real server ----------------------------------------------------------


@pytest.fixture
def held(sessions: Sessions) -> int:
    """A session holding advisory lock (4102, 991); its pid."""
    worker = sessions.open("holder")
    pid: int = worker.connection.execute(
        "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(4102, 991)) AS taken"
    ).fetchone()[0]  # type: ignore[index]
    return pid


def holders(result: Result) -> set[int]:
    assert result.exit_code == 0, result.stderr
    locks = json.loads(result.stdout)["locks"]
    return {lock["pid"] for lock in locks if lock["key"] == [4102, 991] and lock["granted"]}


def test_a_named_target_on_the_command_line_reads_that_server(
    settings_file: Path, cluster: Cluster, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(settings_file, f'[targets.test]\ndsn = "{cluster.dsn()}"\ndescription = "the suite"\n')
    monkeypatch.setenv("LOCKDIAG_DSN", "host=127.0.0.1 port=1 connect_timeout=1")
    assert holders(run("list", "--target", "test", "--format", "json")) == {held}


def test_a_default_target_gives_way_to_lockdiag_dsn(
    settings_file: Path, cluster: Cluster, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(settings_file, f'[defaults]\ntarget = "test"\n[targets.test]\ndsn = "{cluster.dsn()}"\n')
    assert holders(run("list", "--format", "json")) == {held}  # the file's target
    monkeypatch.setenv("LOCKDIAG_DSN", "host=127.0.0.1 port=1 connect_timeout=1")
    assert run("list", "--format", "json").exit_code == 3  # the environment's: unreachable
    assert holders(run("list", "--dsn", cluster.dsn(), "--format", "json")) == {held}


def test_a_default_target_gives_way_to_from_file(settings_file: Path) -> None:
    write(settings_file, '[defaults]\ntarget = "test"\n[targets.test]\ndsn = "port=1"\n')
    assert run("list", "--from", INCIDENT).exit_code == 0


def test_an_unknown_target_on_the_command_line(settings_file: Path) -> None:
    write(settings_file, '[targets.prod]\ndsn = "service=prod"\n')
    result = run("list", "--target", "prd")
    assert result.exit_code == 2
    assert result.stderr == (
        f"lockdiag: error: no target 'prd' in settings file {settings_file}; did you mean prod?\n"
    )


def test_target_names_complete_from_the_settings_file(settings_file: Path) -> None:
    write(
        settings_file,
        '[targets.prod]\ndsn = "service=prod"\n[targets.staging]\ndsn = "service=staging"\n'
        '[targets.perf]\ndsn = "service=perf"\n',
    )
    environment = {
        **os.environ,
        "_LOCKDIAG_COMPLETE": "bash_complete",
        "COMP_WORDS": "lockdiag list --target p",
        "COMP_CWORD": "3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag"], env=environment, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.stdout.split() == ["plain,perf", "plain,prod"]


def test_a_password_in_a_file_others_can_read_warns_once(settings_file: Path) -> None:
    text = '[targets.prod]\ndsn = "postgresql://monitor:hunter2@db1/app"\n'
    write(settings_file, text, mode=0o644)
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        f"lockdiag: warning: settings file {settings_file} is readable by others and holds "
        "a password (target prod): chmod 600 it, or use ~/.pgpass"
    ]
    write(settings_file, text, mode=0o600)
    assert run("list", "--from", INCIDENT).stderr == ""


# -- bad input: one line with the file and line, exit 2 (check: UNKNOWN, 3) --------------------


BAD = [
    ('[list]\nsession-age = "5m"\nformat = [\n', 3, "invalid value (unfinished)"),
    (
        "[list]\nsession-age = 5m\n",
        2,
        "expected newline or end of document after a statement (column 16)",
    ),
    ("[list\n", 1, "expected ']' at the end of a table declaration (column 6)"),
    (
        'format = "json"\n',
        1,
        "format is outside any table: settings go under [defaults] or a command's, e.g. [list]",
    ),
    ('[lsit]\nformat = "json"\n', 1, "unknown table [lsit]; did you mean list?"),
    (
        '[list]\n\nsesion-age = "1h"\n',
        3,
        "list has no option --sesion-age; did you mean session-age?",
    ),
    ("[list]\npid = 7\n", 2, "--pid is not a setting (give it each time)"),
    (
        '[list]\ndsn = "service=prod"\n',
        2,
        "--dsn is not a setting (a server is named under [targets])",
    ),
    (
        '[defaults]\ninterval = "1s"\n',
        2,
        "unknown setting 'interval'; [defaults] sets target, timeout, registry, format "
        "(others go in a command's table)",
    ),
    ("[list]\nsession-age = true\n", 2, "session-age = true: give a string"),
    (
        '[list]\nsession-age = "soon"\n',
        2,
        "session-age = \"soon\": 'soon' is not a duration (examples: 250ms, 90s, 5m, 1h30m, 2d)",
    ),
    (
        '[list]\nformat = "nagios"\n',
        2,
        "format = \"nagios\": 'nagios' is not one of 'auto', 'table', 'plain', 'json', "
        "'markdown', 'csv'.",
    ),
    (
        '[defaults]\ntarget = "prd"\n[targets.prod]\ndsn = "service=prod"\n',
        2,
        'target = "prd": no [targets.prd]; did you mean prod?',
    ),
    (
        '[targets.prod]\ndns = "service=prod"\n',
        2,
        "target prod: unknown key 'dns'; did you mean dsn?",
    ),
    ('[targets.prod]\ndescription = "x"\n', 1, 'target prod has no dsn = "..."'),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_a_bad_settings_file_stops_with_one_line(
    settings_file: Path, text: str, line: int, message: str
) -> None:
    write(settings_file, text)
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 2
    first, *rest = result.stderr.splitlines()
    assert first == f"lockdiag: error: settings file {settings_file} line {line}: {message}"
    assert rest == [HINT]
    assert result.stdout == ""


def test_a_bad_value_stops_check_as_unknown(settings_file: Path) -> None:
    write(settings_file, '[check]\nwait-age = "1m,10s"\n')
    result = run("check", "--from", INCIDENT)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        f'lockdiag: error: settings file {settings_file} line 2: wait-age = "1m,10s": the '
        "critical level is below the warning level",
        HINT,
    ]


def test_a_settings_file_too_large_or_missing(
    settings_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(settings_file, "#" * (256 * 1024 + 1))
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"lockdiag: error: settings file {settings_file}: larger than 256 KiB: not a settings file"
    )
    monkeypatch.setenv("LOCKDIAG_SETTINGS", str(tmp_path / "nope.toml"))
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"lockdiag: error: settings file {tmp_path / 'nope.toml'}: cannot read: "
        "No such file or directory"
    )


def test_no_traceback_through_the_real_entry_point(settings_file: Path) -> None:
    write(settings_file, "[list]\nformat = 7\n")
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag", "list", "--from", INCIDENT],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"lockdiag: error: settings file {settings_file} line 2: format = 7: '7' is not one of "
        "'auto', 'table', 'plain', 'json', 'markdown', 'csv'.",
        HINT,
    ]


def test_settings_show_checks_every_table(settings_file: Path) -> None:
    """A command reads only its own table; show reads them all."""
    write(settings_file, '[sample]\nduratoin = "1m"\n')
    assert run("list", "--from", INCIDENT).exit_code == 0
    result = run("settings", "show")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"lockdiag: error: settings file {settings_file} line 2: sample has no option "
        "--duratoin; did you mean duration?"
    ]


# -- settings init | show ------------------------------------------------------------------------


def test_init_writes_a_commented_template_and_never_overwrites(settings_file: Path) -> None:
    settings_file.parent.rmdir()
    result = run("settings", "init")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"lockdiag: wrote {settings_file}\n"
    assert stat.S_IMODE(settings_file.stat().st_mode) == 0o600
    text = settings_file.read_text()
    assert "LOCKDIAG_SETTINGS= lockdiag" in text
    assert '# session-age = "5m,1h"' in text and '# max-blocked = "5,20"' in text
    assert not [line for line in text.splitlines() if re.match(r"^\w[\w-]* *=", line)]
    again = run("settings", "init")
    assert again.exit_code == 2
    assert (
        again.stderr == f"lockdiag: error: settings file {settings_file} exists: not overwritten\n"
    )
    assert settings_file.read_text() == text


def test_every_table_can_be_added_after_init(settings_file: Path) -> None:
    """The template's tables are commented out too: a user adds any of them below (issue 37:
    an added [list] made every command exit 2, "cannot declare ('list',) twice")."""
    assert run("settings", "init").exit_code == 0
    text = settings_file.read_text()
    tables = re.findall(r"^# \[([\w.]+)\]$", text, re.MULTILINE)
    assert {"defaults", "list", "check", "watch"} <= set(tables)
    assert not re.findall(r"^\[", text, re.MULTILINE)
    added = "".join(f"\n[{table}]\n" for table in tables)
    settings_file.write_text(text + added.replace("[list]\n", '[list]\nsession-age = "1m"\n'))
    result = run("list", "--from", INCIDENT, "--format", "json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(run("settings", "show", "--format", "json").stdout)["settings"]
    rows = {(row["command"], row["option"]): row["value"] for row in shown}
    assert rows[("list", "session-age")] == "1m"


def test_a_table_declared_twice_names_both_lines(settings_file: Path) -> None:
    write(settings_file, '[list]\nsession-age = "1m"\n\n[check]\n\n[list]\nwaiting = true\n')
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"lockdiag: error: settings file {settings_file} line 6: table [list] declared again "
        "(first at line 1): a table may appear once; put its settings under the first"
    )
    assert "('list',)" not in result.stderr


EXAMPLES_ONLY = {"target", "registry"}  # no built-in default: the template shows an example


def test_the_template_uncommented_changes_nothing(settings_file: Path) -> None:
    """Every setting that has a default, uncommented, is valid and gives that default."""
    assert run("settings", "init").exit_code == 0
    before = json.loads(run("settings", "show", "--format", "json").stdout)["settings"]
    lines = settings_file.read_text().splitlines()
    setting = re.compile(r'^# ([\w-]+) = ("[^"]+"|true|false)$')
    uncommented = [
        line[2:]
        if ((found := setting.match(line)) and found[1] not in EXAMPLES_ONLY)
        or re.match(r"^# \[[\w.]+\]$", line)
        else line
        for line in lines
    ]
    assert len([line for line in uncommented if line not in lines]) > 15
    settings_file.write_text("\n".join(uncommented) + "\n")
    after = json.loads(run("settings", "show", "--format", "json").stdout)["settings"]
    assert [(row["command"], row["option"], row["value"]) for row in after] == [
        (row["command"], row["option"], row["value"]) for row in before
    ]
    assert {row["from"].split(" line")[0] for row in after} >= {"settings file"}


def test_show_says_where_each_setting_comes_from(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        settings_file,
        '[defaults]\ntimeout = "2s"\n[check]\nwait-age = "10s,1m"\n'
        '[targets.prod]\ndsn = "postgresql://monitor:hunter2@db1/app"\n',
    )
    monkeypatch.setenv("LOCKDIAG_REGISTRY", BUNDLED_REGISTRY)
    result = run("settings", "show", "--format", "json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    rows = {
        (row["command"], row["option"]): (row["value"], row["from"]) for row in shown["settings"]
    }
    assert rows[("check", "wait-age")] == ("10s,1m", "settings file line 4 [check]")
    assert rows[("check", "timeout")] == ("2s", "settings file line 2 [defaults]")
    assert rows[("check", "registry")] == (BUNDLED_REGISTRY, "environment (LOCKDIAG_REGISTRY)")
    assert rows[("check", "session-age")] == ("5m,1h", "default")
    assert rows[("list", "session-age")] == ("5m", "default")
    assert shown["targets"] == [
        {"name": "prod", "dsn": "postgresql://monitor:***@db1/app", "description": ""}
    ]
    assert "hunter2" not in result.stdout


def test_the_root_help_and_version_never_read_the_file(settings_file: Path) -> None:
    write(settings_file, "not toml at all\n")
    assert run("--help").exit_code == 0
    assert run("--version").exit_code == 0


def test_a_target_without_a_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run("list", "--target", "prod")
    assert result.exit_code == 2
    path = tmp_path / "config" / "lockdiag" / "settings.toml"
    assert result.stderr == f"lockdiag: error: no target 'prod': there is no settings file {path}\n"
    monkeypatch.setenv("LOCKDIAG_SETTINGS", "")
    assert run("list", "--target", "prod").stderr == (
        "lockdiag: error: no target 'prod': LOCKDIAG_SETTINGS is empty, no settings file is read\n"
    )


def test_settings_show_names_the_registry_file_found(tmp_path: Path) -> None:
    """With no registry named, `settings show` says which file every command would find (the
    working directory's, then the config directory's), or where it looked."""

    def registry_row() -> dict[str, str]:
        shown = json.loads(run("settings", "show", "--format", "json").stdout)["settings"]
        rows: dict[str, str] = next(
            row for row in shown if (row["command"], row["option"]) == ("list", "registry")
        )
        return rows

    none = registry_row()
    assert none["value"] == "" and none["from"].startswith("default (none found: ")
    assert str(tmp_path / "lockdiag.toml") in none["from"]
    (tmp_path / "lockdiag.toml").write_text("[namespaces.t]\nid = 1\n")  # the working directory
    found = registry_row()
    assert found == {
        "command": "list",
        "option": "registry",
        "value": str(tmp_path / "lockdiag.toml"),
        "from": "default (found in the working directory)",
    }
    missing = run("who-holds", "nope", "1")  # a namespace of a file not found: how to give one
    assert "unknown namespace 'nope' in " in missing.stderr
    (tmp_path / "lockdiag.toml").unlink()
    missing = run("who-holds", "nope", "1")
    assert missing.exit_code == 2
    assert missing.stderr.splitlines() == [
        "lockdiag: error: unknown namespace 'nope' (no registry file found)",
        "lockdiag: hint: name the registry file with --registry FILE or LOCKDIAG_REGISTRY, or put "
        "it in the working directory as lockdiag.toml",
    ]
