"""What the snapshot query alone cannot say, added after it: names that only the server's
other tables give (keys named by well-known software's rows, the tables pg_repack is
repacking) and the PgBouncer consoles. At most one bounded enrichment query, and only when
something is left to name; imported while the snapshot query runs (lockdiag.evidence.reading),
since it needs the catalogue.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from lockdiag.core import catalogue
from lockdiag.core.model import Snapshot
from lockdiag.errors import ServerError
from lockdiag.keys import PAIR_SUBID
from lockdiag.pg import pgbouncer, queries, trust
from lockdiag.pg.connection import one_line
from lockdiag.pg.raw_text import relation_names
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Poolers, Registry

ROW_LIMIT = 10000  # rows of a software's table hashed at most, per table
KEY_LIMIT = 10000  # unnamed keys sent to the server at most


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
