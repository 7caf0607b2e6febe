"""The diagnostic session: read-only, short timeouts, named ``lockdiag``, takes no lock of its own.

Every conversation lockdiag has with a server it inspects goes through :class:`DiagnosticSession`:
one connection (reopened after a failure), the same settings, the same error messages, passwords
scrubbed from every message. Connection parameters come from a DSN or URI when given, otherwise
from libpq's own environment (``PGHOST``, ``PGDATABASE``, ``PGSERVICE``, ``~/.pgpass``...):
lockdiag adds its settings on top.

The settings travel in the startup packet, and are verified with one query after connecting. A
pooler may drop them (PgBouncer's ``ignore_startup_parameters = options``): then each
conversation runs inside ``BEGIN READ ONLY`` with ``SET LOCAL`` of each setting, verified in the
same round trip, and ends with COMMIT (or ROLLBACK). Never a session-level SET: through
transaction pooling it would stick to a server connection that other clients then use. Each
conversation, connecting included, has --timeout plus a margin as a whole, and every statement
a client-side deadline (:mod:`lockdiag.pg.deadline`).

That transaction is read committed and not deferrable by name, whatever the database's
defaults. client_encoding cannot be set that way (psycopg has encoded the transaction's
statements by then): a session whose encoding is not UTF8 even then is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg import sql

from lockdiag.core import ahead
from lockdiag.core.model import Aggregated, extent_of
from lockdiag.core.pacing import Activity, Backend
from lockdiag.core.pool_memory import PoolMemory
from lockdiag.errors import ServerError
from lockdiag.pg import deadline, queries
from lockdiag.pg.capture import Meanwhile, capture
from lockdiag.pg.connection import (
    APPLICATION_NAME,
    CLIENT_ENCODING,
    WORK_MEM_KB,
    conninfo,
    one_line,
    scrub,
    session_settings,
    version_settings,
)
from lockdiag.pg.deadline import BoundedConnection
from lockdiag.pg.raw_text import UTF8, Texts, codec, relation_names
from lockdiag.pg.timeout import DEFAULT_TIMEOUT, Timeout

if TYPE_CHECKING:
    from lockdiag.core.model import DerivedKey, Scope, Snapshot
    from lockdiag.registry import Poolers, Registry


class DatabaseName(NamedTuple):
    """A row of database_names.sql (tests/test_query_rows.py checks its columns against these
    names): a database's OID, its name's bytes in hex, whether lockdiag is connected to it, and
    the connected database's encoding."""

    oid: int
    name: str
    current: bool
    encoding: str


