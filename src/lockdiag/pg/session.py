"""The diagnostic session: read-only, short timeouts, named ``lockdiag``, takes no lock of its own.

Every conversation lockdiag has with a server it inspects goes through :class:`DiagnosticSession`:
one connection (reopened after a failure), the same settings, the same error messages, passwords
scrubbed from every message. Connection parameters come from a DSN or URI when given, otherwise
from libpq's own environment (``PGHOST``, ``PGDATABASE``, ``PGSERVICE``, ``~/.pgpass``...):
lockdiag adds its settings on top.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from lockdiag.core.catalogue import derived_keys, hashed_names
from lockdiag.errors import ServerError
from lockdiag.pg import queries
from lockdiag.pg.capture import capture, complete
from lockdiag.pg.connection import conninfo, one_line, scrub

if TYPE_CHECKING:
    from lockdiag.core.model import DerivedKey, Scope, Snapshot
    from lockdiag.registry import Poolers, Registry

DEFAULT_TIMEOUT = 5.0


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
        names = hashed_names(self.registry.candidates) if self.registry is not None else []
        with self.errors():
            taken = capture(self.connection, self.describe(), scope, names)
            if self.registry is None:
                return taken
            return complete(self.connection, taken, self.registry, self.poolers, self.timeout)

    def fetch(self, name: str, params: dict[str, Any]) -> Sequence[Any]:
        """One row of a named query (see :mod:`lockdiag.pg.queries`)."""
        with self.errors():
            sql = queries.query(name, self.connection.info.server_version)
            row = self.connection.execute(sql.encode(), params).fetchone()
        return row if row is not None else ()

    def hashtext_keys(self, strings: list[str]) -> list[DerivedKey]:
        """hashtext() of ``strings`` on this server (for `decode --dsn`): one query."""
        with self.errors():
            sql = queries.query("enrich_hashtext", self.connection.info.server_version)
            rows = self.connection.execute(sql.encode(), {"strings": strings}).fetchall()
        return derived_keys(rows, "")

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
