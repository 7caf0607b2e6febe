"""The read of the waits (every lock of the backends in a wait, no other) gives `blockers` the
full read's answer, on a real server holding 100k uncontested locks.

Both reads run in one transaction: now() and pg_stat_activity are the transaction's (read once
per transaction), and the locks stand still, so the two reads see the same server state and
their answers must be equal, line for line and in JSON.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.model import Scope, Snapshot
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.pg.capture import capture
from lockdiag.registry import Registry
from lockdiag.render import Output, render
from lockdiag.views.blockers import blockers_output

BULK = 100_000  # uncontested locks of a backend nobody waits on


class Scenario:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.connections: list[psycopg.Connection[Any]] = []
        self.threads: list[threading.Thread] = []

    def open(self, name: str, autocommit: bool = True) -> psycopg.Connection[Any]:
        connection = psycopg.connect(self.cluster.dsn(application_name=name), autocommit=autocommit)
        self.connections.append(connection)
        return connection

    def wait(self, name: str, sql: str) -> None:
        connection = self.open(name)

        def run() -> None:
            with contextlib.suppress(psycopg.Error):  # ended at teardown
                connection.execute(sql.encode())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def until_waiting(self, count: int) -> None:
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND waitstart IS NOT NULL"
                ).fetchone()
                if row is not None and row[0] >= count:
                    return
                time.sleep(0.02)
        raise AssertionError(f"fewer than {count} waiters after 30 s")

    def close(self) -> None:
        pids = [c.info.backend_pid for c in self.connections]
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) p", (pids,))
        for thread in self.threads:
            thread.join(10)
        for connection in self.connections:
            connection.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Cluster]:
    """A messy incident beside 100k uncontested locks: a leaked session lock four sessions
    wait for, a holder idle in transaction, a three-level advisory chain, a table lock at
    the root of a chain that ends in an advisory wait, an idle holder nobody waits on."""
    cluster = create_cluster(settings={"max_locks_per_transaction": "1024"})
    scenario = Scenario(cluster)
    try:
        setup = scenario.open("setup")
        setup.execute("CREATE TABLE ledger (id int PRIMARY KEY)")
        setup.execute("INSERT INTO ledger VALUES (1)")
        bulk = scenario.open("bulk-worker")
        bulk.execute("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, %s) g", (BULK,))
        scenario.open("idle-holder").execute("SELECT pg_advisory_lock(555)")
        leaker = scenario.open("billing-worker")
        leaker.execute("SELECT pg_advisory_lock(2041), pg_advisory_lock(9000)")
        for number in range(4):
            scenario.wait(f"pdf-{number}", "SELECT pg_advisory_lock(9000)")
        stuck = scenario.open("stuck", autocommit=False)
        stuck.execute("SELECT pg_advisory_xact_lock(77)")
        scenario.wait("stuck-waiter", "SELECT pg_advisory_lock(77)")
        scenario.open("chain-a").execute("SELECT pg_advisory_lock(101)")
        scenario.wait("chain-b", "SELECT pg_advisory_lock(102), pg_advisory_lock(101)")
        scenario.until_waiting(6)
        scenario.wait("chain-c", "SELECT pg_advisory_lock(102)")
        table = scenario.open("table-d", autocommit=False)
        table.execute("LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE")
        scenario.wait("table-e", "BEGIN; SELECT pg_advisory_xact_lock(301); SELECT * FROM ledger")
        scenario.until_waiting(8)
        scenario.wait("table-f", "SELECT pg_advisory_lock(301)")
        scenario.until_waiting(9)
        time.sleep(0.3)  # every holder idle since before the reads (a certain lower bound)
        yield cluster
    finally:
        scenario.close()
        cluster.destroy()


def both(cluster: Cluster, focused: Scope) -> tuple[Snapshot, Snapshot]:
    """The full read and ``focused``, in one transaction: the same server state (a read of
    the waits is a snapshot of every lock type)."""
    with (
        psycopg.connect(cluster.dsn(), autocommit=True) as connection,
        connection.transaction(),
    ):
        full = capture(connection, "test", "all")
        part = capture(connection, "test", focused)
    return full, part


def text(output: Output, fmt: str) -> str:
    stream = io.StringIO()
    render(output, fmt, stream)
    return stream.getvalue()


@pytest.mark.parametrize("fmt", ["plain", "json", "markdown"])
def test_blockers_are_the_full_reads_without_the_bulk(server: Cluster, fmt: str) -> None:
    full, part = both(server, "waits")
    assert len(full.locks) > BULK
    assert len(part.locks) < 100  # the bulk worker and the idle holder are not read
    assert part.sessions == full.sessions and part.server == full.server
    assert part.scope == full.scope == "all"
    answers = [
        text(blockers_output(Diagnosis(s, Registry()).incident(CheckPolicy())), fmt)
        for s in (full, part)
    ]
    assert answers[0] == answers[1]
    assert "billing-worker" in answers[0] and "table-d" in answers[0]