class DiagnosticSession:
    """One read-only connection to the inspected server, opened on first use and reopened after
    a failure. ``registry`` and ``poolers`` complete each snapshot: names of well-known keys
    computed on the server (unless ``enrich`` is False), and which backends are a pooler's
    server connections. ``timeout``: --timeout (seconds, in the documented Python API).
    Commands open it through :class:`lockdiag.evidence.Reader`, the only place that does."""

    def __init__(
        self,
        dsn: str | None,
        timeout: Timeout | float = DEFAULT_TIMEOUT,
        registry: Registry | None = None,
        poolers: Poolers | None = None,
        enrich: bool = True,
    ) -> None:
        self.dsn, self.timeout = dsn, Timeout.of(timeout)
        self.registry, self.poolers = registry if enrich else None, poolers
        self._connection: BoundedConnection | None = None
        self.per_transaction = False  # the startup options were not applied: SET LOCAL each time
        self.server_version = 0  # told by the first connection: the settings of that version
        self._told = False
        self.memory = PoolMemory()  # what earlier reads showed of pooled connections

    def __enter__(self) -> DiagnosticSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> BoundedConnection:
        if self._connection is None or self._connection.closed:
            self._connection = None
            self._connection = self._open()
        return self._connection

    def _open(self) -> BoundedConnection:
        """Connect, then check with one query that lockdiag's settings are in force. A server
        whose version has settings the startup packet did not carry (it did not know the
        version yet) is connected to once more with them, when they are not already as
        lockdiag wants them or the check did not get through: a database's
        transaction_timeout of 1ms ends the first connection at its first query."""
        sent = self.server_version
        try:
            connection, applied = self._connect()  # tells server_version
        except ServerError:
            if not self._unsent(sent):
                raise
            connection, applied = self._connect()
        else:
            if applied != _wanted(self.timeout, self.server_version) and self._unsent(sent):
                connection.close()
                connection, applied = self._connect()
        wanted = _wanted(self.timeout, self.server_version)
        self.per_transaction = applied != wanted
        if self.per_transaction:
            connection.prepare_threshold = None  # each transaction may be another backend's
        if self.per_transaction and not self._told:
            self._told = True  # once, not at every reconnection
            notice(
                "the server did not apply lockdiag's startup options (a pooler dropping "
                f"them?): its settings are applied per transaction ({connection.where})"
            )
        return connection

    def _unsent(self, sent: int) -> bool:
        """Whether the server's version has settings that a connection made knowing the
        version ``sent`` (0: none) did not carry."""
        return bool(version_settings(self.server_version)) and not version_settings(sent)

    def _connect(self) -> tuple[BoundedConnection, dict[str, str]]:
        """A new connection, and its settings as the server applies them."""
        try:
            # autocommit: each statement is its own transaction; never idle in transaction
            connection = deadline.connect(
                conninfo(self.dsn, self.timeout, self.server_version),
                self.timeout,
                statement_timeout=True,
                autocommit=True,
            )
        except psycopg.OperationalError as error:
            raise ServerError(
                f"cannot connect: {one_line(scrub(str(error), self.dsn))}",
                hint=_connect_hint(str(error)),
            ) from None
        self.server_version = connection.info.server_version  # known before any statement
        query = _settings_query(self.timeout, self.server_version)
        try:
            return connection, _settings_row(connection.execute(query))
        except psycopg.Error as error:
            connection.close()
            raise server_error(error, self.dsn, self.timeout) from None

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

    @contextmanager
    def conversation(self, within: float | None = None) -> Iterator[BoundedConnection]:
        """The connection, for one conversation with lockdiag's settings in force (in a
        transaction of its own when they must be applied per transaction): all of it,
        connecting included, within the session's timeout plus its margin
        (:meth:`Timeout.budget`), or within ``within`` seconds if shorter."""
        timeout = self.timeout if within is None else self.timeout.at_most(within)
        with timeout.budget(), self.errors():
            connection = self.connection
            if not self.per_transaction:
                yield connection
                return
            self._begin(connection)
            try:
                yield connection
            except BaseException:
                if not connection.closed:
                    with suppress(psycopg.Error, ServerError):
                        connection.execute(b"ROLLBACK")
                raise
            connection.execute(b"COMMIT")

    def _begin(self, connection: BoundedConnection) -> None:
        """BEGIN READ ONLY, SET LOCAL of every setting and their check: one round trip (a
        multi-statement simple query). Refused when the settings still are not in force."""
        version = connection.info.server_version
        wanted = _wanted(self.timeout, version)
        # explicit: the database's defaults may be serializable and deferrable
        begin = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY NOT DEFERRABLE"
        statements: list[sql.Composable] = [sql.SQL(begin)]
        statements += [
            sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(value))
            for name, value in session_settings(self.timeout, version).items()
        ]
        statements.append(_settings_query(self.timeout, version))
        try:
            cursor = connection.execute(sql.SQL("; ").join(statements))
            while cursor.nextset():
                pass  # the check's row is the last result
            applied = _settings_row(cursor)
            if applied != wanted:
                connection.execute(b"ROLLBACK")
        except psycopg.Error as error:
            if connection.broken:
                self.close()
            reason = error.diag.message_primary or one_line(scrub(str(error), self.dsn))
            raise ServerError(
                f"lockdiag cannot apply its settings per transaction ({reason}): refusing to go "
                "on without them",
                hint=_REFUSED_HINT,
            ) from None
        if applied != wanted:
            different = ", ".join(
                f"{name} is {applied.get(name)!r}, not {value!r}"
                for name, value in wanted.items()
                if applied.get(name) != value
            )
            raise ServerError(
                f"lockdiag's settings did not take effect even per transaction ({different}): "
                "refusing to go on without them",
                hint=_REFUSED_HINT,
            )

    def snapshot(
        self, scope: Scope, within: float | None = None, meanwhile: Meanwhile | None = None
    ) -> Snapshot:
        """One snapshot (one round trip; and one each for BEGIN and COMMIT when the settings
        go per transaction), completed with what the server can name; ``within``: seconds it
        may take at most (each statement has the session's deadline anyway); ``meanwhile``: told
        as the snapshot query goes out, waited for once its rows are in (see :func:`capture`)."""
        names = ahead.hashed_names(self.registry) if self.registry is not None else []
        timeout = self.timeout if within is None else self.timeout.at_most(within)
        with timeout.budget():  # both reads below, the retry included
            try:
                return self._snapshot(scope, names, within, meanwhile)
            except ConfigurationLimit:
                if not isinstance(scope, Aggregated):
                    raise
            # the aggregated read copies the lock table twice (pg_locks' own tuplestore and
            # its CTE's): where temp_file_limit refuses that, the full read's one copy may fit
            return self._snapshot(extent_of(scope), names, within, meanwhile)

    def _snapshot(
        self,
        scope: Scope,
        names: list[str],
        within: float | None,
        meanwhile: Meanwhile | None,
    ) -> Snapshot:
        with self.conversation(within) as connection:
            taken = capture(connection, self.describe(), scope, names, self.registry, meanwhile)
            if self.registry is None and self.poolers is None:
                return taken
            from lockdiag.pg.enrichment import complete  # imported with the catalogue meanwhile

            taken = complete(connection, taken, self.registry, self.poolers, self.timeout)
            return self.memory.recall(taken) if self.poolers is not None else taken

    def fetch(self, name: str, params: dict[str, Any]) -> Sequence[Any]:
        """One row of a named query (see :mod:`lockdiag.pg.queries`)."""
        with self.conversation() as connection:
            sql = queries.query(name, connection.info.server_version)
            row = connection.execute(sql.encode(), params).fetchone()
        return row if row is not None else ()

    def names(self, oids: list[int]) -> tuple[int | None, dict[int, str], dict[int, str]]:
        """From the catalog alone: the connected database's OID, every database's name by
        OID, and the names of the relations ``oids`` of the connected database."""
        with self.conversation() as connection:
            version = connection.info.server_version
            rows = connection.execute(queries.query("database_names", version).encode()).fetchall()
            relations = []
            if oids:
                sql = queries.query("relation_names", version)
                relations = connection.execute(sql.encode(), {"oids": oids}).fetchall()
        # names as their bytes, with the connected database's encoding (raw_text.py)
        found = list(map(DatabaseName._make, rows))
        here = next((int(d.oid) for d in found if d.current), None)
        texts = Texts()
        databases = {
            int(d.oid): texts.decoded(d.name, UTF8, codec(d.encoding)) or "" for d in found
        }
        return here, databases, relation_names(relations)

    def activity(self, within: float | None = None) -> Activity:
        """The cheap probe of the backends (no lock-manager lock): see core.pacing.Pacer;
        ``within``: seconds it may take at most, as for :meth:`snapshot`."""
        with self.conversation(within) as connection:
            sql = queries.query("probe_activity", connection.info.server_version)
            rows = connection.execute(sql.encode(), {"own": APPLICATION_NAME}).fetchall()
        return frozenset(map(Backend._make, rows))

    def hashtext_keys(self, strings: list[str]) -> list[DerivedKey]:
        """hashtext() of ``strings`` on this server (for `decode --dsn`): one query."""
        with self.conversation() as connection:
            sql = queries.query("enrich_hashtext", connection.info.server_version)
            rows = connection.execute(sql.encode(), {"strings": strings}).fetchall()
        from lockdiag.core.catalogue import KeyRow, derived_keys

        return derived_keys(map(KeyRow._make, rows), "")

    def interrupt(self) -> None:
        """From another thread: wake the statement under way now (its caller gets a
        ServerError). For a view that quits while the server does not answer."""
        deadline.interrupt(self._connection)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


