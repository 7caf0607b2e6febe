"""A dump written from the aggregated read with each span's keys (core.expansion) is the full
read's dump, byte for byte, in every form, filtered or not: on a real server whose backends
hold thousands of locks in the shapes that make the order hard (keys of one space held by
several backends, shared and exclusive by one backend, pair objids and classids on both sides
of zero, keys somebody waits for inside a span, listed keys inside a span, small groups).

Both reads run in one transaction, so now() and pg_stat_activity are the same for both, and
the locks stand still (see tests/test_aggregated.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from lockdiag.core import snapshot_file
from lockdiag.core.analysis import Filters
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.expansion import Run, in_order
from lockdiag.core.model import Aggregated, Snapshot
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.pg import capture as capturing
from lockdiag.pg import session as session_module
from lockdiag.pg.capture import capture
from lockdiag.registry import Namespace, Registry
from lockdiag.render import Output, render
from lockdiag.views.listing import fleet_list_output, list_output

from helpers.cli import run
from helpers.servers import Sessions, create_database

REGISTRY = Registry.of(
    [
        Namespace(name="tenant_summary", id=7, form="pair"),
        Namespace(name="batch", id=9, form="bigint"),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[Cluster]:
    cluster = create_cluster(settings={"max_locks_per_transaction": "1024"})
    try:
        with Sessions(cluster) as sessions:
            a, b, c = (sessions.open(f"bulk-{n}") for n in "abc")
            # a: a named pair space on both sides of zero, and a named bigint space
            a.run("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(-1500, 3000) g")
            a.run(
                "SELECT count(pg_advisory_lock(9::bigint << 32 | g)) FROM generate_series(1, 900) g"
            )
            # b and c: the same keys shared, so their spans interleave key by key, a holding
            # them shared too; a holds some keys both shared and exclusive
            for worker in (a, b, c):
                worker.run(
                    "SELECT count(pg_advisory_lock_shared(7, g)) FROM generate_series(5000, 6000) g"
                )
            a.run("SELECT count(pg_advisory_lock_shared(7, g)) FROM generate_series(7000, 7200) g")
            a.run("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(7100, 7300) g")
            # d: unregistered bigint keys with keys waited for inside (and the catalogue's
            # listed keys 1, 2 and 4004 among them), negative bigints (classid 2**32 - 1),
            # an unregistered pair whose classid and objids cross zero
            d = sessions.open("bulk-d")
            d.run("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 5000) g")
            d.run("SELECT count(pg_advisory_lock(g)) FROM generate_series(-700, -1) g")
            d.run("SELECT count(pg_advisory_lock(-5, g)) FROM generate_series(-300, 300) g")
            # e: a small group, sent as its rows
            e = sessions.open("small-e", autocommit=False)
            e.run("SELECT count(pg_advisory_xact_lock(-5, g)) FROM generate_series(1000, 1010) g")
            waiters = [sessions.open(f"waiter-{n}") for n in range(3)]
            keys = ["pg_advisory_lock(2500)", "pg_advisory_lock(2500)", "pg_advisory_lock(7, 100)"]
            for waiter, key in zip(waiters, keys, strict=True):
                waiter.start(f"SELECT {key}")
            sessions.waiting(*waiters)
            yield cluster
    finally:
        cluster.destroy()


def both(cluster: Cluster, all_types: bool = False) -> tuple[Snapshot, Snapshot]:
    """The full read and the dump's read, in one transaction: the same server state."""
    with (
        psycopg.connect(cluster.dsn(), autocommit=True) as connection,
        connection.transaction(),
    ):
        full = capture(connection, "test", "all" if all_types else "advisory")
        part = capture(connection, "test", Aggregated(all_types=all_types, members=True), [],
                       REGISTRY)  # fmt: skip
    return full, part


def text(output: Output, fmt: str) -> str:
    stream = io.StringIO()
    render(output, fmt, stream)
    return stream.getvalue()


def test_the_read_gives_each_spans_keys(server: Cluster) -> None:
    full, part = both(server)
    assert len(full.locks) > 15_000
    assert len(part.locks) < 100  # the bulk in spans
    assert sum(r.keys for r in part.locks) == len(full.locks)
    spans = [r for r in part.locks if r.keys > 1]
    assert len(part.members) == len(spans) >= 8
    for row in spans:
        objids = part.members[(row.pid, row.database, row.mode, row.objsubid, row.classid)]
        assert len(objids) == row.keys and objids == sorted(objids)
    # the answers' read leaves the keys out
    with psycopg.connect(server.dsn(), autocommit=True) as connection:
        assert capture(connection, "test", Aggregated(all_types=False)).members == {}


FILTERS = {
    "none": Filters(),
    "namespace": Filters(namespace=REGISTRY.namespace("tenant_summary")),
    "pid": "pid",
    "app": Filters(app="bulk-[bc]"),
    "waiting": Filters(waiting=True),
    "min-age": Filters(min_age=0.0),
}


@pytest.mark.parametrize("fmt", ["plain", "json", "csv", "markdown"])
@pytest.mark.parametrize("chosen", list(FILTERS))
def test_the_dump_is_the_full_reads(server: Cluster, fmt: str, chosen: str) -> None:
    full, part = both(server)
    filters = FILTERS[chosen]
    if not isinstance(filters, Filters):  # the backend holding keys on both sides of zero
        pid = next(r.pid for r in full.locks if r.objid == 2**32 - 1500)
        assert pid is not None
        filters = Filters(pids=frozenset({pid}))
    reports = [Diagnosis(s, REGISTRY).listing(filters) for s in (full, part)]
    assert len(reports[1].entries) < len(reports[0].entries) or chosen == "waiting"
    dumps = [text(list_output(report), fmt) for report in reports]
    assert dumps[0] == dumps[1]
    assert dumps[0].count("bulk-") > (1 if chosen == "waiting" else 1000)


