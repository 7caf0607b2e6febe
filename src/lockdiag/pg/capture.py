"""Capturing a snapshot: the one snapshot query, then what only the server (or a pooler) can add.

:func:`capture` is the single round trip (pg_locks read once, pg_stat_activity, server facts).
:func:`complete` adds, only when something is left to name, one bounded enrichment query
(hashtext() of listed names, keys of well-known software's rows) and the PgBouncer consoles.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from lockdiag.core import catalogue
from lockdiag.core.decoding import singles, spans_decodable
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
from lockdiag.errors import ServerError
from lockdiag.keys import PAIR_SUBID
from lockdiag.pg import pgbouncer, queries, trust
from lockdiag.pg.connection import one_line
from lockdiag.pg.raw_text import Texts, relation_names, undecodable_note
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Poolers, Registry

ROW_LIMIT = 10000  # rows of a software's table hashed at most, per table
KEY_LIMIT = 10000  # unnamed keys sent to the server at most
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


def capture(
    connection: psycopg.Connection[Any],
    source: str,
    scope: Scope = "advisory",
    names: list[str] | None = None,
    registry: Registry | None = None,
    sent: Callable[[], None] | None = None,
) -> Snapshot:
    """One query, one round trip: every lock (or every advisory lock, those of waits, or
    what an answer needs: :class:`Aggregated`) with its sessions, and the keys of ``names``
    as the server's hashtext() computes them. An aggregated read whose spans could hide a
    key the catalogue names alone (a database's, known only once read) is read again in
    full. Text that may be in another database's encoding comes as its bytes (raw_text.py); a
    text no encoding explains is shown with U+FFFD, and a note says where. ``sent`` is called
    as the query goes out: from then until its rows come the client only waits (an answer's
    later imports are made meanwhile, lockdiag.evidence.overlap)."""
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
        params.update(names=names or [], **probe_params())
        if sent is not None:
            sent()
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
        return capture(connection, source, extent, names, registry, sent)
    if isinstance(scope, Aggregated) and scope.members and info.tables:
        # a dump names each key: the rows of a software's table (enrich) may name a key inside
        # a span, which its entry would not say; read in full, as before spans
        return capture(connection, source, extent, names, registry, sent)
    if texts.replaced:
        taken = dataclasses.replace(taken, notes=[*taken.notes, undecodable_note(taken)])
    return taken


def probe_params() -> dict[str, Any]:
    """What the snapshot query looks for in the connected database, as the catalogue's
    programs declare it: tables that confirm a guess (by name), tables whose rows name keys
    (schema and name), extensions."""
    tables = [table.split(".") for table in catalogue.row_tables()]
    return {
        "software_tables": catalogue.SIGN_TABLES,
        "row_schemas": [schema for schema, _ in tables],
        "row_names": [name for _, name in tables],
        "extensions": catalogue.extension_names(),
    }


def _snapshot_query(version: int, scope: Scope, registry: Registry) -> tuple[str, dict[str, Any]]:
    """The snapshot query for ``scope``: for Aggregated, the lock rows of snapshot_aggregated
    take the place of the full read's, before the same session and server rows."""
    full = queries.query("snapshot", version)
    if not isinstance(scope, Aggregated):
        return full, {"all_types": scope == "all"}
    _, rest = full.split("\nUNION ALL\n", 1)  # the full read's rows of kind 'lock' come first
    keys, spaces = singles(registry, scope.key)
    params = {
        "all_types": scope.all_types,
        "group_min": GROUP_MIN,
        "key_classids": [k.classid for k in keys],
        "key_objids": [k.objid for k in keys],
        "key_subids": [k.objsubid for k in keys],
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


def complete(
    connection: psycopg.Connection[Any],
    snapshot: Snapshot,
    registry: Registry | None,
    poolers: Poolers | None,
    timeout: Timeout,
) -> Snapshot:
    """What the snapshot query alone cannot say: names of well-known keys computed on the
    server (with a registry), and which backends are a pooler's server connections (read in
    the same run)."""
    if registry is not None:
        snapshot = enrich(connection, snapshot, registry)
    if poolers is None or not (poolers.pgbouncer or poolers.addresses):
        return snapshot
    links = pgbouncer.address_links(poolers.addresses, snapshot.sessions)
    consoles, notes = [], list(snapshot.notes)
    for console_dsn in poolers.pgbouncer:
        try:
            consoles.append(pgbouncer.read_console(console_dsn, timeout))
        except ServerError as error:
            notes.append(str(error))
    links.update(pgbouncer.links(consoles, snapshot.sessions))
    return dataclasses.replace(snapshot, pool=links, notes=notes)


def enrich(connection: psycopg.Connection[Any], snapshot: Snapshot, registry: Registry) -> Snapshot:
    """Keys named by the rows of well-known software's tables (GoodJob, Que, pgmq, pg-boss
    queue tables: every table a catalogue entry declares), and the tables pg_repack is
    repacking by name; the rows only when such a table is present and some advisory key has
    no name yet. Every table goes through
    :mod:`lockdiag.pg.trust` first (locked against DDL, checked in the catalog) inside one
    read-only transaction; one that fails is skipped with a note that says why."""
    snapshot = _repacked_tables(connection, snapshot)
    listed = snapshot.server.tables
    if not listed:
        return snapshot  # nothing to ask and nothing to say: no work at all
    unmatched = catalogue.unmatched_keys(snapshot, registry)
    if not unmatched:
        return snapshot
    notes = list(snapshot.notes)
    unreadable = [t[1:] for t in listed if t.startswith("!")]
    unlockable = [t[1:] for t in listed if t.startswith("?")]
    tables = catalogue.row_tables()
    candidates = [t for t in listed if t in tables]
    if unreadable:
        notes.append(
            f"{', '.join(unreadable)} cannot be read by {snapshot.server.current_user}: keys "
            f"named by their rows ({_software_of(unreadable)}) stay unregistered; GRANT SELECT "
            "to see them"
        )
    if unlockable:
        notes.append(
            f"{', '.join(unlockable)} not read: lockdiag locks a table against DDL before "
            "reading it (so no one can swap in code between its check and its read), which "
            f"needs UPDATE, DELETE or TRUNCATE on it; {snapshot.server.current_user} has none"
        )
    if candidates and snapshot.server.in_recovery:
        notes.append(
            f"{', '.join(candidates)} not read: a standby cannot lock a table against DDL "
            "before reading it; run lockdiag on the primary to name these keys"
        )
        candidates = []
    if not candidates:
        return dataclasses.replace(snapshot, notes=notes)
    try:
        with connection.transaction():  # the locks last until the rows are read
            trust.lock(connection, candidates)
            verdicts = trust.vet(connection, {t: tables[t] for t in candidates})
            notes += [trust.note(v) for v in verdicts if not v.readable]
            readable = [v.table for v in verdicts if v.readable]
            rows = []
            if readable:
                sql, params = enrichment_query(snapshot, readable, unmatched)
                rows = connection.execute(sql.encode(), params).fetchall()
    except psycopg.errors.LockNotAvailable:
        notes.append(
            f"{', '.join(candidates)} not read this time: being vacuumed or altered right now "
            "(lockdiag does not wait for a lock on them)"
        )
        return dataclasses.replace(snapshot, notes=notes)
    except psycopg.Error as error:
        if connection.broken:
            raise
        reason = error.diag.message_primary or one_line(str(error))
        notes.append(f"well-known keys from their rows not read: {reason}")
        return dataclasses.replace(snapshot, notes=notes)
    derived = catalogue.derived_keys(rows, snapshot.server.database)
    return dataclasses.replace(snapshot, derived=[*snapshot.derived, *derived], notes=notes)


def _repacked_tables(connection: psycopg.Connection[Any], snapshot: Snapshot) -> Snapshot:
    """The names of the tables pg_repack locks in this database (its key carries the table's
    OID), added to the snapshot's relation names; only the catalog pg_class is read."""
    server = snapshot.server
    here = server.database_oid
    prefix = catalogue.REPACK_LOCK_PREFIX
    oids = sorted(
        {
            catalogue.repack_table_oid(key)
            for lock in snapshot.locks
            # the classid's test first: it tells nearly every lock apart without making a key
            if lock.classid == prefix
            and lock.database == here
            and (key := lock.advisory_key) is not None
            and key.objsubid == PAIR_SUBID
        }
        - set(server.relations)
    )[:KEY_LIMIT]
    if not oids:
        return snapshot
    sql = queries.query("relation_names", server.version_num)
    try:
        with connection.transaction():
            rows = connection.execute(sql.encode(), {"oids": oids}).fetchall()
    except psycopg.Error as error:
        if connection.broken:
            raise
        reason = error.diag.message_primary or one_line(str(error))
        notes = [*snapshot.notes, f"tables pg_repack is repacking not named: {reason}"]
        return dataclasses.replace(snapshot, notes=notes)
    relations = {**server.relations, **relation_names(rows)}
    return dataclasses.replace(snapshot, server=dataclasses.replace(server, relations=relations))


def _software_of(tables: list[str]) -> str:
    """The programs whose keys the rows of these tables name, in the catalogue's order."""
    names = {
        program.name: None for program, rows in catalogue.row_sources() if rows.table in tables
    }
    return ", ".join(names) or "well-known software"


def enrichment_query(
    snapshot: Snapshot, tables: list[str], unmatched: set[int]
) -> tuple[str, dict[str, Any]]:
    """The one extra query: the part of each table of well-known software that may be read,
    as its program declares it, each row led by the part's number (catalogue.row_parts)."""
    parts = [
        f"SELECT {number} AS part, p.* FROM (\n{_without_comments(sql)}\n) AS p"
        for number, (table, sql) in enumerate(catalogue.row_parts())
        if table in tables
    ]
    sql = "\nUNION ALL\n".join(parts)
    return sql, {"keys": sorted(unmatched)[:KEY_LIMIT], "row_limit": ROW_LIMIT}


def _without_comments(sql: str) -> str:
    """A query file's text without its leading comment lines (they would end the UNION)."""
    return "\n".join(line for line in sql.splitlines() if not line.startswith("--")).strip()