_REFUSED_HINT = (
    "connect to PostgreSQL directly, or through a pooler in session or transaction mode "
    "(with PgBouncer, ignore_startup_parameters = options, which drops every client's options)"
)


def _wanted(timeout: Timeout, server_version: int) -> dict[str, str]:
    """What the check query must read: every setting, the encoding sent when connecting, and a
    read-only, read-committed, not deferrable transaction."""
    return dict(
        session_settings(timeout, server_version),
        client_encoding=CLIENT_ENCODING,
        transaction_read_only="on",
        transaction_isolation="read committed",
        transaction_deferrable="off",
    )


def _settings_query(timeout: Timeout, server_version: int) -> sql.Composed:
    """One row: each of lockdiag's settings as the server applies it now (a JSON object).
    ``role`` is not in pg_settings: it reads 'none' when the session acts as the role it
    logged in as (current_user = session_user), else the role it acts as."""
    names = sorted(set(_wanted(timeout, server_version)) - {"role"})
    return sql.SQL(
        "SELECT pg_catalog.json_object_agg(name, setting) FROM ("
        "SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN ({}) UNION ALL "
        "SELECT 'role', CASE WHEN CURRENT_USER = SESSION_USER THEN 'none' "
        "ELSE CURRENT_USER::text END) AS s"
    ).format(sql.SQL(", ").join(map(sql.Literal, names)))


