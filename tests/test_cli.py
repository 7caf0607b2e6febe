"""The CLI end to end: real server, real sessions, CliRunner and a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, free_port

from helpers.cli import run
from helpers.registry import write_registry
from helpers.servers import PASSWORD, Sessions

REGISTRY = """\
[namespaces.tenant_summary]
id = 4102
form = "pair"
description = "Rebuild one tenant's summary"
expect = "xact"
max_hold = "5m"

[namespaces.invoice_export]
id = 7
form = "bigint"
"""


@pytest.fixture
def registry_file(tmp_path: Path) -> Path:
    return write_registry(tmp_path, REGISTRY)  # the current directory of every test


def as_json(result: Result) -> Any:
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_list_json_field_by_field(
    cluster: Cluster, sessions: Sessions, registry_file: Path
) -> None:
    idle = sessions.open("billing-worker")
    idle.run("SELECT pg_advisory_lock(4102, 73), pg_advisory_lock(-55037190)")
    waiter = sessions.open("summary-worker")
    waiter.start("SELECT pg_advisory_lock(4102, 73)")
    sessions.waiting(waiter)

    document = as_json(
        run("list", "--dsn", cluster.dsn(), "--format", "json", "--session-age", "0s")
    )
    assert document["version"] == 1
    assert document["server"]["read_all_stats"] is True
    assert document["total"] == 3
    by_pid = {(lock["pid"], lock["namespace"], lock["granted"]): lock for lock in document["locks"]}
    held = by_pid[(idle.pid, "tenant_summary", True)]
    assert {k: held[k] for k in (
        "mode", "locktype", "resource", "classid", "objid", "objsubid", "lifetime", "form", "key",
        "application_name", "state", "database", "blocks", "waits_for",
    )} == {
        "mode": "ExclusiveLock", "locktype": "advisory", "resource": 73, "classid": 4102,
        "objid": 73, "objsubid": 2, "lifetime": "session", "form": "pair", "key": [4102, 73],
        "application_name": "billing-worker", "state": "idle", "database": "postgres",
        "blocks": [waiter.pid], "waits_for": [],
    }  # fmt: skip
    assert held["flags"] == ["long-session-lock", "expect-xact"]
    assert held["held_at_least_seconds"] >= 0
    unregistered = by_pid[(idle.pid, None, True)]
    assert (unregistered["classid"], unregistered["objid"], unregistered["objsubid"]) == (
        4294967295,
        4239930106,
        1,
    )
    assert unregistered["key"] == [-55037190]
    assert unregistered["flags"] == ["long-session-lock", "unregistered"]
    waiting = by_pid[(waiter.pid, "tenant_summary", False)]
    assert waiting["lifetime"] is None
    assert waiting["waits_for"] == [idle.pid]
    assert waiting["waited_seconds"] >= 0
    assert waiting["application_name"] == "summary-worker"


def test_list_plain_and_filters(cluster: Cluster, sessions: Sessions, registry_file: Path) -> None:
    sessions.open("billing-worker").run(
        "SELECT pg_advisory_lock(4102, 1), pg_advisory_lock(7::bigint << 32 | 5)"
    )
    sessions.open("other").run("SELECT pg_advisory_lock(4102, 2)")
    result = run("list", "--dsn", cluster.dsn())
    assert result.exit_code == 0
    header, *rows, summary = result.stdout.splitlines()[:5]
    assert header.split()[:3] == ["LOCK", "MODE", "STATUS"]
    assert [row.split()[0:2] for row in rows] == [
        ["invoice_export", "5"],
        ["tenant_summary", "1"],
        ["tenant_summary", "2"],
    ]
    assert summary.startswith("3 lock(s), 0 waiting")
    only = run(
        "list", "--dsn", cluster.dsn(), "--app", "billing-*", "--namespace", "tenant_summary"
    )
    assert [line.split()[:2] for line in only.stdout.splitlines()[1:2]] == [["tenant_summary", "1"]]
    assert only.stdout.splitlines()[2].startswith("1 of 3 lock(s)")
    nothing = run("list", "--dsn", cluster.dsn(), "--waiting").stdout
    assert nothing.startswith("none of the 3 advisory lock(s) matches the filters")


def test_who_holds_exit_codes_and_json(
    cluster: Cluster, sessions: Sessions, registry_file: Path
) -> None:
    holder = sessions.open("billing-worker")
    holder.run("SELECT pg_advisory_lock(4102, 73)")
    held = run("who-holds", "tenant_summary", "73", "--dsn", cluster.dsn())
    assert held.exit_code == 0
    holding, first, *rest = held.stdout.splitlines()
    # nobody waits, but the registry expects transaction locks: a cause in its own right
    assert first.startswith(
        f"tenant_summary 73: held by pid {holder.pid} (billing-worker), nobody waits for it; "
        "that session is the first cause: tenant_summary expects transaction-level locks"
    )
    assert first.endswith("(WARNING expect-violated)")
    assert holding == (
        f"tenant_summary 73 (4102, 73, 2) is held by pid {holder.pid} (billing-worker), "
        "idle " + held.stdout.split("idle ")[1].split(",")[0] + ", session lock (its namespace "
        'tenant_summary declares transaction-level locks (expect = "xact"), and this one '
        "outlived its transaction)"
    )
    document = as_json(
        run("who-holds", "--key", "4102,73", "--dsn", cluster.dsn(), "--format", "json")
    )
    assert document["held"] is True
    assert document["verdict"] == first and document["next_step"]
    assert rest[0] == f"next: {document['next_step']}"
    summary = f"tenant_summary 73 (4102, 73, 2) is held by pid {holder.pid} (billing-worker)"
    assert document["summary"].startswith(summary)
    assert [h["pid"] for h in document["holders"]] == [holder.pid]
    assert document["waiters"] == []
    assert document["namespace"] == "tenant_summary"
    nobody = run("who-holds", "tenant_summary", "-5", "--dsn", cluster.dsn())
    assert nobody.exit_code == 1
    assert nobody.stdout.startswith("nobody holds tenant_summary -5")
    assert nobody.stdout.splitlines()[1] == "tenant_summary -5: nobody holds it: nothing to do"
    waiter = sessions.open("summary-worker")
    waiter.start("SELECT pg_advisory_lock(4102, 73)")
    sessions.waiting(waiter)
    queued = as_json(
        run("who-holds", "tenant_summary", "73", "--dsn", cluster.dsn(), "--format", "json")
    )
    # now the holder is the worst root blocker, in the incident's words, with its next step
    assert queued["verdict"].startswith(
        f"tenant_summary 73: pid {holder.pid} (billing-worker) is the worst root blocker: "
        "blocks 1 session(s) (1 directly)"
    )
    assert queued["next_step"]


def test_from_file_gives_the_same_answer(
    cluster: Cluster, sessions: Sessions, registry_file: Path, tmp_path: Path
) -> None:
    worker = sessions.open("billing-worker")
    worker.run("SELECT pg_advisory_lock(4102, 73)")
    saved = tmp_path / "incident.json"
    result = run("snapshot", "-o", str(saved), "--dsn", cluster.dsn())
    assert result.exit_code == 0 and "saved" in result.stderr
    sessions.close()  # the incident is over; the file still tells it
    offline = run("list", "--from", str(saved), "--format", "json")
    again = run("list", "--from", str(saved), "--format", "json")
    assert offline.stdout == again.stdout
    (lock,) = json.loads(offline.stdout)["locks"]
    assert (lock["namespace"], lock["resource"], lock["lifetime"]) == (
        "tenant_summary",
        73,
        "session",
    )
    assert run("who-holds", "tenant_summary", "73", "--from", str(saved)).exit_code == 0
    all_types = as_json(run("list", "--all", "--from", str(saved), "--format", "json"))
    # the worker's own locks: another backend (autovacuum) may be at work while it is read
    ours = [lock["locktype"] for lock in all_types["locks"] if lock["pid"] == worker.pid]
    assert ours == ["advisory"]
    assert run("list", "--from", str(saved), "--dsn", cluster.dsn()).exit_code == 2


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["who-holds", "tenant_sumary", "1"], 2, "did you mean tenant_summary"),
        (["who-holds", "tenant_summary", "2147483648"], 2, "outside int4"),
        (["who-holds"], 2, "give NAMESPACE RESOURCE"),
        (["key", "invoice_export", "-1"], 2, "low 32 bits"),
        (["decode", "1", "2", "3", "4"], 2, "expected 1 number"),
        (["list", "--from", "missing.json"], 2, "cannot read snapshot file"),
        (["list", "--min-age", "soon"], 2, "is not a duration"),
        (["list", "--format", "xml"], 2, "Invalid value for '--format'"),
        (["key", "tenant_summary", "1", "--registry", "nope.toml"], 2, "does not exist"),
    ],
)
def test_bad_input_is_one_clear_error(
    registry_file: Path, args: list[str], code: int, message: str
) -> None:
    result = run(*args)
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def test_broken_registry_warns_and_the_read_commands_go_on(tmp_path: Path) -> None:
    """A broken ./lockdiag.toml (picked up automatically) must not stop an incident: read
    commands warn once with the file and line and go on; commands that need it stop."""
    (tmp_path / "lockdiag.toml").write_text("[namespaces.a]\nid = 'x'\n")
    where = f"{tmp_path / 'lockdiag.toml'}:2: namespace 'a': id must be an integer"
    incident = str(Path(__file__).resolve().parent.parent / "examples" / "incident.json")
    for command in (["list"], ["blockers"]):
        result = run(*command, "--from", incident)
        assert result.exit_code in (0, 1, 2) and "Traceback" not in result.stderr, command
        assert result.stderr.startswith(f"lockdiag: warning: registry not used: {where}")
    assert "unregistered pair (4102, 73)" in run("list", "--from", incident).stdout
    assert run("registry", "check").exit_code == 1
    # a verdict without the registry's rules would be wrong: UNKNOWN (tests/test_check_failures.py)
    assert run("check", "--from", incident).exit_code == 3
    strict = run("key", "a", "1")
    assert strict.exit_code == 2
    assert strict.stderr.startswith(f"lockdiag: error: {where}")  # one "error", not two


def test_from_file_wins_over_an_exported_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    incident = str(Path(__file__).resolve().parent.parent / "examples" / "incident.json")
    monkeypatch.setenv("LOCKDIAG_DSN", "host=nowhere.invalid")
    assert run("list", "--from", incident).exit_code == 0
    both = run("list", "--from", incident, "--dsn", "host=nowhere.invalid")
    assert both.exit_code == 2 and "not both" in both.stderr


def test_single_server_commands_do_not_offer_targets() -> None:
    for command in (["watch"], ["sample"], ["terminate"], ["snapshot"]):
        assert "--targets" not in run(*command, "--help").stdout, command
    for command in (["list"], ["check"], ["blockers"], ["who-holds"]):
        assert "--targets" in run(*command, "--help").stdout, command


def test_unreachable_server_exit_code() -> None:
    result = run("list", "--dsn", f"host=127.0.0.1 port={free_port()} user=x", "--timeout", "2s")
    assert result.exit_code == 3
    lines = result.stderr.splitlines()
    assert lines[0].startswith("lockdiag: error: cannot connect:")
    assert lines[1].startswith("lockdiag: hint:")


def test_wrong_password_never_printed(cluster: Cluster) -> None:
    result = run(
        "list", "--dsn", f"postgresql://pw_user:Wrong-{PASSWORD}@127.0.0.1:{cluster.port}/postgres"
    )
    assert result.exit_code == 3
    assert "password authentication failed" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


def test_dsn_from_environment_and_libpq_variables(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKDIAG_DSN", cluster.dsn())
    assert run("list").exit_code == 0
    monkeypatch.delenv("LOCKDIAG_DSN")
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", str(cluster.port))
    monkeypatch.setenv("PGUSER", "postgres")
    assert run("list").exit_code == 0


def test_registry_check(tmp_path: Path, registry_file: Path) -> None:
    ok = run("registry", "check")
    assert ok.exit_code == 0
    assert ok.stdout.strip() == f"{registry_file}: OK, 2 namespace(s), 0 warning(s)"
    bad = tmp_path / "bad.toml"
    bad.write_text(
        REGISTRY
        + '\n[namespaces.dup]\nid = 7\nform = "bigint"\n'
        + '[namespaces.both]\nid = 4103\nform = "bigint"\n[namespaces.p]\nid = 4103\n'
    )
    result = run("registry", "check", "--registry", str(bad))
    assert result.exit_code == 1
    assert f"{bad}:13: error: namespace 'dup' reuses bigint id 7" in result.stdout
    document = as_json(run("registry", "check", "--registry", str(bad), "--format", "json"))
    assert document["valid"] is False
    assert [p["severity"] for p in document["problems"]] == ["error", "warning"]
    (tmp_path / "lockdiag.toml").unlink()
    assert run("registry", "check").exit_code == 2


def test_registry_show_key_and_decode(registry_file: Path) -> None:
    shown = as_json(run("registry", "show", "--format", "json"))
    assert [n["name"] for n in shown["namespaces"]] == ["invoice_export", "tenant_summary"]
    key = run("key", "tenant_summary", "-73")
    assert "classid=4102 objid=4294967223 objsubid=2" in key.stdout
    assert "SELECT pg_try_advisory_xact_lock(4102, -73)" in key.stdout
    assert (
        "SELECT pg_advisory_lock(30064771077)"
        in run("key", "invoice_export", "5", "--function", "pg_advisory_lock").stdout
    )
    for numbers in (["4102", "4294967223", "2"], ["4102", "-73"], ["4102,-73"]):
        decoded = as_json(run("decode", *numbers, "--format", "json"))
        assert (decoded["namespace"], decoded["resource"]) == ("tenant_summary", -73)
    unknown = run("decode", "-55037190")
    assert unknown.stdout.startswith("unregistered")
    assert "classid=4294967295 objid=4239930106 objsubid=1" in unknown.stdout


def test_real_subprocess(cluster: Cluster, sessions: Sessions, registry_file: Path) -> None:
    holder = sessions.open("billing-worker")
    holder.run("SELECT pg_advisory_lock(4102, 73)")
    completed = subprocess.run(
        [sys.executable, "-m", "lockdiag", "who-holds", "tenant_summary", "73",
         "--dsn", cluster.dsn(), "--format", "json"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["holders"][0]["pid"] == holder.pid
    version = subprocess.run(
        [sys.executable, "-m", "lockdiag", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("lockdiag, version ")


def test_a_librarys_log_line_speaks_as_lockdiag() -> None:
    """psycopg logs "query cancellation failed: ..." when a cancel cannot reach a frozen server
    (the exporter printed it bare, through Python's last-resort handler): lockdiag's commands
    write it as their own lines, inert."""
    code = (
        "import logging, lockdiag.cli.common; "
        "logging.getLogger('psycopg').warning('query cancellation failed: %s', 'gone\\x1b[2J'); "
        "logging.getLogger('psycopg').info('not shown')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.stderr == "lockdiag: warning: query cancellation failed: gone\\e[2J\n"


def test_exporter_listen_takes_prometheus_forms() -> None:
    from lockdiag.cli.exporter import parse_listen
    from lockdiag.errors import InputError

    assert parse_listen(":9714") == ("0.0.0.0", 9714)  # noqa: S104 - every interface, asked
    assert parse_listen("[::1]:9714") == ("::1", 9714)
    assert parse_listen("127.0.0.1:9714") == ("127.0.0.1", 9714)
    for wrong in ("9714", ":", ":0", "host:", "[::1:9714"):
        with pytest.raises(InputError):
            parse_listen(wrong)


def test_every_help_fits_80_columns() -> None:
    """Every --help line within 80 columns on an 80-column terminal: click wraps the prose,
    not the blocks it must keep as written (examples, exit codes, choices)."""
    from lockdiag.cli.reference import commands

    for name, _ in commands():
        args = [*name.split()[1:], "--help"]
        result = CliRunner().invoke(cli, args, terminal_width=80)
        assert result.exit_code == 0, (name, result.output)
        wide = [line for line in result.stdout.splitlines() if len(line) > 80]
        assert not wide, (name, wide)


def test_watch_once_offers_no_keys() -> None:
    """`watch --once` prints one frame and exits: a footer of keys to press (q quit, p pause...)
    would offer what it does not take."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    result = CliRunner().invoke(
        cli,
        ["watch", "--once", "--from", str(examples / "incident.json"),
         "--registry", str(examples / "lockdiag.toml")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tenant_summary 73" in result.stdout
    assert "q quit" not in result.stdout and " ms" not in result.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--format", "plain"],
        ["list", "--format", "json"],
        ["list", "--format", "table"],
        ["list", "--format", "markdown"],
        ["list", "--format", "csv"],
    ],
    ids=" ".join,
)
def test_a_reader_that_goes_away_ends_the_output_the_same_way(
    tmp_path: Path, args: list[str]
) -> None:
    """`lockdiag ... | head`: the reader leaves after 100 bytes of some MB. One rule for every
    format: lockdiag stops silently with 141 (128 + SIGPIPE), as `yes | head` does. Before,
    plain and markdown said 0, table 1 (rich's own exit), json and csv 1 (click's), and a
    snapshot with PYTHONUNBUFFERED set (as containers often have it) exited 0 having written
    64 KiB of 7 MB: unbuffered, Python dropped the rest of a partial write without an error."""
    from lockdiag.core import snapshot_file

    from helpers.snapshots import advisory, session, snapshot

    sessions = [session(pid, "idle", timedelta(minutes=-5)) for pid in range(100, 110)]
    locks = [advisory(100 + key % 10, key) for key in range(20000)]
    path = tmp_path / "many.json"
    path.write_text(snapshot_file.dumps(snapshot(sessions, locks)))
    for extra in ([], ["--all"]) if args[-1] == "plain" else ([],):
        child = subprocess.Popen(
            [sys.executable, "-m", "lockdiag", *args, *extra, "--from", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        assert len(child.stdout.read(100)) == 100
        child.stdout.close()
        assert child.wait(60) == 141
        said = child.stderr.read()
        assert b"error" not in said and b"Traceback" not in said, said


def test_a_snapshot_to_a_reader_that_goes_away_is_not_said_whole(
    cluster: Cluster, sessions: Sessions
) -> None:
    """`snapshot -o - | head` with PYTHONUNBUFFERED set exited 0 having written 64 KiB."""
    holder = sessions.open("many")
    holder.run("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 20000) AS g")
    child = subprocess.Popen(
        [sys.executable, "-m", "lockdiag", "snapshot", "-o", "-", "--dsn", cluster.dsn()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    assert len(child.stdout.read(100)) == 100
    child.stdout.close()
    assert child.wait(60) == 141
    assert child.stderr.read() == b""


def test_the_objects_of_a_run_are_not_collected_again_at_exit() -> None:
    """Finalization collects every generation, the collector disabled or not: a last pass over
    every object of the run (some 30 ms of `check` at 100k locks). main() freezes them at exit,
    the last of the exit handlers; what was written is flushed all the same. (A command that
    read a server or a snapshot file leaves without any exit handler: tests/test_ending.py;
    `log` exits the usual way.)"""
    log = str(Path(__file__).parents[1] / "examples" / "postgresql.log")
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0, file=sys.stderr))\n"
        f"sys.argv = ['lockdiag', 'log', {log!r}, '--format', 'json']\n"
        "from lockdiag.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "FROZEN True" in result.stderr
    assert json.loads(result.stdout)
