"""Advice that never breaks the mutual exclusion a lock promises. A timeout, a termination or a
cancel releases the session's locks; a program holding an advisory lock believes it keeps it.
Real programs hold one idle in a transaction by design (a coordination library's lock
connection, a two-phase commit between vote and finish): such a holder gets no timeout and no
terminate without evidence that its program is gone or its lock is outside its design, and the
advice says what either would break. A holder of no advisory lock gets the timeout, with whom it
is safe for, and its transaction id says whether ending it loses writes. At equal impact, a
cause that will not end by itself ranks first. Real sessions, a real PgBouncer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Bouncer, Cluster

from helpers.cli import run, step_of
from helpers.registry import write_registry
from helpers.servers import Sessions

THRESHOLDS = ["--session-age", "100ms,1h", "--idle-age", "100ms,1h", "--wait-age", "100ms,1h"]
COORDINATION = 4600  # a coordination library's namespace
TWO_PHASE = 4601  # an object database's per-object locks, held between vote and finish
RELEASES = ("SET idle_in_transaction_session_timeout", "ALTER ROLE", "lockdiag terminate")


def registry(tmp_path: Path, text: str) -> str:
    return str(write_registry(tmp_path, text, "exclusion.toml"))


def check(cluster: Cluster, *args: str, format: str = "json") -> str:
    source = [] if "--from" in args else ["--dsn", cluster.dsn()]
    result = run("check", *source, "--format", format, *THRESHOLDS, *args)
    assert result.exit_code in (0, 1, 2), result.output
    return result.stdout


def no_release(step: str) -> None:
    for action in RELEASES:
        assert action not in step, step


@pytest.mark.parametrize("declared", [False, True], ids=["unregistered", "expect-session"])
def test_a_session_lock_held_idle_in_a_transaction_is_never_timed_out(
    cluster: Cluster, sessions: Sessions, tmp_path: Path, declared: bool
) -> None:
    """The coordination library's pattern: the driver's implicit transaction, then
    pg_advisory_lock, then idle in transaction for the whole hold."""
    holder = sessions.open("coordinator", autocommit=False)  # psycopg opens the transaction
    holder.run(f"SELECT pg_advisory_lock({COORDINATION}, 1)")
    waiter = sessions.open("coordinator-2")
    waiter.start(f"SELECT pg_advisory_lock({COORDINATION}, 1)")
    sessions.waiting(waiter)
    time.sleep(0.3)  # past --idle-age's warning level
    args = []
    if declared:
        text = f'[namespaces.coordination]\nid = {COORDINATION}\nexpect = "session"\n'
        args = ["--registry", registry(tmp_path, text)]
    step = step_of(json.loads(check(cluster, *args)), holder.pid, "stuck-owner")
    no_release(step)
    assert "No idle_in_transaction_session_timeout and no terminate" in step, step
    assert "another instance would take it" in step, step  # what either would break
    if declared:  # in the registry's terms, not generic ones
        assert 'coordination declares expect = "session" and no max_hold' in step, step
        assert "longest normal pause" not in step, step
    plain = check(cluster, *args, format="plain")
    assert "while its program may believe it holds it" in plain, plain


def test_an_xact_lock_held_between_two_phases_is_never_timed_out(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """The two-phase commit's pattern: transaction-level locks, a write, then idle in
    transaction between vote and finish. Within its declared max_hold: no release; past it:
    declared evidence, and ending comes after checking the owning process."""
    text = f'[namespaces.objects]\nid = {TWO_PHASE}\nexpect = "xact"\nmax_hold = "1h"\n'
    names = ["--registry", registry(tmp_path, text)]
    voter = sessions.open("object-store", autocommit=False)
    voter.run(f"SELECT pg_advisory_xact_lock({TWO_PHASE}, 7)")
    voter.run("UPDATE items SET note = 'voted' WHERE id = 1")  # its vote wrote
    other = sessions.open("object-store-2", autocommit=False)
    other.start(f"SELECT pg_advisory_xact_lock({TWO_PHASE}, 7)")
    sessions.waiting(other)
    time.sleep(0.3)
    step = step_of(json.loads(check(cluster, *names)), voter.pid, "stuck-owner")
    no_release(step)
    assert 'objects declares expect = "xact" and max_hold 1h00m, not seen passed' in step, step
    past = registry(tmp_path, text.replace('"1h"', '"100ms"'))
    step = step_of(json.loads(check(cluster, "--registry", past)), voter.pid, "stuck-owner")
    assert step.startswith("Held past objects's max_hold of 100ms. Check the owning"), step
    assert step.index("Check the owning process") < step.index(f"terminate {voter.pid}"), step
    assert "so it may have written: ending it rolls that back" in step, step
    assert "idle_in_transaction_session_timeout" not in step, step


@pytest.mark.parametrize("writes", [False, True], ids=["reader", "writer"])
def test_a_holder_of_no_advisory_lock_gets_the_timeout_and_its_writes_are_weighed(
    cluster: Cluster, sessions: Sessions, writes: bool, tmp_path: Path
) -> None:
    """An idle-in-transaction session holding a table that a DDL waits for, and no advisory
    lock: the timeout is safe for it, and said so; with no transaction id it has written
    nothing, so ending it loses no writes; with one, ending it rolls its writes back."""
    table = "orders_w" if writes else "orders_r"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {table}")
        admin.execute(f"CREATE TABLE {table} (id int)")
    holder = sessions.open("shop-api", autocommit=False)
    holder.run(f"INSERT INTO {table} VALUES (1)" if writes else f"SELECT * FROM {table}")
    deploy = sessions.open("deploy")
    deploy.start(f"ALTER TABLE {table} ADD COLUMN note text")
    sessions.waiting(deploy)
    time.sleep(0.3)
    output = check(cluster)
    step = step_of(json.loads(output), holder.pid, "stuck-owner")
    assert "It holds no advisory lock, so idle_in_transaction_session_timeout is safe" in step
    assert "ALTER ROLE postgres if no program of that role holds advisory locks" in step, step
    if writes:
        assert "so it may have written: ending it rolls that back" in step, step
        assert "lockdiag terminate" not in step, step
    else:
        assert step.endswith(
            "It has written nothing (no transaction id), so ending it loses no writes: "
            f"lockdiag terminate {holder.pid}"
        ), step
    # a snapshot file from before lockdiag read backend_xid still loads, and claims nothing
    saved = tmp_path / "snapshot.json"
    result = CliRunner().invoke(cli, ["snapshot", "--dsn", cluster.dsn(), "-o", str(saved)])
    assert result.exit_code == 0, result.output
    document = json.loads(saved.read_text())
    xids = {s["pid"]: s["backend_xid"] for s in document["sessions"]}
    assert (xids[holder.pid] != 0) is writes, xids
    for session in document["sessions"]:
        del session["backend_xid"]
    saved.write_text(json.dumps(document))
    older = json.loads(check(cluster, "--from", str(saved)))
    step = step_of(older, holder.pid, "stuck-owner")
    assert "written" not in step and "lockdiag terminate" not in step, step


def test_at_equal_impact_a_leak_ranks_above_a_query_at_work(
    cluster: Cluster, sessions: Sessions, transaction_pool: Bouncer
) -> None:
    """A lock that outlived its client through a real PgBouncer never ends by itself; an
    active query does. Each blocks one session; the query's waiter has waited longer, which
    ranked it first before."""
    busy = sessions.open("report-query")
    busy.start("SELECT pg_advisory_lock(4700), pg_sleep(60)")
    sessions.until(
        lambda admin: (
            admin.execute("SELECT count(*) FROM pg_locks WHERE objid = 4700 AND granted").fetchone()
            == (1,)
        ),
        10,
        "the query to take its lock",
    )
    behind_busy = sessions.open("report-reader")
    behind_busy.start("SELECT pg_advisory_lock(4700)")
    sessions.waiting(behind_busy)
    time.sleep(0.5)  # its waiter waits longer than the leak's
    with psycopg.connect(
        transaction_pool.dsn(application_name="leaky-worker"), autocommit=True,
        prepare_threshold=None,
    ) as worker:  # fmt: skip
        row = worker.execute("SELECT pg_try_advisory_lock(4701), pg_backend_pid()").fetchone()
        assert row is not None and row[0] is True
        leaked = int(row[1])
    try:
        behind_leak = sessions.open("leak-reader")
        behind_leak.start("SELECT pg_advisory_lock(4701)")
        sessions.waiting(behind_leak)
        time.sleep(0.2)
        console = ["--pgbouncer", transaction_pool.console_dsn()]
        causes = json.loads(check(cluster, *console))["causes"]
        order = [c["pid"] for c in causes if c["pid"] in (leaked, busy.pid)]
        assert order == [leaked, busy.pid], json.dumps(causes, indent=1)
        assert causes[0]["kind"] == "outlived-client" and causes[0]["blocked"] == 1
        assert next(c for c in causes if c["pid"] == busy.pid)["blocked"] == 1
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (leaked,))
