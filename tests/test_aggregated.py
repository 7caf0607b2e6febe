"""The read of the waits (every lock of the backends in a wait, no other) gives `blockers` the
full read's answer, and the aggregated read (uncontested locks as spans) gives check,
who-holds and the exporter's series the full read's diagnosis, on a real server holding 100k
uncontested locks and under churn.

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
from lockdiag.core.model import Aggregated, Scope, Snapshot
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.keys import LockTriple
from lockdiag.pg.capture import capture
from lockdiag.registry import Namespace, Registry
from lockdiag.render import Output, render
from lockdiag.views.blockers import blockers_output
from lockdiag.views.check import check_metrics
from lockdiag.views.who_holds import verdict

BULK = 100_000  # uncontested locks of a backend nobody waits on
KNOWN_BULK = 5_000  # bigint keys 1..5000, unregistered but for Airflow's 1 and 2, Marten's 4004
# the bulk worker's keys (7, n) are tenant_summary's; it holds 5 of tenant_period's too
REGISTRY = Registry.of(
    [
        Namespace(name="tenant_summary", id=7, form="pair"),
        Namespace(name="tenant_period", id=8, form="pair"),
    ]
)


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
        bulk.execute("SELECT count(pg_advisory_lock(8, g)) FROM generate_series(1, 5) g")
        known = scenario.open("known-bulk")
        known.execute(
            "SELECT count(pg_advisory_lock(g)) FROM generate_series(1, %s) g", (KNOWN_BULK,)
        )
        scenario.open("idle-holder").execute("SELECT pg_advisory_lock(100555)")
        leaker = scenario.open("billing-worker")
        leaker.execute("SELECT pg_advisory_lock(102041), pg_advisory_lock(109000)")
        for number in range(4):
            scenario.wait(f"pdf-{number}", "SELECT pg_advisory_lock(109000)")
        stuck = scenario.open("stuck", autocommit=False)
        stuck.execute("SELECT pg_advisory_xact_lock(100077)")
        scenario.wait("stuck-waiter", "SELECT pg_advisory_lock(100077)")
        scenario.open("chain-a").execute("SELECT pg_advisory_lock(100101)")
        scenario.wait("chain-b", "SELECT pg_advisory_lock(100102), pg_advisory_lock(100101)")
        scenario.until_waiting(6)
        scenario.wait("chain-c", "SELECT pg_advisory_lock(100102)")
        table = scenario.open("table-d", autocommit=False)
        table.execute("LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE")
        scenario.wait(
            "table-e", "BEGIN; SELECT pg_advisory_xact_lock(100301); SELECT * FROM ledger"
        )
        scenario.until_waiting(8)
        scenario.wait("table-f", "SELECT pg_advisory_lock(100301)")
        scenario.until_waiting(9)
        time.sleep(0.3)  # every holder idle since before the reads (a certain lower bound)
        yield cluster
    finally:
        scenario.close()
        cluster.destroy()


def both(
    cluster: Cluster, focused: Scope, registry: Registry | None = None
) -> tuple[Snapshot, Snapshot]:
    """The full read and ``focused``, in one transaction: the same server state (a read of
    the waits is a snapshot of every lock type)."""
    with (
        psycopg.connect(cluster.dsn(), autocommit=True) as connection,
        connection.transaction(),
    ):
        full = capture(connection, "test", "all")
        part = capture(connection, "test", focused, registry=registry)
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


def same_diagnosis(full: Snapshot, part: Snapshot, registry: Registry) -> None:
    """The answers check, who-holds and the exporter give: equal from both reads."""
    diagnoses = [Diagnosis(s, registry) for s in (full, part)]
    incidents = [d.incident(CheckPolicy()) for d in diagnoses]
    findings = [
        [(f.kind, f.severity, f.pid, f.value, f.locks) for f in i.report.findings]
        for i in incidents
    ]
    assert findings[0] == findings[1]
    assert incidents[0].status == incidents[1].status
    series = [
        [(m.name, sorted(m.samples)) for m in check_metrics(i) if m.name != "lockdiag_up"]
        for i in incidents
    ]
    assert series[0] == series[1]
    census = [i.report.census.advisory for i in incidents]
    assert census[0] == census[1]
    keys = {e.decoded.triple for e in diagnoses[0].advisory if e.decoded and not e.lock.granted}
    keys |= {LockTriple.of_row(0, 1, 1), LockTriple.of_row(0, 4004, 1)}  # listed: sent singly
    for key in sorted(keys):
        reads = [capture_who_holds(d, key) for d in diagnoses]
        assert reads[0] == reads[1], key


def capture_who_holds(diagnosis: Diagnosis, key: LockTriple) -> tuple[object, ...]:
    report = diagnosis.who_holds(key)
    return (
        verdict(report),
        [e.lock.pid for e in report.holders],
        [e.lock.pid for e in report.waiters],
    )


def test_the_aggregated_read_gives_the_full_reads_diagnosis(server: Cluster) -> None:
    full, part = both(server, Aggregated(), REGISTRY)
    assert len(full.locks) > BULK + KNOWN_BULK
    assert len(part.locks) < 200  # the bulk in spans
    assert part.sessions == full.sessions and part.server == full.server
    assert part.scope == full.scope == "all"
    same_diagnosis(full, part, REGISTRY)


@pytest.mark.parametrize("key", [LockTriple.of_row(7, 500, 2), LockTriple.of_row(0, 9, 1)])
def test_who_holds_reads_its_key_singly(server: Cluster, key: LockTriple) -> None:
    full, part = both(server, Aggregated(key=key), REGISTRY)
    (row,) = [r for r in part.locks if r.advisory_key == key]
    assert row.keys == 1
    assert capture_who_holds(Diagnosis(part, REGISTRY), key) == capture_who_holds(
        Diagnosis(full, REGISTRY), key
    )
    assert "bulk" in verdict(Diagnosis(part, REGISTRY).who_holds(key))


def test_a_span_is_labelled_and_counted(server: Cluster) -> None:
    _, part = both(server, Aggregated(), REGISTRY)
    entries = Diagnosis(part, REGISTRY).advisory
    spans = {e.decoded.label: e.lock.keys for e in entries if e.lock.keys > 1 and e.decoded}
    # the well-known keys inside the unregistered range come singly, the range around them
    # as one span; 5 keys of tenant_period, fewer than GROUP_MIN, as rows
    assert spans == {
        "tenant_summary 1..100000 (100,000 keys)": BULK,
        "unregistered bigint 3..5000 (4,997 keys)": KNOWN_BULK - 3,
    }
    singles = {e.decoded.label for e in entries if e.lock.pid and e.decoded and e.lock.keys == 1}
    assert {"tenant_period 1", "tenant_period 5"} <= singles
    known = {e.decoded.triple for e in entries if e.decoded and e.decoded.known}
    assert known == {
        LockTriple.of_row(0, 1, 1),
        LockTriple.of_row(0, 2, 1),
        LockTriple.of_row(0, 4004, 1),
    }


def test_churn_keeps_the_certainties(server: Cluster) -> None:
    """Sessions take and release spans of transaction locks (and wait on each other) while
    aggregated reads run: no read calls a transaction lock a certain session lock, and every
    read counts the bulk worker's locks exactly, however the churn falls."""
    stop = threading.Event()

    def churn(name: str) -> None:
        with psycopg.connect(server.dsn(application_name=name)) as connection:
            while not stop.is_set():
                with connection.transaction():
                    connection.execute(
                        "SELECT count(pg_advisory_xact_lock(9, g)) FROM generate_series(1, 300) g"
                    )
                    connection.execute("SELECT pg_advisory_xact_lock(10, 1), pg_sleep(0.005)")

    threads = [threading.Thread(target=churn, args=(f"churn-{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        with psycopg.connect(server.dsn(), autocommit=True) as connection:
            for _ in range(15):
                taken = capture(connection, "test", Aggregated(), registry=REGISTRY)
                diagnosis = Diagnosis(taken, REGISTRY)
                report = diagnosis.incident(CheckPolicy()).report
                churned = [
                    e
                    for e in diagnosis.advisory
                    if e.session and (e.session.application_name or "").startswith("churn-")
                ]
                assert not [e for e in churned if e.lifetime == "session"]
                assert report.census.advisory[("postgres", "tenant_summary", "held")] == BULK
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