def test_a_fleets_dump_is_the_full_reads(server: Cluster) -> None:
    full, part = both(server)
    for fmt in ("json", "plain"):
        dumps = [
            text(
                fleet_list_output(
                    [
                        ("one", Diagnosis(s, REGISTRY).listing()),
                        ("two", Diagnosis(s, Registry()).listing()),
                    ],
                    [("three", "connection refused")],
                ),
                fmt,
            )
            for s in (full, part)
        ]
        assert dumps[0] == dumps[1]


def test_every_lock_type(server: Cluster) -> None:
    full, part = both(server, all_types=True)
    reports = [Diagnosis(s, REGISTRY).listing(all_types=True) for s in (full, part)]
    for fmt in ("json", "plain"):
        dumps = [text(list_output(report), fmt) for report in reports]
        assert dumps[0] == dumps[1]
        assert "virtualxid" in dumps[0]


def test_runs_are_bounded_and_in_order(server: Cluster) -> None:
    _, part = both(server)
    entries = Diagnosis(part, REGISTRY).listing().entries
    pieces = list(in_order(entries, part, most=100))
    runs = [p for p in pieces if isinstance(p, Run)]
    assert runs and all(0 < len(r.objids) <= 100 for r in runs)
    # the shared keys of b and c alternate a lock at a time: one-lock runs
    assert sum(len(r.objids) == 1 for r in runs) > 1000
    assert sum(len(r.objids) for r in runs) + len(pieces) - len(runs) == sum(
        e.lock.keys for e in entries
    )


def test_a_key_a_softwares_row_names_is_named_in_a_dump(server: Cluster) -> None:
    """Where a software's table names keys by its rows (Que's jobs: a key is a job's id), the
    dump reads every lock as a row, as before spans: the rows name each key (a span's entry
    says only what its first key is)."""
    create_database(
        server,
        "quedb",
        "CREATE TABLE public.que_jobs (id bigint PRIMARY KEY); "
        "INSERT INTO public.que_jobs SELECT generate_series(1, 300)",
    )
    with Sessions(server) as sessions:
        worker = sessions.open("que-worker", dbname="quedb")
        worker.run("SELECT count(pg_advisory_lock(g)) FROM generate_series(101, 400) g")
        found = run("list", "--format", "json", "--pid", str(worker.pid),
                    "--dsn", server.dsn(dbname="quedb"))  # fmt: skip
    assert found.exit_code == 0, found.stderr
    known = {lock["key"][0]: lock["known"] for lock in json.loads(found.stdout)["locks"]}
    assert len(known) == 300
    assert all(known[key] and "Que" in known[key]["software"] for key in range(101, 301))
    assert not any(known[key] for key in range(301, 401))


def test_the_snapshot_file_holds_every_lock_of_the_full_read(server: Cluster) -> None:
    """`snapshot` writes the dump's read: every lock the full read has, a span's as its
    locks (in its keys' order, pg_locks' order being no order), and the rest of the file the
    same; read back, every answer is the full read's."""
    for all_types in (False, True):
        full, part = both(server, all_types)
        files = [json.loads(snapshot_file.dumps(s, REGISTRY)) for s in (full, part)]
        locks = [sorted(f.pop("locks"), key=json.dumps) for f in files]
        assert locks[0] == locks[1]
        assert files[0] == files[1]
        assert len(locks[0]) == len(full.locks)
        loaded = snapshot_file.loads(snapshot_file.dumps(part, REGISTRY))
        assert loaded.members == {} and all(lock.keys == 1 for lock in loaded.locks)
        dumps = [
            text(list_output(Diagnosis(s, REGISTRY).listing()), "plain") for s in (full, loaded)
        ]
        assert dumps[0] == dumps[1]


@pytest.mark.parametrize(
    ("args", "members"),
    [
        (["list", "--format", "json"], True),
        (["list", "--format", "plain", "--app", "bulk-*"], True),
        (["list", "--format", "csv", "--all"], True),
        (["snapshot", "-o", "-"], True),
        (["check", "--format", "json"], False),
    ],
)
def test_the_dumps_read_spans_with_their_keys(
    server: Cluster, monkeypatch: pytest.MonkeyPatch, args: list[str], members: bool
) -> None:
    """Each dump reads the spans with their keys, and writes every lock of them; an answer
    reads spans without."""
    scopes: list[object] = []
    real = capturing.capture

    def recorded(*given: Any, **named: Any) -> Snapshot:
        scopes.append(given[2])
        return real(*given, **named)

    monkeypatch.setattr(session_module, "capture", recorded)
    found = run(*args, "--dsn", server.dsn())
    assert found.exit_code in (0, 1, 2), found.stderr
    assert [isinstance(s, Aggregated) and s.members for s in scopes] == [members]
    if args[0] == "snapshot":  # every lock a record
        assert found.stdout.count('"locktype": "advisory"') > 15_000
    elif args[0] == "list":
        assert found.stdout.count("bulk-d") >= 5000 + 700 + 601  # every lock of d's spans


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_on_a_terminal_is_the_full_reads_indented(server: Cluster) -> None:
    """On a terminal JSON comes whole and indented: a run's items are each an item there too."""
    full, part = both(server)
    pages = []
    for snapshot in (full, part):
        stream = Terminal()
        render(list_output(Diagnosis(snapshot, REGISTRY).listing()), "json", stream)
        pages.append(stream.getvalue())
    assert pages[0] == pages[1]
    assert len(json.loads(pages[1])["locks"]) == len(full.locks)
