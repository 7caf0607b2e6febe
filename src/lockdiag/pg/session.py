"""The diagnostic session: read-only, short timeouts, named ``lockdiag``, takes no lock of its own.

Every conversation lockdiag has with a server it inspects goes through :class:`DiagnosticSession`:
one connection (reopened after a failure), the same settings, the same error messages, passwords
scrubbed from every message. Connection parameters come from a DSN or URI when given, otherwise
from libpq's own environment (``PGHOST``, ``PGDATABASE``, ``PGSERVICE``, ``~/.pgpass``...):
lockdiag adds its settings on top.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockdiag.errors import InputError, ServerError

if TYPE_CHECKING:
    from lockdiag.core.model import Scope, Snapshot
    from lockdiag.registry import Poolers, Registry

APPLICATION_NAME = "lockdiag"
DEFAULT_TIMEOUT = 5.0


def connect_timeout(timeout: float) -> str:
    """libpq's connect_timeout (whole seconds, at least 2: libpq treats 1 as 2 anyway)."""
    return str(max(2, math.ceil(timeout)))


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
    try:
        given = conninfo_to_dict(dsn or "")
    except psycopg.ProgrammingError as error:  # raised by libpq's parser
        raise InputError(f"invalid connection string: {scrub(str(error), dsn)}") from None
    user_options = str(given.get("options") or "")
    return make_conninfo(
        dsn or "",
        application_name=APPLICATION_NAME,
        connect_timeout=connect_timeout(timeout),
        options=f"{user_options} {session_options(timeout)}".strip(),
    )


class DiagnosticSession:
    """One read-only connection to the inspected server, opened on first use and reopened after
    a failure. ``registry`` and ``poolers`` complete each snapshot: names of well-known keys
    computed on the server, and which backends are a pooler's server connections."""

    def __init__(
        self,
        dsn: str | None,
        timeout: float = DEFAULT_TIMEOUT,
        registry: Registry | None = None,
        poolers: Poolers | None = None,
    ) -> None:
        self.dsn, self.timeout = dsn, timeout
        self.registry, self.poolers = registry, poolers
        self._connection: psycopg.Connection[Any] | None = None

    def __enter__(self) -> DiagnosticSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            try:
                # autocommit: each statement is its own transaction; never idle in transaction
                self._connection = psycopg.connect(
                    conninfo(self.dsn, self.timeout), autocommit=True
                )
            except psycopg.OperationalError as error:
                raise ServerError(
                    f"cannot connect: {one_line(scrub(str(error), self.dsn))}",
                    hint=_connect_hint(str(error)),
                ) from None
        return self._connection

    def describe(self) -> str:
        """``user@host:port/dbname`` for messages and snapshot files (never the password)."""
        info = self.connection.info
        host = info.host if not info.host.startswith("/") else f"socket {info.host}"
        return f"{info.user}@{host}:{info.port}/{info.dbname}"

    @contextmanager
    def errors(self) -> Iterator[None]:
        """psycopg errors raised inside become ServerError with a cause and a fix; a broken
        connection is dropped, so the next use reconnects."""
        try:
            yield
        except psycopg.Error as error:
            if self._connection is not None and self._connection.broken:
                self.close()
            raise server_error(error, self.dsn, self.timeout) from None

    def snapshot(self, scope: Scope) -> Snapshot:
        """One snapshot (one round trip), completed with what the server can name."""
        from lockdiag.pg.capture import capture, complete

        with self.errors():
            taken = capture(self.connection, self.describe(), scope)
            if self.registry is None:
                return taken
            return complete(self.connection, taken, self.registry, self.poolers, self.timeout)

    def fetch(self, name: str, params: dict[str, Any]) -> Sequence[Any]:
        """One row of a named query (see :mod:`lockdiag.pg.queries`)."""
        from lockdiag.pg import queries

        with self.errors():
            sql = queries.query(name, self.connection.info.server_version)
            row = self.connection.execute(sql.encode(), params).fetchone()
        return row if row is not None else ()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def take_snapshot(
    dsn: str | None,
    timeout: float,
    scope: Scope,
    registry: Registry | None = None,
    poolers: Poolers | None = None,
) -> Snapshot:
    """Connect, capture one snapshot and complete it, disconnect."""
    with DiagnosticSession(dsn, timeout, registry, poolers) as session:
        return session.snapshot(scope)


def server_error(error: psycopg.Error, dsn: str | None, timeout: float) -> ServerError:
    """A psycopg error raised while querying, as a ServerError with a cause and a fix."""
    if isinstance(error, psycopg.errors.QueryCanceled):
        return ServerError(
            f"the server cancelled lockdiag's query: {one_line(str(error))}",
            hint=f"statement_timeout is {timeout:g}s; raise it with --timeout if the lock "
            "table is very large",
        )
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return ServerError(
            f"lockdiag's query waited too long for a lock: {one_line(str(error))}",
            hint=f"lock_timeout is {timeout:g}s: something holds an exclusive lock on a catalog",
        )
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return ServerError(f"permission denied: {one_line(str(error))}")
    if isinstance(error, psycopg.OperationalError):
        return ServerError(f"connection lost: {one_line(scrub(str(error), dsn))}")
    return ServerError(f"query failed: {one_line(scrub(str(error), dsn))}")


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
