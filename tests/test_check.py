"""`lockdiag check`: each detector fires in its scenario and stays silent in the others; exit
codes follow the monitoring-plugin convention; `terminate` previews, refuses and acts."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pexpect
import psycopg
import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.termination import Refused, preview
from lockdiag.demo.cluster import Cluster, free_port
from lockdiag.evidence import take_snapshot
from lockdiag.pg.actions import act
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import parse_registry

from conftest import OBSERVER, Sessions, ctrl_c_reaches_child

REGISTRY = """\
[namespaces.tenant_summary]
id = 4102
expect = "xact"

[namespaces.leader]
id = 1
expect = "session"

[namespaces.export]
id = 5
max_hold = "1ms"
max_wait = "1ms"
"""
# every duration threshold at zero, so each scenario fires at once
ZERO = ["--session-age", "0s", "--wait-age", "0s", "--idle-age", "0s", "--max-blocked", "1"]


@pytest.fixture(autouse=True)
def registry_file(tmp_path: Path) -> None:
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)


def check(cluster: Cluster, *args: str) -> Result:
    return CliRunner().invoke(cli, ["check", "--dsn", cluster.dsn(), *args])


def kinds(cluster: Cluster, *args: str) -> set[tuple[str, str, int | None]]:
    result = check(cluster, "--format", "json", *args)
    document: dict[str, Any] = json.loads(result.stdout)
    return {(f["kind"], f["severity"], f["pid"]) for f in document["findings"]}


def test_nothing_to_report(cluster: Cluster, sessions: Sessions) -> None:
    sessions.open("leader").run("SELECT pg_advisory_lock(1, 1)")  # declared long-lived
    result = check(cluster, *ZERO)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "OK: no findings"
    nagios = check(cluster, *ZERO, "--format", "nagios")
    assert nagios.exit_code == 0
    assert nagios.stdout.startswith(
        "LOCKDIAG OK - no findings | causes=0;;;0 findings=0;;;0 waiting=0;;;0"
    )


def test_session_lock_expect_and_unregistered(cluster: Cluster, sessions: Sessions) -> None:
    idle = sessions.open("billing-worker")
    idle.run("SELECT pg_advisory_lock(4102, 73), pg_advisory_lock(77, 1), pg_advisory_lock(1, 2)")
    found = kinds(cluster, *ZERO)
    assert found == {
        ("session-lock", "warning", idle.pid),  # a warning level alone: never critical
        ("expect-violated", "warning", idle.pid),
        ("unregistered", "info", idle.pid),  # hygiene: reported, never paging
    }
    assert ("session-lock", "warning", idle.pid) in kinds(cluster, "--session-age", "0s,1h")
    assert ("session-lock", "critical", idle.pid) in kinds(cluster, "--session-age", "0s,0s")
    assert not any(k[0] == "session-lock" for k in kinds(cluster))  # default 5m: too young
    assert not any(k[0] == "unregistered" for k in kinds(cluster, "--no-unregistered"))
    result = check(cluster, "--session-age", "0s,1h")
    assert result.exit_code == 1
    assert result.stdout.startswith("WARNING: 0 critical, ")


def test_a_backend_with_many_locks_is_one_finding(cluster: Cluster, sessions: Sessions) -> None:
    leaky = sessions.open("leaky-worker")
    leaky.run("SELECT count(pg_advisory_lock(4102, g)) FROM generate_series(1, 500) g")
    leaky.run("SELECT pg_advisory_lock(5, 1), pg_advisory_lock(5, 2)")  # export: max_hold 1ms
    other = sessions.open("other-worker")
    other.run("SELECT pg_advisory_lock(4102, 9999)")
    result = check(cluster, "--format", "json", *ZERO)
    findings = json.loads(result.stdout)["findings"]
    mine = {(f["kind"], f["pid"]): f for f in findings}
    assert len(findings) == len(mine)  # nothing twice for one backend
    session_locks = mine[("session-lock", leaky.pid)]
    assert session_locks["locks"] == 502
    assert session_locks["lock"] == "export 1 (+501 more)"
    assert session_locks["evidence"].endswith(": export 1, export 2, tenant_summary 1 and 499 more")
    assert session_locks["lock_detail"]["resource"] == 1
    assert mine[("session-lock", other.pid)]["locks"] == 1
    # per namespace: tenant_summary expects transaction locks, export has a max_hold
    assert mine[("expect-violated", leaky.pid)]["locks"] == 500
    assert mine[("max-hold", leaky.pid)]["locks"] == 2
    assert "has held 2 of its locks at least" in mine[("max-hold", leaky.pid)]["evidence"]


def test_stuck_owner_waits_and_crowded_root(cluster: Cluster, sessions: Sessions) -> None:
    owner = sessions.open("stuck", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 5)")
    waiters = []
    for number in range(2):
        waiter = sessions.open(f"waiter-{number}")
        waiter.start("SELECT pg_advisory_lock(4102, 5)")
        sessions.waiting(waiter)
        waiters.append(waiter)
    found = kinds(cluster, "--wait-age", "0s,1h", "--idle-age", "0s,1h", "--max-blocked", "1,5")
    assert found == {
        ("stuck-owner", "warning", owner.pid),
        ("long-wait", "warning", waiters[0].pid),
        ("long-wait", "warning", waiters[1].pid),
        ("blocked-many", "warning", owner.pid),
    }
    crowded = kinds(cluster, "--wait-age", "0s,1h", "--max-blocked", "0,1")
    assert ("blocked-many", "critical", owner.pid) in crowded
    assert not any(k[0] == "blocked-many" for k in kinds(cluster))  # default: more than 5
    # waits shorter than --wait-age are ordinary contention: they crowd nothing
    assert not any(k[0] == "blocked-many" for k in kinds(cluster, "--max-blocked", "0,1"))
    result = check(cluster, "--wait-age", "0s,0s")
    assert result.exit_code == 2
    # one cause, named by the lock both wait for, as critical as the waits it causes
    lines = result.stdout.splitlines()
    assert lines[0] == "CRITICAL: 1 critical, 0 warning cause(s); 2 session(s) waiting"
    assert lines[1] == f"CRITICAL root-blocker: tenant_summary 5  pid {owner.pid} (stuck)"


def test_names_cannot_forge_nagios_perfdata(cluster: Cluster, sessions: Sessions) -> None:
    """An application name or a relation name is printed before the perfdata separator: a
    `|` in one would start forged metrics (`waiting=0`), and a monitor graphs the first it
    reads. The status line keeps exactly one `|`, lockdiag's own."""
    forged = "app|waiting=0;;;0 most_blocked=0"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute('CREATE TABLE IF NOT EXISTS "t|waiting=0" (id int)')
    owner = sessions.open(forged, autocommit=False)
    owner.run('LOCK TABLE "t|waiting=0" IN ACCESS EXCLUSIVE MODE')
    owner.run("SELECT pg_advisory_xact_lock(4102, 6)")
    for number, sql in enumerate(
        ['SELECT count(*) FROM "t|waiting=0"', "SELECT pg_advisory_lock(4102, 6)"]
    ):
        waiter = sessions.open(f"waiter-{number}")
        waiter.start(sql)
        sessions.waiting(waiter)
    result = check(cluster, "--wait-age", "0s,0s", "--format", "nagios")
    line = result.stdout.splitlines()[0]
    assert line.startswith("LOCKDIAG CRITICAL - "), line
    assert line.count("|") == 1, line
    summary, perfdata = line.split(" | ")
    assert "app\u00a6waiting=0" in summary, summary
    assert perfdata.split()[2] == "waiting=2;;;0", perfdata
    # a fleet's line: a target's error quotes its DSN's host name
    unreachable = "host=no|such.invalid user=x connect_timeout=2"
    fleet = CliRunner().invoke(
        cli, ["check", "--format", "nagios", "--dsn", cluster.dsn(), "--dsn", unreachable]
    )
    line = fleet.stdout.splitlines()[0]
    assert line.startswith("LOCKDIAG UNKNOWN - 2 target(s): ") and "no\u00a6such" in line, line
    assert line.count("|") == 1, line
    alone = CliRunner().invoke(cli, ["check", "--format", "nagios", "--dsn", unreachable])
    line = alone.stdout.splitlines()[0]
    assert line.startswith("LOCKDIAG UNKNOWN - ") and "no\u00a6such" in line, line
    assert "|" not in line, line


