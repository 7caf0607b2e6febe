"""Capturing a snapshot: the one snapshot query.

:func:`capture` is the single round trip (pg_locks read once, pg_stat_activity, server facts);
what only the server (or a pooler) can add after it is :mod:`lockdiag.pg.enrichment`'s. The
query is built and sent without the catalogue (:mod:`lockdiag.core.ahead`), which is imported
while the server works and used once the rows are in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg

from lockdiag.core import ahead
from lockdiag.core.model import (
    Aggregated,
    LockRow,
    Scope,
    Session,
    Snapshot,
    Space,
    extent_of,
    space_of,
)
from lockdiag.core.records import build_record, server_info
from lockdiag.pg import queries
from lockdiag.pg.raw_text import Texts, undecodable_note
from lockdiag.registry import Registry

BATCH = 2000  # rows of the snapshot turned into records at a time
# an aggregated read's smallest span: a backend's smaller groups come as their rows, so that
# on a small lock table the read is the full read row for row (every answer the same, labels
# included) and a span only replaces a group worth the saving (a row costs some 10 us of
# Python across the read and the analysis: 64 rows are under a millisecond)
GROUP_MIN = 64
_ONE = (1, None)  # LockRow.keys and objid_last of a row that is one lock
# a dump's aggregated read (Aggregated.members): each group's objids gathered too
MEMBERS = (
    "NULL::pg_catalog.int8[] AS members",
    "pg_catalog.array_agg(s.objid::pg_catalog.int8) AS members",
)

# The columns of the snapshot queries (snapshot_*.sql, snapshot_aggregated_*.sql), in order: a
# row's kind ('lock', 'session', 'server'), a lock's LockRow fields up to blocked_by (a span's
# count and last key come in the detail), the name of its relation, and a JSON detail (a
# session, the server, a span). A hundred thousand lock rows are read by position (a LockRow
# made from a slice: see capture()); these are the positions, named, and
# tests/test_query_rows.py checks the names against each query's cursor.description.
LOCK_FIELDS = LockRow._fields[: LockRow._fields.index("blocked_by") + 1]
SNAPSHOT_COLUMNS = ("kind", *LOCK_FIELDS, "relation_name", "detail")
KIND = SNAPSHOT_COLUMNS.index("kind")
LOCK = slice(SNAPSHOT_COLUMNS.index(LOCK_FIELDS[0]), SNAPSHOT_COLUMNS.index(LOCK_FIELDS[-1]) + 1)
RELATION = SNAPSHOT_COLUMNS.index("relation")
RELATION_NAME = SNAPSHOT_COLUMNS.index("relation_name")
DETAIL = SNAPSHOT_COLUMNS.index("detail")


class Meanwhile(Protocol):
    """What goes on beside a read (lockdiag.evidence.overlap's imports): told when the query
    has gone out, and waited for once its rows are in, before what it imported is used."""

    def sent(self) -> None: ...

    def join(self) -> None: ...


def capture(
    connection: psycopg.Connection[Any],
    source: str,
    scope: Scope = "advisory",
    names: list[str] | None = None,
    registry: Registry | None = None,
    meanwhile: Meanwhile | None = None,
) -> Snapshot:
    """One query, one round trip: every lock (or every advisory lock, those of waits, or
    what an answer needs: :class:`Aggregated`) with its sessions, and the keys of ``names``
    as the server's hashtext() computes them. An aggregated read whose spans could hide a
    key the catalogue names alone (a database's, known only once read) is read again in
    full. Text that may be in another database's encoding comes as its bytes (raw_text.py); a
    text no encoding explains is shown with U+FFFD, and a note says where. ``meanwhile`` is
    told as the query goes out: from then until its rows come the client only waits (an
    answer's later imports, the catalogue's first, are made meanwhile), and waited for once
    the rows are in."""
    sql, params = _snapshot_query(connection.info.server_version, scope, registry or Registry())
    started = time.perf_counter()
    locks: list[LockRow] = []
    members: dict[Space, list[int]] = {}
    sessions: dict[int, Session] = {}
    server: dict[str, Any] = {}
    relations: dict[int, str] = {}  # their bytes in hex, decoded once the encoding is known
    texts = Texts()
    make = LockRow._make
    # the columns' positions as locals: the loop below runs once per lock
    kind_at, lock_at, relation_at, name_at, detail_at = KIND, LOCK, RELATION, RELATION_NAME, DETAIL
    with connection.cursor() as cursor:
        params.update(names=names or [], **ahead.probe_params())
        if meanwhile is not None:
            meanwhile.sent()
        for row in stream_rows(cursor, sql, params):
            kind = row[kind_at]
            if kind == "lock":
                span = row[detail_at]  # an aggregated read's span: {"count", "objid_last"}
                # the LockRow fields, in order (blocked_by last), then keys and objid_last
                lock = make(
                    row[lock_at] + (_ONE if span is None else (span["count"], span["objid_last"]))
                )
                if lock.blocked_by is not None:  # an array arrives as a list
                    lock = lock._replace(blocked_by=tuple(lock.blocked_by))
                elif span is not None and span["members"] is not None:
                    members[space_of(lock)] = sorted(span["members"])
                locks.append(lock)
                if row[name_at] is not None:
                    relations[row[relation_at]] = row[name_at]
            elif kind == "session":
                session = build_record(Session, texts.session(row[detail_at]), "session")
                sessions[session.pid] = session
            else:
                server = row[detail_at]
    # the whole read, rows turned into records included: streamed, the server goes on sending
    # after the first rows, and the pacing of watch, sample and the exporter must not count
    # a read as cheaper than it was (an overstatement only makes them read less often)
    elapsed = time.perf_counter() - started
    if meanwhile is not None:
        meanwhile.join()  # imported while the server worked, needed from here on
    from lockdiag.core import catalogue
    from lockdiag.core.decoding import spans_decodable

    hashed = server.pop("hashed", None) or {}
    own = texts.server(server)
    for oid, name in relations.items():
        relations[oid] = texts.decoded(name, own, where=f"relation {oid}") or ""
    info = server_info(dict(server, relations=relations), connection.info.server_version)
    derived = catalogue.derived_keys(
        [("hashtext", name, key) for name, key in hashed.items()], info.database
    )
    extent = extent_of(scope)
    taken = Snapshot(info, source, extent, sessions, locks, elapsed, derived, members=members)
    if isinstance(scope, Aggregated) and not spans_decodable(taken, registry or Registry()):
        return capture(connection, source, extent, names, registry, meanwhile)
    if isinstance(scope, Aggregated) and scope.members and info.tables:
        # a dump names each key: the rows of a software's table (enrich) may name a key inside
        # a span, which its entry would not say; read in full, as before spans
        return capture(connection, source, extent, names, registry, meanwhile)
    if texts.replaced:
        taken = dataclasses.replace(taken, notes=[*taken.notes, undecodable_note(taken)])
    return taken


def _snapshot_query(version: int, scope: Scope, registry: Registry) -> tuple[str, dict[str, Any]]:
    """The snapshot query for ``scope``: for Aggregated, the lock rows of snapshot_aggregated
    take the place of the full read's, before the same session and server rows."""
    full = queries.query("snapshot", version)
    if not isinstance(scope, Aggregated):
        return full, {"all_types": scope == "all"}
    _, rest = full.split("\nUNION ALL\n", 1)  # the full read's rows of kind 'lock' come first
    keys, spaces = ahead.singles(registry, scope.key)
    params = {
        "all_types": scope.all_types,
        "group_min": GROUP_MIN,
        "key_classids": [classid for classid, _, _ in keys],
        "key_objids": [objid for _, objid, _ in keys],
        "key_subids": [objsubid for _, _, objsubid in keys],
        "space_subids": [objsubid for objsubid, _ in spaces],
        "space_classids": [classid for _, classid in spaces],
    }
    aggregated = queries.query("snapshot_aggregated", version)
    if scope.members:
        assert aggregated.count(MEMBERS[0]) == 1
        aggregated = aggregated.replace(*MEMBERS)
    return f"{aggregated}\nUNION ALL\n{rest}", params


def stream_rows(
    cursor: psycopg.Cursor[Any], sql: str, params: dict[str, Any]
) -> Iterator[tuple[Any, ...]]:
    """The rows of a query as they arrive, BATCH at a time (libpq's chunked mode, libpq 17
    and later; one row at a time before): the client never holds the whole result, in C or
    in Python, so a read of every lock takes memory flat in the number of locks. Each chunk
    is a round trip the session's deadline watches (:mod:`lockdiag.pg.deadline`)."""
    size = BATCH if psycopg.pq.version() >= 170000 else 1
    yield from cursor.stream(sql.encode(), params, size=size)
