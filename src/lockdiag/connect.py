"""The diagnostic session: read-only, short timeouts, named ``lockdiag``, takes no lock of its own.

Connection parameters come from a DSN or URI when given, otherwise from libpq's own environment
(``PGHOST``, ``PGDATABASE``, ``PGSERVICE``, ``~/.pgpass``...): lockdiag adds its settings on top.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lockdiag.errors import InputError, ServerError

if TYPE_CHECKING:
    import psycopg

    from lockdiag.registry import Poolers, Registry
    from lockdiag.snapshot import Scope, Snapshot

APPLICATION_NAME = "lockdiag"
DEFAULT_TIMEOUT = 5.0


def session_options(timeout: float) -> str:
    """Server settings sent in the startup packet, so they bind the very first statement."""
    milliseconds = max(1, int(timeout * 1000))
    return " ".join(
        [
            f"-c statement_timeout={milliseconds}",
            f"-c lock_timeout={milliseconds}",
            f"-c idle_in_transaction_session_timeout={max(milliseconds * 2, 10000)}",
            "-c default_transaction_read_only=on",
            # every name lockdiag uses resolves in pg_catalog, never in a user's schema
            "-c search_path=pg_catalog",
        ]
    )


def conninfo(dsn: str | None, timeout: float) -> str:
    """The user's DSN (or libpq's environment) with lockdiag's safety settings added."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        given = conninfo_to_dict(dsn or "")
    except Exception as error:  # psycopg.ProgrammingError, raised by libpq's parser
        raise InputError(f"invalid connection string: {scrub(str(error), dsn)}") from None
    user_options = str(given.get("options") or "")
    return make_conninfo(
        dsn or "",
        application_name=APPLICATION_NAME,
        connect_timeout=str(max(2, math.ceil(timeout))),
        options=f"{user_options} {session_options(timeout)}".strip(),
    )


def connect(dsn: str | None, timeout: float = DEFAULT_TIMEOUT) -> psycopg.Connection[Any]:
    import psycopg

    info = conninfo(dsn, timeout)
    try:
        # autocommit: each snapshot is its own implicit transaction; never idle in transaction.
        return psycopg.connect(info, autocommit=True)
    except psycopg.OperationalError as error:
        raise ServerError(
            f"cannot connect: {one_line(scrub(str(error), dsn))}",
            hint=_connect_hint(str(error)),
        ) from None


def describe(connection: psycopg.Connection[Any]) -> str:
    """``user@host:port/dbname`` for messages and snapshot files (never the password)."""
    info = connection.info
    host = info.host if not info.host.startswith("/") else f"socket {info.host}"
    return f"{info.user}@{host}:{info.port}/{info.dbname}"


@contextmanager
def server_errors(dsn: str | None, timeout: float) -> Iterator[None]:
    """Turn psycopg errors raised while querying into ServerError with a cause and a fix."""
    import psycopg

    try:
        yield
    except psycopg.errors.QueryCanceled as error:
        raise ServerError(
            f"the server cancelled lockdiag's query: {one_line(str(error))}",
            hint=f"statement_timeout is {timeout:g}s; raise it with --timeout if the lock "
            "table is very large",
        ) from None
    except psycopg.errors.LockNotAvailable as error:
        raise ServerError(
            f"lockdiag's query waited too long for a lock: {one_line(str(error))}",
            hint=f"lock_timeout is {timeout:g}s: something holds an exclusive lock on a catalog",
        ) from None
    except psycopg.errors.InsufficientPrivilege as error:
        raise ServerError(f"permission denied: {one_line(str(error))}") from None
    except psycopg.OperationalError as error:
        raise ServerError(f"connection lost: {one_line(scrub(str(error), dsn))}") from None
    except psycopg.Error as error:
        raise ServerError(f"query failed: {one_line(scrub(str(error), dsn))}") from None


def take_snapshot(
    dsn: str | None,
    timeout: float,
    scope: Scope,
    registry: Registry | None = None,
    poolers: Poolers | None = None,
) -> Snapshot:
    """Connect, capture one snapshot and complete it, disconnect."""
    from lockdiag.snapshot import capture

    connection = connect(dsn, timeout)
    try:
        with server_errors(dsn, timeout):
            snapshot = capture(connection, describe(connection), scope)
            if registry is None:
                return snapshot
            return complete(connection, snapshot, registry, poolers, timeout)
    finally:
        connection.close()


