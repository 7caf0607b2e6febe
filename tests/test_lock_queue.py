"""The lock-queue outage, with real sessions: an idle-in-transaction reader holds ACCESS SHARE
on `orders`, a deploy's ALTER TABLE waits behind it (ACCESS EXCLUSIVE), and 15 application
queries wait behind the ALTER, not behind the reader. Every view names the waiting DDL and
gives the quick way out first (cancel its wait), then the holder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from click.testing import CliRunner
from terminal import screen_of

from lockdiag.cli import cli
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import take_snapshot
from lockdiag.registry import Registry

from conftest import Sessions, Worker

APPS = 15


@dataclass
class Outage:
    reader: Worker
    ddl: Worker
    apps: list[Worker]


@pytest.fixture
def outage(cluster: Cluster, sessions: Sessions) -> Iterator[Outage]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS orders")
        admin.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
    reader = sessions.open("report-reader", autocommit=False)
    reader.run("SELECT count(*) FROM orders")  # ACCESS SHARE, then idle in transaction
    ddl = sessions.open("deploy")
    ddl.start("ALTER TABLE orders ADD COLUMN note text")
    sessions.waiting(ddl)
    apps = []
    for number in range(APPS):
        app = sessions.open(f"web-{number}")
        app.start("SELECT count(*) FROM orders")
        sessions.waiting(app)
        apps.append(app)
    yield Outage(reader, ddl, apps)


def invoke(*args: str) -> str:
    return CliRunner().invoke(cli, list(args)).stdout


def test_the_queue_rules_as_the_server_states_them(cluster: Cluster, outage: Outage) -> None:
    """pg_blocking_pids names the reader for the ALTER and the ALTER (not the reader) for each
    application query: their ACCESS SHARE conflicts with its queued request only."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        blocked: dict[int, list[int]] = dict(
            admin.execute(
                "SELECT pid, pg_blocking_pids(pid) FROM pg_locks WHERE NOT granted "
                "AND relation = 'orders'::regclass"
            ).fetchall()
        )
    assert blocked[outage.ddl.pid] == [outage.reader.pid]
    assert {blocked[app.pid][0] for app in outage.apps} == {outage.ddl.pid}
    assert all(len(blocked[app.pid]) == 1 for app in outage.apps)
    (queue,) = Diagnosis(take_snapshot(cluster.dsn(), 5, "all"), Registry()).graph.queues()
    assert (queue.waiter, queue.holders) == (outage.ddl.pid, (outage.reader.pid,))
    assert sorted(queue.queued) == sorted(app.pid for app in outage.apps)


def test_check_names_the_waiting_ddl_and_its_cancel_first(cluster: Cluster, outage: Outage) -> None:
    ddl, reader = outage.ddl.pid, outage.reader.pid
    args = ["check", "--dsn", cluster.dsn(), "--wait-age", "0s"]
    document = json.loads(invoke(*args, "--format", "json"))
    (queue,) = [f for f in document["findings"] if f["kind"] == "lock-queue"]
    assert (queue["pid"], queue["value"], queue["lock"]) == (ddl, APPS, "relation public.orders")
    assert f"held by pid {reader}; {APPS} session(s) wait behind its request" in queue["evidence"]
    step = queue["next_step"]
    assert step.startswith(f"cancel its wait first: lockdiag terminate {ddl} --cancel frees")
    assert "SET lock_timeout" in step and step.endswith(f"then see to the holder, pid {reader}")
    (cause,) = document["causes"]
    assert cause["pid"] == reader and cause["blocked"] == APPS + 1
    text = invoke(*args, "--format", "plain").splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("  first: "))
    then = next(i for i, line in enumerate(text) if line.startswith("  then: "))
    assert first < then, text


def test_check_on_a_terminal_keeps_the_way_out_and_the_other_causes(
    cluster: Cluster, outage: Outage, sessions: Sessions
) -> None:
    """80x24: the queue's way out is on screen, and so is another cause's heading."""
    other = sessions.open("job", autocommit=False)
    other.run("SELECT pg_advisory_lock(77, 1)")
    waiter = sessions.open("job-2")
    waiter.start("SELECT pg_advisory_lock(77, 1)")
    sessions.waiting(waiter)
    args = ["check", "--dsn", cluster.dsn(), "--wait-age", "0s", "--idle-age", "0s"]
    screen = screen_of(args, (24, 80), codes=(1, 2))
    text = "\n".join(screen)
    assert f"lockdiag terminate {outage.ddl.pid} --cancel" in text.replace("\n", " "), text
    first = next(i for i, line in enumerate(screen) if line.startswith("  first: "))
    then = next(i for i, line in enumerate(screen) if line.startswith("  then: "))
    assert first < then, text  # the quick way out, then the holder
    assert any(f"pid {other.pid} (job)" in line for line in screen[then:]), text


def test_blockers_names_the_queue_under_its_root(cluster: Cluster, outage: Outage) -> None:
    text = invoke("blockers", "--dsn", cluster.dsn(), "--format", "plain")
    lines = text.splitlines()
    assert lines[1].startswith(f"  queue: pid {outage.ddl.pid} (deploy) waits for AccessExclusive")
    assert lines[2].startswith(
        f"  first: cancel its wait first: lockdiag terminate {outage.ddl.pid}"
    )
    document = json.loads(invoke("blockers", "--dsn", cluster.dsn(), "--format", "json"))
    (queue,) = document["queues"]
    assert queue["waiter"] == outage.ddl.pid and len(queue["queued"]) == APPS


def test_the_advised_cancel_frees_the_queue_at_once(cluster: Cluster, outage: Outage) -> None:
    """The advice, followed: the DDL's wait cancelled, every application query completes while
    the reader still holds its lock."""
    result = CliRunner().invoke(
        cli, ["terminate", str(outage.ddl.pid), "--cancel", "--yes", "--dsn", cluster.dsn()]
    )
    assert result.exit_code == 0 and "its query stopped" in result.stdout, result.stdout
    assert all(app.done(10) and app.error is None for app in outage.apps)
    assert outage.ddl.done(10) and isinstance(outage.ddl.error, psycopg.errors.QueryCanceled)
    assert outage.reader.connection.info.transaction_status.name == "INTRANS"


def test_who_holds_names_an_exclusive_request_that_shared_ones_queue_behind(
    cluster: Cluster, sessions: Sessions
) -> None:
    """The same queue on an advisory key: a shared holder, an exclusive request waiting, and
    shared requests queued behind it (compatible with the holder, not with the request)."""
    holder = sessions.open("reader")
    holder.run("SELECT pg_advisory_lock_shared(5, 5)")
    writer = sessions.open("writer")
    writer.start("SELECT pg_advisory_lock(5, 5)")
    sessions.waiting(writer)
    readers = []
    for number in range(3):
        reader = sessions.open(f"reader-{number}")
        reader.start("SELECT pg_advisory_lock_shared(5, 5)")
        sessions.waiting(reader)
        readers.append(reader)
    args = ["who-holds", "--key", "5,5", "--dsn", cluster.dsn()]
    lines = invoke(*args, "--format", "plain").splitlines()
    first = f"first: cancel its wait first: lockdiag terminate {writer.pid} --cancel frees the 3"
    assert lines[2].startswith(f"queue: pid {writer.pid} (writer) waits for Exclusive on ")
    assert lines[3].startswith(first), lines
    assert lines[4].startswith("then: "), lines
    document = json.loads(invoke(*args, "--format", "json"))
    assert document["queue"] == lines[2:4]