def test_namespace_limits_are_critical(cluster: Cluster, sessions: Sessions) -> None:
    holder = sessions.open("exporter", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(5, 1)")
    waiter = sessions.open("export-waiter")
    waiter.start("SELECT pg_advisory_lock(5, 1)")
    sessions.waiting(waiter)
    found = kinds(cluster)
    assert ("max-wait", "critical", waiter.pid) in found
    assert ("max-hold", "critical", holder.pid) in found
    assert check(cluster).exit_code == 2


def test_prometheus_output(cluster: Cluster, sessions: Sessions) -> None:
    sessions.open("w").run("SELECT pg_advisory_lock(4102, 1), pg_advisory_lock(99, 1)")
    result = check(cluster, "--format", "prometheus", "--session-age", "0s,1h")
    lines = result.stdout.splitlines()
    # one finding for the backend, which holds both locks
    assert 'lockdiag_findings{kind="session-lock",severity="warning"} 1.0' in lines
    held = 'lockdiag_advisory_locks{database="postgres",namespace="%s",state="held"} 1.0'
    assert held % "tenant_summary" in lines
    assert held % "unregistered" in lines
    assert "# TYPE lockdiag_longest_wait_seconds gauge" in lines
    assert "lockdiag_up 1.0" in lines  # its 0 says why the rest is missing (test_check_failures)
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--wait-age", "soon"], "'soon' is not a duration"),
        (["--max-blocked", "5,2"], "below the warning level"),
        (["--format", "xml"], "'xml' is not one of"),
        ([], None),  # the same snapshot file with good arguments is answered
    ],
)
def test_unknown_on_bad_arguments(args: list[str], reason: str | None) -> None:
    """Each bad argument alone makes check UNKNOWN (3), with its own reason, on a snapshot file
    that good arguments read fine."""
    incident = str(Path(__file__).resolve().parent.parent / "examples" / "incident.json")
    result = CliRunner().invoke(cli, ["check", "--from", incident, *args])
    if reason is None:
        assert result.exit_code in (0, 1, 2), result.output
        return
    assert result.exit_code == 3
    assert reason in result.stderr, result.stderr


