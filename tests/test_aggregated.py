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
import dataclasses
import io
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from lockdiag.core.analysis import SeenHeld, analyse
from lockdiag.core.catalogue.extensions import REPACK_LOCK_PREFIX
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.model import Aggregated, Scope, Snapshot
from lockdiag.core.observe import Episodes, Looks, Sampler
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.keys import LockTriple
from lockdiag.pg.capture import capture
from lockdiag.registry import Namespace, Registry
from lockdiag.render import Output, render
from lockdiag.views.blockers import blockers_output
from lockdiag.views.check import check_metrics
from lockdiag.views.who_holds import verdict

from helpers.snapshots import STARTED, advisory, session, snapshot

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
    """The full read and ``focused``, in one transaction: the same server state."""
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
    full, part = both(server, Aggregated())
    assert len(full.locks) > BULK
    assert len(part.locks) < 100  # the bulk worker's locks are one span
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


def test_a_space_sent_whole_comes_as_rows(cluster: Cluster) -> None:
    """pg_repack's prefix is a space whose every key is named alone: a backend's 100 keys in
    it (a span's worth) come as 100 rows, its 100 keys of an unnamed space as one span, and
    the diagnosis is the full read's."""
    holder = psycopg.connect(cluster.dsn(application_name="repack-like"), autocommit=True)
    try:
        holder.execute(
            f"SELECT count(pg_advisory_lock({REPACK_LOCK_PREFIX}, g)),"
            " count(pg_advisory_lock(13, g)) FROM generate_series(1, 100) g".encode()
        )
        full, part = both(cluster, Aggregated(), REGISTRY)
    finally:
        holder.close()
    mine = [r for r in part.locks if r.classid in (REPACK_LOCK_PREFIX, 13)]
    assert sorted((r.classid, r.keys) for r in mine) == sorted(
        [(REPACK_LOCK_PREFIX, 1)] * 100 + [(13, 100)]
    )
    same_diagnosis(full, part, REGISTRY)


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


# -- reads over time: the exporter's samplers and scrapes, watch and sample -------------------


# what one read of the exporter's sampler counts: ended holds, ended waits, acquisitions by
# namespace, namespaces contended
Counted = tuple[list[tuple[str, float]], list[tuple[str, float]], dict[str, int], set[str]]


class Follower:
    """What the exporter's sampler, sample and watch keep across reads of one server."""

    def __init__(self) -> None:
        self.looks, self.sampler, self.episodes = Looks(), Sampler(), Episodes()

    def read(self, snapshot: Snapshot) -> tuple[Diagnosis, Counted]:
        seen = self.looks.look(snapshot)
        diagnosis = Diagnosis(snapshot, REGISTRY, seen=seen)
        now = snapshot.server.now
        self.sampler.add(diagnosis.advisory, now, snapshot.query_seconds)
        tick = self.episodes.add(diagnosis.advisory, now)
        counted = (sorted(tick.holds), sorted(tick.waits), tick.acquired, tick.contended)
        return diagnosis, counted


def seen_by_key(diagnosis: Diagnosis) -> dict[tuple[object, ...], SeenHeld | None]:
    """Each granted lock's seen bound, by backend and key (a span's by its lowest key)."""
    return {
        (e.lock.pid, e.decoded.triple): e.seen
        for e in diagnosis.advisory
        if e.lock.granted and e.decoded is not None
    }


def test_reads_over_time_follow_the_same_holds(server: Cluster) -> None:
    """Three reads of each kind, each pair in one transaction: a newcomer takes a key, then
    releases it. The exporter's episodes, sample's statistics and the seen bounds are the
    full read's; a span stands for its keys (seen held since the same look, counted)."""
    full_reads, aggregated = Follower(), Follower()
    ticks = []
    newcomer = psycopg.connect(server.dsn(application_name="newcomer"), autocommit=True)
    try:
        for step in range(3):
            if step == 1:
                newcomer.execute("SELECT pg_advisory_lock(100777)")
            if step == 2:
                newcomer.execute("SELECT pg_advisory_unlock(100777)")
            full, part = both(server, Aggregated(), REGISTRY)
            (whole, ticked), (spanned, counted) = full_reads.read(full), aggregated.read(part)
            assert counted == ticked, step
            ticks.append(counted)
            expected, seen = seen_by_key(whole), seen_by_key(spanned)
            assert seen.items() <= expected.items()
            spans = [e for e in spanned.advisory if e.lock.keys > 1]
            assert len(spans) == 2 and all(e.seen is not None for e in spans)
    finally:
        newcomer.close()
    assert [t[2] for t in ticks] == [{}, {"unregistered": 1}, {}]  # the newcomer's hold
    assert [n for n, _ in ticks[2][0]] == ["unregistered"]  # ... and its end
    full_stats, stats = full_reads.sampler.keys, aggregated.sampler.keys
    (newcomers,) = [s for s in stats.values() if s.label.endswith(" 100777")]
    assert (newcomers.acquisitions, newcomers.releases) == (1, 1)
    singles = {key: s for key, s in stats.items() if s.keys == 1}
    assert singles == {key: full_stats[key] for key in singles}  # field by field
    # the bulk worker's dense span as its keys, the known bulk's (4004 apart) as one span
    in_spans = sum(s.keys for s in stats.values() if s.keys > 1)
    assert in_spans == KNOWN_BULK - 3 and len(singles) > BULK
    assert len(full_stats) == len(singles) + in_spans