def complete(
    connection: psycopg.Connection[Any],
    snapshot: Snapshot,
    registry: Registry,
    poolers: Poolers | None,
    timeout: float,
) -> Snapshot:
    """What the snapshot query alone cannot say: names of well-known keys computed on the
    server, and which backends are a pooler's server connections (read in the same run)."""
    import dataclasses

    snapshot = enrich(connection, snapshot, registry)
    if poolers is None or not (poolers.pgbouncer or poolers.addresses):
        return snapshot
    from lockdiag import pooler

    links = pooler.address_links(poolers.addresses, snapshot.sessions)
    consoles, notes = [], list(snapshot.notes)
    for console_dsn in poolers.pgbouncer:
        try:
            consoles.append(pooler.read_console(console_dsn, timeout))
        except ServerError as error:
            notes.append(str(error))
    links.update(pooler.links(consoles, snapshot.sessions))
    return dataclasses.replace(snapshot, pool=links, notes=notes)


def enrich(connection: psycopg.Connection[Any], snapshot: Snapshot, registry: Registry) -> Snapshot:
    """At most one extra query, only when some advisory key has no name yet: hashtext() of
    listed names, and keys from well-known software's rows. Skipped cleanly when refused."""
    import dataclasses

    import psycopg

    from lockdiag.known import derived_keys, enrichment_query, server_can_name, unmatched_keys

    unreadable = [t[1:] for t in snapshot.server.tables if t.startswith("!")]
    if not (server_can_name(snapshot, registry) or unreadable):
        return snapshot  # nothing to ask and nothing to say: no work at all
    unmatched = unmatched_keys(snapshot, registry)
    if not unmatched:
        return snapshot
    notes = list(snapshot.notes)
    if unreadable:
        notes.append(
            f"{', '.join(unreadable)} cannot be read by {snapshot.server.current_user}: keys "
            "named by their rows (GoodJob, Que, pgmq) stay unregistered; GRANT SELECT to see them"
        )
    planned = enrichment_query(snapshot, registry, unmatched)
    if planned is None:
        return dataclasses.replace(snapshot, notes=notes)
    sql, params = planned
    try:
        rows = connection.execute(sql.encode(), params).fetchall()
    except psycopg.Error as error:
        reason = error.diag.message_primary or one_line(str(error))
        notes.append(f"well-known keys from rows or hashtext() not read: {reason}")
        return dataclasses.replace(snapshot, notes=notes)
    derived = derived_keys(rows, snapshot.server.database)
    return dataclasses.replace(snapshot, derived=[*snapshot.derived, *derived], notes=notes)


def one_line(message: str) -> str:
    return "; ".join(part.strip() for part in message.strip().splitlines() if part.strip())


def scrub(message: str, dsn: str | None) -> str:
    """Remove any password that could appear in a libpq message."""
    secrets = [os.environ.get("PGPASSWORD", "")]
    if dsn:
        match = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
        if match:
            secrets.append(match.group(1).strip("'"))
        match = re.search(r"://[^:/@]*:([^@/]*)@", dsn)
        if match:
            secrets.append(match.group(1))
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", message)


def _connect_hint(message: str) -> str | None:
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return "check the user and password (PGPASSWORD, ~/.pgpass or the DSN)"
    if "connection refused" in lowered or "no such file or directory" in lowered:
        return "is PostgreSQL running there? Check host and port (--dsn, PGHOST, PGPORT)"
    if "timeout expired" in lowered:
        return "the server did not answer in time; raise --timeout or check the network"
    if "could not translate host name" in lowered or "failed to resolve host" in lowered:
        return "the host name does not resolve; check --dsn or PGHOST"
    if "permission denied for database" in lowered or "not permitted to log in" in lowered:
        return (
            "this role may not connect there: GRANT CONNECT ON DATABASE ... TO it, "
            "or give --dsn another database (pg_locks shows every database's locks)"
        )
    if "does not exist" in lowered:
        return "check the database and role names"
    return None