def test_unknown_when_unreachable() -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=x"
    result = CliRunner().invoke(
        cli, ["check", "--dsn", dsn, "--format", "nagios", "--timeout", "2s"]
    )
    assert result.exit_code == 3
    assert result.stdout.startswith("LOCKDIAG UNKNOWN - cannot connect")


# -- terminate ---------------------------------------------------------------------------------


def test_terminate_preview_then_waiters_proceed(cluster: Cluster, sessions: Sessions) -> None:
    blocker = sessions.open("stuck", autocommit=False)
    blocker.run("SELECT pg_advisory_xact_lock(4102, 9)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 9)")
    sessions.waiting(waiter)
    result = CliRunner().invoke(
        cli, ["terminate", str(blocker.pid), "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0, result.stderr
    assert f"pid {blocker.pid} (stuck)" in result.stdout
    assert f"holds up 1 session(s): {waiter.pid}" in result.stdout
    assert "tenant_summary 9" in result.stdout
    assert f"pid {blocker.pid} ended" in result.stdout
    assert waiter.done()  # the waiter got its lock
    assert waiter.error is None


def terminate_prompt(cluster: Cluster, pid: int) -> pexpect.spawn:
    """`lockdiag terminate PID` in a pseudo-terminal, so that it asks for confirmation."""
    return pexpect.spawn(
        sys.executable, ["-m", "lockdiag", "terminate", str(pid), "--dsn", cluster.dsn()],
        timeout=30, preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip


def exit_status(child: pexpect.spawn) -> int | None:
    child.expect(pexpect.EOF)
    child.close()
    status: int | None = child.exitstatus
    return status


def test_terminate_refusals_change_nothing(cluster: Cluster, sessions: Sessions) -> None:
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 10)")
    idle = sessions.open("lockless")
    runner = CliRunner()
    base = ["--dsn", cluster.dsn()]
    no_confirmation = runner.invoke(cli, ["terminate", str(holder.pid), *base])  # stdin: no tty
    assert no_confirmation.exit_code == 2
    assert "not confirmed" in no_confirmation.stderr
    lockless = runner.invoke(cli, ["terminate", str(idle.pid), "--yes", *base])
    assert lockless.exit_code == 2
    assert "holds and waits for no lock" in lockless.stderr
    declined = terminate_prompt(cluster, holder.pid)
    declined.expect_exact(f"terminate pid {holder.pid}? [y/N]:")
    declined.sendline("n")
    declined.expect_exact("nothing done")
    assert exit_status(declined) == 1
    hidden = runner.invoke(
        cli, ["terminate", str(holder.pid), "--yes", "--dsn", cluster.dsn(user=OBSERVER)]
    )
    assert hidden.exit_code == 2  # it cannot see the session's start: refused before acting
    assert f"hidden from {OBSERVER}" in hidden.stderr
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS stats_reader")
        admin.execute("CREATE ROLE stats_reader LOGIN IN ROLE pg_read_all_stats")
    denied = runner.invoke(
        cli, ["terminate", str(holder.pid), "--yes", "--dsn", cluster.dsn(user="stats_reader")]
    )
    assert denied.exit_code == 3  # it sees the session, but may not signal it
    assert "permission denied" in denied.stderr
    assert holder.run("SELECT 1") == [(1,)]  # still alive, still holding
    assert holder.run(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
    ) == [(1,)]
    snapshot = take_snapshot(cluster.dsn(), 5, "all")
    registry, _ = parse_registry(REGISTRY)
    assert registry is not None
    with pytest.raises(Refused, match="lockdiag's own session"):
        preview(Diagnosis(snapshot, registry), snapshot.server.backend_pid)


def test_ctrl_c_at_terminates_prompt_is_an_interruption(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Ctrl-C at the confirmation: exit 130 and lockdiag's one line, as Ctrl-C anywhere else
    (click's prompt printed 'Aborted!' and exited 1); nothing is signalled."""
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 16)")
    child = terminate_prompt(cluster, holder.pid)
    child.expect_exact(f"terminate pid {holder.pid}? [y/N]:")
    child.sendintr()
    child.expect_exact("lockdiag: interrupted")
    rest = child.read().decode()
    assert "Aborted" not in rest
    assert exit_status(child) == 130
    assert holder.run("SELECT 1") == [(1,)]


def test_terminate_refuses_a_session_whose_start_it_cannot_see(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A role that may signal others' backends (pg_signal_backend) but not read their state:
    without the session's backend_start, the action's check that the pid is still the session
    shown would pass for any later session given the same pid. Refused, nothing signalled."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS signaller")
        admin.execute("CREATE ROLE signaller LOGIN IN ROLE pg_signal_backend")
    holder = sessions.open("holder", user=OBSERVER)
    holder.run("SELECT pg_advisory_lock(4102, 15)")
    result = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--yes", "--dsn", cluster.dsn(user="signaller")]
    )
    assert result.exit_code == 2, result.output
    assert "hidden from signaller" in result.stderr
    assert "GRANT pg_read_all_stats" in result.stderr
    assert holder.run("SELECT 1") == [(1,)]  # still alive, still holding


def test_cancel_keeps_session_locks(cluster: Cluster, sessions: Sessions) -> None:
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 11)")
    busy = sessions.open("busy")
    busy.start("SELECT pg_advisory_lock(4102, 11)")
    sessions.waiting(busy)
    result = CliRunner().invoke(
        cli, ["terminate", str(busy.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0, result.stderr
    assert "cancel request sent" in result.stdout
    assert busy.done()
    assert busy.error is not None and "canceling statement" in str(busy.error)
    assert holder.run(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
    ) == [(1,)]


def test_terminate_acts_only_on_the_session_it_showed(cluster: Cluster, sessions: Sessions) -> None:
    """Between the preview and the confirmation the previewed backend ends and another
    session takes the same lock: nothing is signalled, and the message says why."""
    holder = sessions.open("previewed", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(4102, 12)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 12)")
    sessions.waiting(waiter)
    child = terminate_prompt(cluster, holder.pid)
    child.expect_exact(f"terminate pid {holder.pid}? [y/N]:")
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (holder.pid,))
    assert waiter.done()  # the waiter got the lock once the previewed session was gone
    newcomer = sessions.open("newcomer")
    newcomer.run("SELECT pg_advisory_lock(4102, 13)")
    child.sendline("y")
    child.expect_exact(f"pid {holder.pid} is gone: nothing to end")
    assert exit_status(child) == 1
    assert newcomer.run("SELECT 1") == [(1,)] and waiter.run("SELECT 1") == [(1,)]


def test_terminate_checks_identity_and_locks_in_the_same_statement(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A reused pid (another backend_start) or a released lock: the statement sends nothing."""
    registry, _ = parse_registry(REGISTRY)
    assert registry is not None
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 14)")
    with DiagnosticSession(cluster.dsn(), 5, registry) as session:
        plan = preview(Diagnosis(session.snapshot("all"), registry), holder.pid)
        started = plan.session.backend_start
        assert started is not None
        earlier = dataclasses.replace(plan.session, backend_start=started - timedelta(hours=1))
        reused = act(session, dataclasses.replace(plan, session=earlier), False, 1.0)
        assert not reused.done and "is now another session" in reused.message
        holder.run("SELECT pg_advisory_unlock(4102, 14)")
        released = act(session, plan, False, 1.0)
        assert not released.done and "no longer holds (or waits for) 1 of the lock(s)" in (
            released.message
        )
    assert holder.run("SELECT 1") == [(1,)]  # never signalled


def test_terminate_a_waiter_names_its_blocker_and_cancel_spares_an_idle_session(
    cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 15)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 15)")
    sessions.waiting(waiter)
    child = terminate_prompt(cluster, waiter.pid)
    child.expect_exact(f"pid {waiter.pid} is a waiter, not a blocker: ending it frees nobody.")
    child.expect_exact(f"it waits for pid {holder.pid} (holder), idle: ")
    child.expect_exact(f"lockdiag terminate {holder.pid}")
    child.expect_exact(f"terminate the waiter pid {waiter.pid}? [y/N]:")
    child.sendline("n")
    assert exit_status(child) == 1
    idle = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert idle.exit_code == 1
    assert "is idle: it runs no query to cancel" in idle.stderr
    assert "state idle for " in idle.stdout  # how long it has been in its state
    assert holder.run("SELECT 1") == [(1,)] and not waiter.done(0.1)


def running(sessions: Sessions, worker: Any, text: str) -> None:
    """Block until ``worker`` runs a statement containing ``text`` (state active)."""
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT state = 'active' AND position(%s in query) > 0 FROM pg_stat_activity "
                "WHERE pid = %s",
                (text, worker.pid),
            ).fetchone()
            == (True,)
        ),
        10,
        f"{worker.name} (pid {worker.pid}) to run {text}",
    )


def activity(cluster: Cluster, pid: int) -> tuple[Any, ...]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT state, state_change, query_start, xact_start FROM pg_stat_activity "
            "WHERE pid = %s",
            (pid,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def advisory_held(cluster: Cluster, pid: int) -> set[int]:
    """The second halves of the (4102, N) advisory keys ``pid`` holds."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT objid FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND granted "
            "AND classid = 4102",
            (pid,),
        ).fetchall()
    return {row[0] for row in rows}


def test_cancel_refuses_a_session_idle_in_transaction(
    cluster: Cluster, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pg_cancel_backend on an idle-in-transaction backend returns true and does nothing (seen
    on the server): lockdiag refuses before sending anything, and says the locks stay."""
    holder = sessions.open("stuck-owner", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(4102, 20)")
    before = activity(cluster, holder.pid)
    assert before[0] == "idle in transaction"
    sent: list[int] = []
    real_act = act

    def spy(session: DiagnosticSession, plan: Any, cancel: bool, wait: float) -> Any:
        sent.append(plan.pid)
        return real_act(session, plan, cancel, wait)

    monkeypatch.setattr("lockdiag.cli.actions.act", spy)
    result = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 1, result.output
    assert (
        f"nothing to cancel: pid {holder.pid} is idle in transaction; cancelling releases "
        "nothing — its locks stay until the transaction ends"
    ) in result.stderr
    assert "it runs no query: cancelling releases nothing below" in result.stdout  # preview
    assert "cancelling its query releases" not in result.stdout
    assert sent == []  # refused before the signalling statement
    assert advisory_held(cluster, holder.pid) == {20}
    assert activity(cluster, holder.pid) == before  # same state, since the same moment
    assert holder.run("SELECT 1") == [(1,)]  # the transaction goes on, unharmed


def test_cancel_rechecks_that_a_query_still_runs_at_the_act_step(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Active in the preview, idle in transaction at the confirmation: nothing is sent."""
    holder = sessions.open("short-query", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(4102, 21)")
    holder.start("SELECT pg_sleep(2)")
    running(sessions, holder, "pg_sleep")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "lockdiag", "terminate", str(holder.pid), "--cancel", "--dsn", cluster.dsn()],
        timeout=30, preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip
    child.expect_exact("state active")
    child.expect_exact(f"cancel the query of pid {holder.pid}? [y/N]:")
    assert holder.done()  # the query ended: idle in transaction, the same locks held
    assert holder.error is None
    child.sendline("y")
    child.expect_exact(f"nothing to cancel: pid {holder.pid} is now idle in transaction")
    assert exit_status(child) == 1
    assert advisory_held(cluster, holder.pid) == {21}
    assert holder.run("SELECT 1") == [(1,)]  # not cancelled: the transaction is not aborted


def test_cancel_of_a_query_says_the_session_lock_stays(
    cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("sleeper")
    holder.run("SELECT pg_advisory_lock(4102, 22)")
    holder.start("SELECT pg_sleep(30)")
    running(sessions, holder, "pg_sleep")
    result = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0, result.output
    assert f"cancel request sent to pid {holder.pid}: its query stopped; it is now idle" in (
        result.stdout
    )
    assert "still held: tenant_summary 22 (session-level locks stay after a cancel)" in (
        result.stdout
    )
    assert "released: virtualxid" in result.stdout  # its (implicit) transaction ended
    assert holder.done() and "canceling statement" in str(holder.error)
    assert advisory_held(cluster, holder.pid) == {22}  # as reported


def test_cancel_in_a_transaction_releases_its_locks_at_the_abort(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Seen on the server: the cancelled statement aborts the transaction, and the abort
    releases its locks at once (the waiter gets the lock before any ROLLBACK); the
    transaction stays aborted until the client rolls back."""
    holder = sessions.open("in-transaction", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(4102, 23)")
    holder.start("SELECT pg_sleep(30)")
    running(sessions, holder, "pg_sleep")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 23)")
    sessions.waiting(waiter)
    result = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0, result.output
    assert (
        "its query stopped; it is now idle in transaction (aborted), until the client rolls "
        "back: released: tenant_summary 23, virtualxid "
    ) in result.stdout
    assert "still held: nothing" in result.stdout
    assert waiter.done() and waiter.error is None  # it got the lock: released indeed
    assert activity(cluster, holder.pid)[0] == "idle in transaction (aborted)"
    assert advisory_held(cluster, holder.pid) == set()
    holder.connection.rollback()


def test_cancel_after_a_savepoint_keeps_the_outer_transaction_locks(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Inside a savepoint, a cancel aborts the subtransaction only: the locks taken before
    the savepoint stay until the client rolls back, and the report says so."""
    holder = sessions.open("savepoint", autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(4102, 24)")
    holder.run("SAVEPOINT inner_work")
    holder.run("SELECT pg_advisory_xact_lock(4102, 25)")
    holder.start("SELECT pg_sleep(30)")
    running(sessions, holder, "pg_sleep")
    result = CliRunner().invoke(
        cli, ["terminate", str(holder.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0, result.output
    assert "it is now idle in transaction (aborted)" in result.stdout
    assert "released: tenant_summary 25; still held: tenant_summary 24, virtualxid " in (
        result.stdout
    )
    assert "its transaction is aborted and keeps its other locks until the client rolls back" in (
        result.stdout
    )
    assert advisory_held(cluster, holder.pid) == {24}  # as reported
    holder.connection.rollback()
    assert advisory_held(cluster, holder.pid) == set()


def test_terminate_without_a_terminal_previews_the_waiter_then_refuses(
    cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 26)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 26)")
    sessions.waiting(waiter)
    result = CliRunner().invoke(cli, ["terminate", str(waiter.pid), "--dsn", cluster.dsn()])
    assert result.exit_code == 2
    assert f"pid {waiter.pid} (waiter)" in result.stdout
    assert f"pid {waiter.pid} is a waiter, not a blocker: ending it frees nobody." in (
        result.stdout
    )
    assert f"it waits for pid {holder.pid} (holder), idle: lockdiag terminate {holder.pid}" in (
        result.stdout
    )
    assert (
        f"not confirmed: run with --yes to terminate the waiter pid {waiter.pid} without a prompt"
    ) in result.stderr
    assert not waiter.done(0.1)  # still waiting: nothing was done


def test_terminate_json_is_one_document_with_the_outcome(
    cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("sleeper")
    holder.run("SELECT pg_advisory_lock(4102, 27)")
    holder.start("SELECT pg_sleep(30)")
    running(sessions, holder, "pg_sleep")
    runner = CliRunner()
    base = ["--format", "json", "--dsn", cluster.dsn()]
    unconfirmed = runner.invoke(cli, ["terminate", str(holder.pid), "--cancel", *base])
    assert unconfirmed.exit_code == 2
    refused = json.loads(unconfirmed.stdout)
    assert refused["pid"] == holder.pid and refused["action"] == "cancel"
    assert refused["done"] is False and refused["message"].startswith("not confirmed")
    assert refused["released"] is None and refused["still_held"] is None
    assert f"pid {holder.pid} (sleeper)" in unconfirmed.stderr  # the preview, for people
    cancelled = runner.invoke(cli, ["terminate", str(holder.pid), "--cancel", "--yes", *base])
    assert cancelled.exit_code == 0, cancelled.output
    document = json.loads(cancelled.stdout)
    assert document["done"] is True and document["state"] == "active"
    assert "session-level locks stay after a cancel" in document["message"]
    assert [e["key"] for e in document["still_held"]] == [[4102, 27]]
    assert [e["locktype"] for e in document["released"]] == ["virtualxid"]
    assert [e["key"] for e in document["holds"] if e["locktype"] == "advisory"] == [[4102, 27]]
    assert "its query stopped" in cancelled.stderr
    assert holder.done()
    idle = runner.invoke(cli, ["terminate", str(holder.pid), "--cancel", "--yes", *base])
    assert idle.exit_code == 1
    assert json.loads(idle.stdout)["message"].startswith(f"pid {holder.pid} is idle")


LOWER_BOUND = {
    "outlived-client": True, "session-lock": True, "stuck-owner": True, "expect-violated": True,
    "max-hold": True, "long-wait": False, "max-wait": False, "blocked-many": False,
    "unregistered": False,
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(LOWER_BOUND))
def test_lower_bound_for_each_kind(kind: str, tmp_path: Path) -> None:
    """Each kind, raised from the bundled incident: lower_bound is true exactly for the kinds
    whose value is a duration PostgreSQL only bounds from below."""
    root = Path(__file__).resolve().parent.parent
    registry = tmp_path / "lockdiag.toml"
    text = (root / "examples" / "lockdiag.toml").read_text()
    if kind == "max-wait":  # a namespace's own limit replaces --wait-age for its waits
        text = text.replace('max_hold = "5m"', 'max_hold = "5m"\nmax_wait = "1s"')
    registry.write_text(text)
    result = CliRunner().invoke(
        cli, ["check", "--from", str(root / "examples" / "incident.json"), "--registry",
              str(registry), "--format", "json", "--wait-age", "0s", "--max-blocked", "0"],
    )  # fmt: skip
    findings = [f for f in json.loads(result.stdout)["findings"] if f["kind"] == kind]
    assert findings, f"the incident raised no {kind}"
    assert {f["lower_bound"] for f in findings} == {LOWER_BOUND[kind]}


def test_census_agrees_with_counting_each_lock() -> None:
    """The one pass that feeds the detectors and the metrics counts what counting lock by
    lock gives, on the bundled incident and on a generated table of 10,000 locks."""
    from test_json import generated

    from lockdiag.core import snapshot_file
    from lockdiag.core.analysis import Flag, namespace_of
    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.core.findings import census
    from lockdiag.registry import load_registry

    root = Path(__file__).resolve().parent.parent
    registry = load_registry(str(root / "examples" / "lockdiag.toml"))
    for snapshot in (snapshot_file.load(root / "examples" / "incident.json"), generated()):
        entries = Diagnosis(snapshot, registry).entries
        found = census(entries)
        counts: dict[tuple[str, str, str], int] = {}
        for e in entries:
            if e.decoded is not None:
                key = (e.database or "", namespace_of(e), "held" if e.lock.granted else "waiting")
                counts[key] = counts.get(key, 0) + 1
        assert found.advisory == counts and sum(counts.values()) > 10
        assert found.waiters == [e for e in entries if not e.lock.granted] != []
        for flag in Flag:
            assert found.flagged[flag] == [e for e in entries if flag in e.flags]
        sessions = [e.held_at_least or 0.0 for e in entries if e.lifetime == "session"]
        assert found.oldest_session_lock == max(sessions, default=0.0)


def test_markdown_is_a_table_of_causes() -> None:
    """For a ticket: the verdict in bold, one pipe table of causes worst first, notes below."""
    root = Path(__file__).resolve().parent.parent
    args = ["check", "--from", str(root / "examples" / "incident.json"), "--registry",
            str(root / "examples" / "lockdiag.toml")]  # fmt: skip
    result = CliRunner().invoke(cli, [*args, "--format", "markdown"])
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert lines[0] == "**CRITICAL: 2 critical, 3 warning cause(s); 3 session(s) waiting**"
    assert "```" not in result.stdout
    table = [line for line in lines if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["SEVERITY", "KIND", "LOCK", "PID", "APPLICATION", "BLOCKED",
                      "LONGEST WAIT", "NEXT STEP"]  # fmt: skip
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    document = json.loads(CliRunner().invoke(cli, [*args, "--format", "json"]).stdout)
    assert len(rows) == len(document["causes"]) == 5
    for row, cause in zip(rows, document["causes"], strict=True):
        assert row[0] == cause["severity"].upper()
        assert row[3] == str(cause["pid"])
        assert row[5].split()[0] == str(cause["blocked"])
    assert rows[0][:6] == ["CRITICAL", "session-lock", "tenant\\_summary 73 (+1 more)", "4163",
                           "billing-worker", "2 (2 directly)"]  # fmt: skip
    assert rows[0][6] == "7m28s"
    assert "lockdiag terminate 4163" in rows[0][7]