def test_keys_moving_in_and_out_of_a_span(cluster: Cluster) -> None:
    """Two backends take 80 keys of a space (a span), release 30 (50 left: rows, fewer than
    GROUP_MIN), take 50 more (a span of 100): one takes keys 1..100, every key between the
    ends (a dense span: its keys are known), the other even keys 2..200 (a sparse span). The
    full read sees 30 releases each, then 50 acquisitions each. The aggregated read counts
    the dense span's keys as the full read does, and for the sparse one counts no
    acquisition, release or ended hold (which of its keys came or went is not known): never
    more than the full read. A changed span is seen held from the read that saw it so. On the
    shared cluster: the module's 100k bulk would only slow each read."""
    server = cluster
    full_reads, aggregated = Follower(), Follower()
    dense = psycopg.connect(server.dsn(application_name="dense"), autocommit=True)
    sparse = psycopg.connect(server.dsn(application_name="sparse"), autocommit=True)
    steps = [
        ("pg_advisory_lock(11, g)", "1, 80", "pg_advisory_lock(12, 2 * g)"),
        ("pg_advisory_unlock(11, g)", "51, 80", "pg_advisory_unlock(12, 2 * g)"),
        ("pg_advisory_lock(11, g)", "51, 100", "pg_advisory_lock(12, 2 * g)"),
    ]
    counts = []
    try:
        for on_dense, series, on_sparse in steps:
            for connection, call in ((dense, on_dense), (sparse, on_sparse)):
                sql = f"SELECT count({call}) FROM generate_series({series}) g"
                connection.execute(sql.encode())
            full, part = both(server, Aggregated(), REGISTRY)
            (whole, ticked), (spanned, counted) = full_reads.read(full), aggregated.read(part)
            counts.append((ticked, counted))
            expected = seen_by_key(whole)
            for key, seen in seen_by_key(spanned).items():  # never seen longer than full
                held = expected[key]
                assert seen is None or (held is not None and seen.since >= held.since)
            last = spanned
    finally:
        dense.close()
        sparse.close()
    acquired = [(t[2].get("unregistered", 0), c[2].get("unregistered", 0)) for t, c in counts]
    ended = [(len(t[0]), len(c[0])) for t, c in counts]
    assert acquired == [(0, 0), (0, 0), (100, 50)]
    assert ended == [(0, 0), (60, 30), (0, 0)]
    full_stats, stats = full_reads.sampler.keys, aggregated.sampler.keys
    dense_keys = {
        k: (s.acquisitions, s.releases) for k, s in stats.items() if "pair (11, " in s.label
    }
    assert dense_keys == {
        k: (full_stats[k].acquisitions, full_stats[k].releases) for k in dense_keys
    }
    assert len(dense_keys) == 100 and sum(a + r for a, r in dense_keys.values()) == 80
    moved = [s for s in stats.values() if "pair (12, " in s.label]
    assert sum(s.acquisitions + s.releases for s in moved) == 0
    (span,) = [e for e in last.advisory if e.lock.keys > 1 and e.lock.classid == 12]
    assert span.lock.keys == 100 and span.lock.sparse
    assert span.seen is not None and span.seen.since == last.snapshot.server.now


def test_a_sparse_span_starts_again_where_its_backend_ran_statements() -> None:
    """Odd keys 1..199 of a space (a span with gaps), then the same count and ends after
    its backend ran statements (5 released and 6 taken would look so): seen held starts
    again; idle since the look before, or dense (its keys are its ends and count), it
    keeps its first sight."""
    busy = session(7, "idle", timedelta(seconds=-0.2))
    sparse = advisory(7, 1, namespace=11)._replace(keys=100, objid_last=199)
    dense = advisory(7, 1, namespace=12)._replace(keys=199, objid_last=199)

    def seen_at(looks: Looks, minutes: int, changed: timedelta) -> dict[int | None, datetime]:
        now = STARTED + timedelta(minutes=minutes)
        first = snapshot([busy], [sparse, dense])
        taken = dataclasses.replace(
            first,
            server=dataclasses.replace(first.server, now=now),
            sessions={7: dataclasses.replace(busy, state_change=now + changed)},
        )
        return {
            e.lock.classid: e.seen.since
            for e in analyse(taken, Registry(), seen=looks.look(taken))
            if e.seen is not None
        }

    looks = Looks()
    assert seen_at(looks, 0, timedelta(seconds=-0.2)) == {11: STARTED, 12: STARTED}
    ran = seen_at(looks, 10, timedelta(seconds=-0.2))  # a statement since the look before
    assert ran == {11: STARTED + timedelta(minutes=10), 12: STARTED}
    idle = seen_at(looks, 20, timedelta(minutes=-10, seconds=-1))  # idle since before it
    assert idle == {11: STARTED + timedelta(minutes=10), 12: STARTED}


def test_blockers_read_a_bulk_blockers_other_locks_as_spans(server: Cluster) -> None:
    """Someone waits for one of the bulk worker's keys: blockers' aggregated read brings its
    100k other locks as a span, and the answer is the full read's in every format."""
    waiter = psycopg.connect(server.dsn(application_name="bulk-waiter"), autocommit=True)

    def run() -> None:
        with contextlib.suppress(psycopg.Error):  # ended below
            waiter.execute("SELECT pg_advisory_lock(8, 3)")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        Scenario(server).until_waiting(10)
        full, part = both(server, Aggregated(), REGISTRY)
    finally:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (waiter.info.backend_pid,))
        thread.join(10)
        waiter.close()
    assert len(full.locks) > BULK and len(part.locks) < 200
    assert [r.keys for r in part.locks if r.keys > 1 and r.classid == 7] == [BULK]
    for fmt in ("plain", "json", "markdown"):
        answers = [
            text(blockers_output(Diagnosis(s, REGISTRY).incident(CheckPolicy())), fmt)
            for s in (full, part)
        ]
        assert answers[0] == answers[1], fmt
        assert "bulk-waiter" in answers[0] and "bulk-worker" in answers[0]
