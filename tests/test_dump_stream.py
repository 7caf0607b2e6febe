"""Full dumps stream: the snapshot's rows arrive a batch at a time (never the whole result in
the client), and plain text is written as it is made (never the whole table as one string),
with the same answer as before."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from lockdiag.core import ahead
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import LockRow
from lockdiag.core.sort_key import sort_key
from lockdiag.demo.cluster import Cluster
from lockdiag.pg import capture as capturing
from lockdiag.pg import queries
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Registry
from lockdiag.render import CHUNK, Block, Output, SharedRows, Table, Text, markdown, plain, render
from lockdiag.views.listing import fleet_list_output, list_output

from helpers.servers import OTHER_DB, Sessions

LOCKS = 5000  # more than two batches of capture.BATCH


class Writes(io.StringIO):
    """A pipe that remembers the size of each write."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, text: str) -> int:
        self.sizes.append(len(text))
        return super().write(text)


def test_plain_is_written_a_chunk_at_a_time_and_reads_the_same() -> None:
    rows = [[f"lock {i}", "held", str(1000 + i % 7)] for i in range(3 * CHUNK)]
    blocks: list[Table | Text] = [
        Text(["before"]),
        Table(["LOCK", "STATUS", "PID"], rows),
        Text(["after"]),
    ]
    pipe = Writes()
    render(Output(lambda: blocks, dict), "plain", pipe)
    assert pipe.getvalue() == plain(blocks)
    assert len(pipe.sizes) == 4  # 3 * CHUNK + 3 lines (header, before, after)
    assert max(pipe.sizes) < len(pipe.getvalue()) / 3


