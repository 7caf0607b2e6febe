"""Full dumps stream: the snapshot's rows arrive a batch at a time (never the whole result in
the client), and plain text is written as it is made (never the whole table as one string),
with the same answer as before."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pytest

from lockdiag.core import catalogue
from lockdiag.demo.cluster import Cluster
from lockdiag.pg import capture as capturing
from lockdiag.pg import queries
from lockdiag.render import CHUNK, Output, Table, Text, plain, render

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
            params = {"all_types": False, "names": [], "software_tables": catalogue.SIGN_TABLES}
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