def _settings_row(cursor: psycopg.Cursor[Any]) -> dict[str, str]:
    row = cursor.fetchone()
    found = row[0] if row is not None else None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _to_stderr(message: str) -> None:
    print(f"lockdiag: warning: {message}", file=sys.stderr, flush=True)


_SINK: list[Callable[[str], None]] = [_to_stderr]


def notice(message: str) -> None:
    """Tell the person about something that goes on, but differently: on stderr, or where
    :func:`notices_to` sends it."""
    _SINK[-1](message)


@contextmanager
def notices_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Notices go to ``sink`` meanwhile (a full-screen view, where stderr would tear the frame)."""
    _SINK.append(sink)
    try:
        yield
    finally:
        _SINK.remove(sink)


class ConnectionLost(ServerError):
    """The connection broke under a statement (the server restarted, the backend was
    terminated): a new connection may well succeed at once."""


class ConfigurationLimit(ServerError):
    """A configured limit of the server ended a statement (SQLSTATE 53400): temp_file_limit,
    when its copy of the lock table outgrew lockdiag's work_mem. The connection lives on."""


_LIMIT_HINT = (
    "pg_locks is copied to a temporary file once it outgrows lockdiag's work_mem "
    f"({WORK_MEM_KB // 1024} MB, some 200,000 locks): where temp_file_limit stopped it, a "
    "superuser can raise it for lockdiag's role (ALTER ROLE name SET temp_file_limit = ...)"
)


def server_error(error: psycopg.Error, dsn: str | None, timeout: Timeout) -> ServerError:
    """A psycopg error raised while querying, as a ServerError with a cause and a fix."""
    if isinstance(error, psycopg.errors.QueryCanceled):
        return ServerError(
            f"the server cancelled lockdiag's query: {one_line(str(error))}",
            hint=f"statement_timeout is {timeout}; raise it with --timeout if the lock "
            "table is very large",
        )
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return ServerError(
            f"lockdiag's query waited too long for a lock: {one_line(str(error))}",
            hint=f"lock_timeout is {timeout}: something holds an exclusive lock on a catalog",
        )
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return ServerError(f"permission denied: {one_line(str(error))}")
    if isinstance(error, psycopg.errors.ConfigurationLimitExceeded):
        return ConfigurationLimit(
            f"a limit of the server ended lockdiag's query: {one_line(str(error))}",
            hint=_LIMIT_HINT,
        )
    # the server short of a resource (SQLSTATE class 53: disk, memory, a configured limit)
    # ended the statement, not the connection
    if isinstance(error, psycopg.OperationalError) and not (error.sqlstate or "").startswith("53"):
        return ConnectionLost(f"connection lost: {one_line(scrub(str(error), dsn))}")
    return ServerError(f"query failed: {one_line(scrub(str(error), dsn))}")


def _connect_hint(message: str) -> str | None:
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return "check the user and password (PGPASSWORD, ~/.pgpass or the DSN)"
    if "connection refused" in lowered or "no such file or directory" in lowered:
        return "is PostgreSQL running there? Check host and port (--dsn, PGHOST, PGPORT)"
    if "unsupported startup parameter" in lowered:
        return (
            "a pooler refuses lockdiag's startup options (which carry its read-only setting and "
            "timeouts): connect to PostgreSQL directly (best: pg_locks is the server's anyway); "
            "ignore_startup_parameters = options in pgbouncer.ini would let lockdiag apply them "
            "per transaction, but it drops every client's options silently, so first check that "
            "no application of that pooler sends any"
        )
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