def test_the_snapshot_is_streamed_in_batches_with_every_row(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as holder:
        holder.execute("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, %s) g",
                       (LOCKS,))  # fmt: skip
        with psycopg.connect(cluster.dsn(), autocommit=True) as reader:
            sql = queries.query("snapshot", reader.info.server_version)
            params = {"all_types": False, "names": [], **ahead.probe_params()}
            whole = reader.execute(sql.encode(), params).fetchall()  # the result held whole
            sizes: list[int] = []
            streamed = psycopg.Cursor.stream

            def stream(cursor: psycopg.Cursor[Any], *args: Any, **kwargs: Any) -> Any:
                for row in streamed(cursor, *args, **kwargs):
                    sizes.append(cursor.pgresult.ntuples if cursor.pgresult else 0)  # its chunk's
                    yield row

            def execute(*_: Any, **__: Any) -> Any:
                raise AssertionError("the snapshot query's result was fetched whole")

            monkeypatch.setattr(psycopg.Cursor, "stream", stream)
            monkeypatch.setattr(psycopg.Cursor, "execute", execute)
            taken = capturing.capture(reader, "test")
    locks = [row for row in whole if row[0] == "lock"]
    assert len(taken.locks) == len(locks) >= LOCKS
    assert [tuple(lock[:8]) for lock in taken.locks] == [tuple(row[1:9]) for row in locks]
    assert set(taken.sessions) == {row[18]["pid"] for row in whole if row[0] == "session"}
    assert max(sizes) <= capturing.BATCH  # never more than a batch of rows in the client


# -- a dump's rows: a label and its backend's row -------------------------------------------


def _whole(blocks: list[Block]) -> list[Block]:
    """The same blocks with every table's rows made whole (the general alignment)."""
    return [replace(b, rows=list(b.rows)) if isinstance(b, Table) else b for b in blocks]


@pytest.mark.parametrize(
    ("column", "cells"),
    [(0, ["", "held", "12"]), (1, ["a", "", "12"]), (2, ["a", "held", ""]), (1, ["", "", ""])],
)
def test_shared_rows_align_as_the_whole_rows(column: int, cells: list[str]) -> None:
    backend, other = cells, [c and c + "-long-cell" for c in cells]
    rows = SharedRows(column)
    for index, label in enumerate(["x", "a far longer label than the header", "", "y y"]):
        rows.add(label, backend if index % 2 else other)
    rows.add("w", ["waits", "WAITING", "13"])
    blocks: list[Block] = [Table(["LOCK", "STATUS", "PID"], rows)]
    assert plain(blocks) == plain(_whole(blocks))
    assert len(rows) == 5 and rows[1][column] == "a far longer label than the header"


def test_a_dump_of_a_real_server_reads_as_the_whole_rows(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Every column that can be there (a fleet's TARGET, DATABASE: the label third), locks of
    one backend in both forms, another database's, a holder and its waiter, in plain, CSV and
    Markdown: the shared rows give the text the whole rows give."""
    sessions.open("many").run("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, 300) g")
    sessions.open("bigints").run("SELECT count(pg_advisory_lock(g)) FROM generate_series(-5, 5) g")
    sessions.open("elsewhere", dbname=OTHER_DB).run("SELECT pg_advisory_lock(4102, 1)")
    sessions.open("holder").run("SELECT pg_advisory_lock(4102, 7)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 7)")
    sessions.waiting(waiter)
    names = Registry()
    with DiagnosticSession(cluster.dsn(), 30.0, names) as session:
        taken = session.snapshot("advisory")
    listing = Diagnosis(taken, names).listing()
    for output in (list_output(listing), fleet_list_output([("a", listing), ("b", listing)], [])):
        blocks = output.blocks()
        table = next(b for b in blocks if isinstance(b, Table))
        assert isinstance(table.rows, SharedRows) and len(table.rows) >= 314
        assert plain(blocks) == plain(_whole(blocks))
        assert markdown(blocks) == markdown(_whole(blocks))
        assert _csv(blocks) == _csv(_whole(blocks))


def _csv(blocks: list[Block]) -> str:
    pipe = io.StringIO()
    render(Output(lambda: blocks, dict), "csv", pipe)
    return pipe.getvalue()


# -- a dump's order: one packed int per lock (core.sort_key) -------------------------------


def _row(
    locktype: str,
    database: int | None,
    numbers: tuple[int, ...],
    waiter: bool,
    start: datetime | None,
    pid: int | None,
    mode: str = "ExclusiveLock",
) -> LockRow:
    classid, objid, objsubid, relation = numbers
    return LockRow(
        locktype,
        database,
        relation or None,
        None,
        None,
        None,
        None,
        classid if locktype == "advisory" else None,
        objid if locktype == "advisory" else None,
        objsubid if locktype == "advisory" else None,
        None,
        pid,
        mode,
        not waiter,
        start if waiter else None,
    )


def _tuple_order(row: LockRow, rank: dict[str, int]) -> tuple[object, ...]:
    """The order sort_key packs, as the tuple it stands for."""
    advisory = row.locktype == "advisory"
    place = (row.objsubid or 0, row.classid, row.objid) if advisory else (0, 0, row.relation or 0)
    waiter = not row.granted
    start = row.waitstart.timestamp() * 1e6 if row.waitstart else float("inf")
    return (
        row.database or 0,
        rank[row.locktype],
        *place,
        waiter,
        start if waiter else 0,
        row.pid or 0,
        0 if waiter else MODES.index(row.mode),
    )


MODES = ("AccessShareLock", "ShareLock", "ExclusiveLock", "AccessExclusiveLock", "SIReadLock", "?")


def test_the_packed_sort_key_orders_as_the_tuple_at_every_edge() -> None:
    """Fields at their largest (oids and objids of 2**32 - 1, pids of 2**31 - 1, a wait start
    far ahead) never spill into the field above: the packed order is the tuple's, a holder's
    modes (an unknown one last) included."""
    top, pid_top = 2**32 - 1, 2**31 - 1
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    starts = [None, start, start + timedelta(microseconds=1), start + timedelta(days=36500)]
    numbers = [(0, 0, 1, 0), (0, top, 1, 0), (1, 0, 1, 0), (top, top, 1, 0), (0, top, 2, top)]
    numbers += [(top, 0, 2, 1), (1, 1, 1, top)]
    rows = [
        _row(locktype, database, number, waiter, when, pid)
        for locktype in ("advisory", "relation", "transactionid")
        for database in (None, 0, 1, top)
        for number in numbers
        for waiter in (False, True)
        for when in (starts if waiter else [None])
        for pid in (None, 1, pid_top)
    ]
    # one backend holding one lock in several modes: by mode, weakest first
    rows += [row._replace(mode=mode) for row in rows[::5] if row.granted for mode in MODES]
    rank = {name: n for n, name in enumerate(sorted({r.locktype for r in rows}))}
    packed = sorted(rows, key=lambda row: sort_key(row, rank))
    assert packed == sorted(rows, key=lambda row: _tuple_order(row, rank))
