"""Advisory locks for job workers, taken the way the guidance says, named by the registry.

    from lockdiag.worker import xact_lock, session_lock

    with conn.transaction():
        if not xact_lock(conn, "tenant_summary", 73):
            return "busy"                      # a failed try is not permission to go on
        rebuild_summary(conn, 73)              # same connection, same transaction

    with session_lock(conn, "nightly_export", 1, wait=True, timeout=30) as taken:
        ...                                    # unlocked exactly once on the way out

``conn`` is what the worker already has: a psycopg 3 or psycopg2 connection, a SQLAlchemy
``Connection`` or ORM ``Session``, Django's ``connection``; for the async helpers a psycopg
``AsyncConnection``, a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``, an asyncpg
``Connection`` (a pool's included). The driver is recognised by the module of the object's
type and imported only then: none is imported with this module.

What each helper guarantees: the key comes from the registry (the CLI decodes what workers
take); a transaction lock is only taken inside a transaction; the boolean of a try is
returned, never hidden; a waiting lock gives up after ``timeout`` (LockTimeout) without
aborting the caller's transaction, and leaves the caller's ``lock_timeout`` (the only setting
a helper touches) as it found it, whatever the outcome; a session lock is unlocked exactly
once whatever ends the block (return, exception, cancellation), and an unlock that finds no
lock is logged and counted; a session lock is refused on a connection that goes through a
PgBouncer of the registry's ``[poolers]`` in transaction or statement pooling. What they
cannot guarantee: that an external effect happens once. Durable job state and constraints
still do that; a lock only keeps two workers from doing the same work at the same time.

The rules are written once (``_plan``, ``_Attempt``, ``_released``); each driver has a thin
adapter that says whether a transaction is open, runs one statement, makes a savepoint, and
commits or rolls back a transaction the helper itself began.

Every attempt, wait, hold and outcome is reported to ``events`` (a callable), or to the default
set with :func:`report_to` (for instance :class:`PrometheusEvents`).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol

from lockdiag.errors import InputError, LockdiagError
from lockdiag.keys import LockTriple
from lockdiag.registry import Registry, load_registry

log = logging.getLogger("lockdiag.worker")

Kind = Literal["xact", "session"]
Result = Literal["acquired", "busy", "timeout", "error"]


class LockTimeout(LockdiagError):
    """A waiting lock was not granted within its timeout; nothing is held."""


class NotInTransaction(InputError):
    """A transaction-level lock asked for outside a transaction: it would end at once."""


class UnsupportedConnection(InputError):
    """An object that is not a connection of a driver the helpers know (or the wrong API)."""


class PooledSession(InputError):
    """A session lock asked for through a pooler that hands the session to other clients."""


@dataclass(frozen=True)
class Event:
    """What a helper did: an attempt (with its result and wait), a release (with the hold),
    or the outcome of the protected work."""

    namespace: str
    kind: Kind | None  # None for a work outcome
    what: Literal["attempt", "release", "outcome"]
    result: str  # attempt: acquired/busy/timeout/error; release: ok/not-held/error; outcome
    seconds: float = 0.0  # attempt: time waited; release: time held


Events = Callable[[Event], None]
_default: Events | None = None


def report_to(events: Events | None) -> None:
    """Where every helper reports its events when not given ``events=``."""
    global _default  # noqa: PLW0603 - one process-wide choice, like logging's
    _default = events


def _emit(events: Events | None, event: Event) -> None:
    target = events or _default
    if target is not None:
        target(event)


class PrometheusEvents:
    """Events as prometheus_client metrics: attempts by result, wait and hold histograms, and
    work outcomes, per namespace (bounded labels)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        where = REGISTRY if registry is None else registry
        self.attempts = Counter(
            "lockdiag_worker_lock_attempts", "Lock attempts, by namespace, kind and result.",
            ["namespace", "kind", "result"], registry=where,
        )  # fmt: skip
        self.waits = Histogram(
            "lockdiag_worker_lock_wait_seconds", "Time spent taking a lock.",
            ["namespace", "kind"], registry=where,
        )  # fmt: skip
        self.holds = Histogram(
            "lockdiag_worker_lock_hold_seconds", "Time a lock was held (session locks).",
            ["namespace", "kind"], registry=where,
        )  # fmt: skip
        self.unlocks = Counter(
            "lockdiag_worker_lock_releases", "Unlocks, by namespace and result.",
            ["namespace", "result"], registry=where,
        )  # fmt: skip
        self.work = Counter(
            "lockdiag_worker_work", "Outcomes of the protected work.", ["namespace", "outcome"],
            registry=where,
        )  # fmt: skip

    def __call__(self, event: Event) -> None:
        if event.what == "attempt":
            self.attempts.labels(event.namespace, event.kind, event.result).inc()
            self.waits.labels(event.namespace, event.kind).observe(event.seconds)
        elif event.what == "release":
            self.unlocks.labels(event.namespace, event.result).inc()
            if event.result == "ok":
                self.holds.labels(event.namespace, event.kind).observe(event.seconds)
        else:
            self.work.labels(event.namespace, event.result).inc()


@contextmanager
def work(namespace: str, *, events: Events | None = None) -> Iterator[None]:
    """Record the outcome of the protected work (ok, or error when it raises)."""
    try:
        yield
    except BaseException:
        _emit(events, Event(namespace, None, "outcome", "error"))
        raise
    _emit(events, Event(namespace, None, "outcome", "ok"))


# -- the statements --------------------------------------------------------------------------
#
# Plain SQL text, the same for every driver (each has its own parameter style). Only integers
# are formatted into it, by int(): the registry's key numbers and the timeout in milliseconds.
# CAST(n AS integer), not n::integer: -2147483648::integer is -(2147483648::integer), an
# overflow.


def _key(namespace: str, resource: tuple[object, ...], registry: Registry) -> LockTriple:
    """The registry's key: one integer, or the namespace's parts in order."""
    return registry.key(namespace, *resource).triple


def _call(function: str, key: LockTriple) -> str:
    if key.form == "bigint":
        return f"pg_catalog.{function}(CAST({int(key.bigint)} AS bigint))"
    first, second = key.pair
    return f"pg_catalog.{function}(CAST({int(first)} AS integer), CAST({int(second)} AS integer))"


# A wait with a timeout, in one statement (one round trip) that leaves lock_timeout as it
# found it. The inner SELECT, a plan node of its own (OFFSET 0), reads the caller's effective
# value, then sets the helper's; the outer one waits, then sets the caller's value back. Both
# are local (set_config(..., true)): a session-level SET would replace the caller's session
# value. A local value set in a savepoint outlives RELEASE SAVEPOINT, so it is put back rather
# than left to the savepoint. When the statement fails instead (timeout, cancellation), what
# it set is undone with it: by the ROLLBACK TO SAVEPOINT around it, or with the implicit
# transaction of a statement that runs on its own.
_WAIT = (
    "SELECT {lock}, pg_catalog.set_config('lock_timeout', caller.value, true)"
    " FROM (SELECT pg_catalog.current_setting('lock_timeout') AS value,"
    " pg_catalog.set_config('lock_timeout', '{timeout}ms', true) OFFSET 0) AS caller"
)


def _lock_statement(kind: Kind, key: LockTriple, wait: bool, timeout: float | None) -> str:
    """The one statement that takes the lock: a try, a wait, or a wait of at most TIMEOUT."""
    xact = "xact_" if kind == "xact" else ""
    function = f"pg_advisory_{xact}lock" if wait else f"pg_try_advisory_{xact}lock"
    if not wait or timeout is None:
        return f"SELECT {_call(function, key)}"
    return _WAIT.format(lock=_call(function, key), timeout=max(1, int(timeout * 1000)))


def _taken(value: object) -> bool:
    """A try's boolean; a wait's void (psycopg: an empty string, asyncpg: None) is taken."""
    return value is not False


# The server address of this session as the server sees it: behind PgBouncer, the pooler's
# server connection, which its console lists as local_addr:local_port (SHOW SERVERS).
_CLIENT_ADDRESS = (
    "SELECT pg_catalog.host(pg_catalog.inet_client_addr()) || ' ' || pg_catalog.inet_client_port()"
)

LOCK_TIMEOUT = "55P03"  # lock_not_available: lock_timeout ran out


def _sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, through the wrappers of SQLAlchemy and Django."""
    seen: BaseException | None = error
    for _ in range(6):
        if seen is None:
            return None
        for name in ("sqlstate", "pgcode"):
            code = getattr(seen, name, None)
            if isinstance(code, str):
                return code
        inner = getattr(seen, "orig", None) or getattr(seen, "driver_exception", None)
        seen = inner if isinstance(inner, BaseException) else seen.__cause__
    return None


# -- the rules -------------------------------------------------------------------------------


class State(enum.Enum):
    """Where the connection is, in the driver's own terms, reduced to what the rules need."""

    AUTOCOMMIT = "autocommit"  # no transaction; each statement is its own
    IDLE = "idle"  # no transaction; the next statement begins one (psycopg2, autobegin)
    OPEN = "open"  # in a transaction (also a failed one: its statements fail)


Plan = Literal["alone", "alone, rolled back on failure", "own transaction", "savepoint"]


def _plan(kind: Kind | Literal["unlock"], state: State) -> Plan:
    """How a helper's statement runs so that the caller's transaction and settings are left
    as they were. Inside a transaction: in a savepoint, so a timeout or a cancellation
    leaves the caller's transaction usable. In autocommit mode: on its own, its own
    transaction. Where the next statement begins a transaction: a transaction lock begins
    the caller's (the lock lasts until the caller commits; a failure rolls that transaction
    back, leaving the connection as it was); a session lock, or an unlock, runs in a
    transaction of its own, committed, so the helper leaves no transaction open."""
    if state is State.OPEN:
        return "savepoint"
    if state is State.AUTOCOMMIT:
        return "alone"
    return "alone, rolled back on failure" if kind == "xact" else "own transaction"


class _Attempt:
    """Times one attempt, turns a lock timeout into LockTimeout, and reports the result."""

    def __init__(
        self,
        namespace: str,
        kind: Kind,
        key: LockTriple,
        timeout: float | None,
        events: Events | None,
    ) -> None:
        self.namespace, self.kind, self.key, self.timeout = namespace, kind, key, timeout
        self.events = events
        self.result: Result = "error"
        self.started = time.monotonic()

    def __enter__(self) -> _Attempt:
        return self

    def done(self, value: object) -> bool:
        taken = _taken(value)
        self.result = "acquired" if taken else "busy"
        return taken

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        timed_out = error is not None and _sqlstate(error) == LOCK_TIMEOUT
        if timed_out:
            self.result = "timeout"
        waited = time.monotonic() - self.started
        _emit(self.events, Event(self.namespace, self.kind, "attempt", self.result, waited))
        if timed_out:
            within = "the caller's lock_timeout" if self.timeout is None else f"{self.timeout:g}s"
            key = self.key.describe()  # (4102, 73), as SQL writes it, not a Python tuple
            raise LockTimeout(f"{self.namespace} {key}: not granted within {within}")


def _released(
    adapter: _Common,
    namespace: str,
    key: LockTriple,
    value: object,
    error: BaseException | None,
    held_since: float,
    events: Events | None,
) -> None:
    """Log and report what an unlock found: released, not held, or failed."""
    if error is not None:
        result = "error"
        log.warning("lockdiag: %s %s: unlock failed: %s%s", namespace, key.describe(), error,
                    adapter.if_unlock_failed)  # fmt: skip
    elif value:
        result = "ok"
    else:
        result = "not-held"
        log.warning("lockdiag: %s %s was not held when unlocked%s", namespace, key.describe(),
                    adapter.if_unlock_failed)  # fmt: skip
    _emit(events, Event(namespace, "session", "release", result, time.monotonic() - held_since))


def _refused(adapter: _Common, api: str) -> NotInTransaction:
    return NotInTransaction(
        f"{api} needs a transaction: a transaction-level lock taken in autocommit mode "
        f"ends at once; {adapter.how_to_begin}"
    )


# -- poolers: what the registry's [poolers] say about this connection ------------------------

_CONSOLE_TTL = 30.0  # seconds a console's answer (or a connection it does not list) is reused
_consoles: dict[str, tuple[float, str, dict[tuple[str, int], str]]] = {}
_not_listed: dict[tuple[str, str, int], float] = {}  # (console, addr, port): when last missed


def _pool_modes(dsn: str) -> tuple[str, dict[tuple[str, int], str]]:
    """One PgBouncer's label (host:port, never the DSN: it may hold a password) and the pool
    mode of each of its server connections, by (local_addr, local_port)."""
    from lockdiag.pg.pgbouncer import read_console

    console = read_console(dsn, 5.0)
    modes = {
        (p.get("database"), p.get("user")): str(p.get("pool_mode") or "") for p in console.pools
    }
    return console.label, {
        (str(s.get("local_addr")), int(s.get("local_port") or 0)): modes.get(
            (s.get("database"), s.get("user")), ""
        )
        for s in console.servers
    }


def _listed(dsn: str, address: tuple[str, int], fresh: bool) -> tuple[str, str] | None:
    """(label, mode) when console DSN lists ADDRESS as one of its server connections."""
    now = time.monotonic()
    cached = _consoles.get(dsn)
    if fresh or cached is None or now - cached[0] > _CONSOLE_TTL:
        label, modes = _pool_modes(dsn)
        cached = _consoles[dsn] = (now, label, modes)
    return (cached[1], cached[2][address]) if address in cached[2] else None


def _pooler_mode(registry: Registry, address: str | None) -> tuple[str, str] | None:
    """(pooler, pool mode) when ADDRESS ("addr port" of this session's server connection, as
    the server sees it) is a server connection of a PgBouncer in the registry, or comes from
    one of its pooler addresses (mode ""); None when no known pooler is in the way."""
    if not address:
        return None  # a Unix socket: no pooler
    host, _, port = address.partition(" ")
    where = (host, int(port))
    for dsn in registry.poolers.pgbouncer:
        missed = _not_listed.get((dsn, *where))
        if missed is not None and time.monotonic() - missed < _CONSOLE_TTL:
            continue  # a direct connection, seen lately: no console read per lock
        try:
            # read again on a miss: a server connection opened since the last read
            found = _listed(dsn, where, fresh=False) or _listed(dsn, where, fresh=True)
        except LockdiagError as error:
            log.warning("lockdiag: cannot tell the pool mode: %s", error)
            continue
        if found is not None:
            return found
        _not_listed[(dsn, *where)] = time.monotonic()
    if host in registry.poolers.addresses:
        return host, ""
    return None


def _check_pooler(registry: Registry, namespace: str, address: str | None) -> None:
    """Refuse a session lock through transaction or statement pooling; warn when the mode
    cannot be known."""
    found = _pooler_mode(registry, address)
    if found is None:
        return
    pooler, mode = found
    if mode in ("transaction", "statement"):
        raise PooledSession(
            f"session_lock {namespace}: this connection goes through PgBouncer {pooler} in "
            f"{mode} pooling, which hands its server session to other clients between "
            "transactions: a session lock would outlive this worker's transaction and be "
            "inherited (re-entrantly) by the next client; use xact_lock inside a transaction, "
            "or route this worker through session pooling"
        )
    if not mode:
        log.warning("lockdiag: session_lock %s: the connection comes from pooler %s, whose pool "
                    "mode is unknown: in transaction pooling the lock can outlive the worker",
                    namespace, pooler)  # fmt: skip


# -- adapters: one per driver ----------------------------------------------------------------


class _Common(Protocol):
    driver: str
    errors: tuple[type[BaseException], ...]  # what a failed statement raises
    how_to_begin: str  # for NotInTransaction
    if_unlock_failed: str  # what a failed unlock may leave behind, for the log


class _Adapter(_Common, Protocol):
    def state(self) -> State: ...
    def run(self, statement: str) -> object: ...  # first column of the first row
    def savepoint(self) -> AbstractContextManager[object]: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...


class _AsyncAdapter(_Common, Protocol):
    async def state(self) -> State: ...
    async def run(self, statement: str) -> object: ...
    def savepoint(self) -> AbstractAsyncContextManager[object]: ...
    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...


def _errors(*classes: type[BaseException]) -> tuple[type[BaseException], ...]:
    return classes


_QUEUE_POOL = (
    " (if the connection went back to SQLAlchemy's pool inside the block, the lock is still "
    "held there: QueuePool only rolls back on return; release before returning it)"
)


class _Psycopg:
    driver, how_to_begin, if_unlock_failed = "psycopg", "use `with conn.transaction():`", ""

    def __init__(self, conn: Any) -> None:
        import psycopg

        self.conn, self.errors = conn, _errors(psycopg.Error)

    def state(self) -> State:
        return _psycopg_state(self.conn)

    def run(self, statement: str) -> object:
        row = self.conn.execute(statement.encode()).fetchone()
        return row[0] if row else None

    def savepoint(self) -> AbstractContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        if not self.conn.broken:
            self.conn.rollback()


def _psycopg_state(conn: Any) -> State:
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status == TransactionStatus.IDLE:
        return State.AUTOCOMMIT if conn.autocommit else State.IDLE
    return State.OPEN


class _AsyncPsycopg:
    driver, how_to_begin = "psycopg", "use `async with conn.transaction():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        import psycopg

        self.conn, self.errors = conn, _errors(psycopg.Error)

    async def state(self) -> State:
        return _psycopg_state(self.conn)

    async def run(self, statement: str) -> object:
        row = await (await self.conn.execute(statement.encode())).fetchone()
        return row[0] if row else None

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        if not self.conn.broken:
            await self.conn.rollback()


_savepoints = itertools.count(1)


class _Psycopg2:
    """psycopg2 begins a transaction before the first statement unless in autocommit mode;
    it has no savepoint helper, so the adapter names its own."""

    driver, how_to_begin = "psycopg2", "set conn.autocommit = False (or run BEGIN) first"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        import psycopg2

        self.conn, self.errors = conn, _errors(psycopg2.Error)

    def state(self) -> State:
        from psycopg2.extensions import TRANSACTION_STATUS_IDLE

        if self.conn.get_transaction_status() == TRANSACTION_STATUS_IDLE:
            return State.AUTOCOMMIT if self.conn.autocommit else State.IDLE
        return State.OPEN

    def run(self, statement: str) -> object:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    @contextmanager
    def savepoint(self) -> Iterator[object]:
        name = f"lockdiag_{next(_savepoints)}"
        self.run(f"SAVEPOINT {name}")
        try:
            yield None
        except BaseException:
            if not self.conn.closed and self.state() is State.OPEN:
                self.run(f"ROLLBACK TO SAVEPOINT {name}")
                self.run(f"RELEASE SAVEPOINT {name}")
            raise
        if self.state() is State.OPEN:  # the block may have ended the transaction
            self.run(f"RELEASE SAVEPOINT {name}")

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()


def _sqlalchemy_errors() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    return _errors(SQLAlchemyError)


def _dbapi_autocommit(sync_connection: Any) -> bool:
    """SQLAlchemy's AUTOCOMMIT isolation sets the DBAPI connection's autocommit: then even
    ``conn.begin()`` opens no transaction on the server."""
    return bool(getattr(sync_connection.connection.dbapi_connection, "autocommit", False))


def _sqlalchemy_state(sync_connection: Any, in_transaction: bool) -> State:
    if _dbapi_autocommit(sync_connection):
        return State.AUTOCOMMIT
    return State.OPEN if in_transaction else State.IDLE


def _postgresql(dialect: Any, what: str) -> None:
    if dialect.name != "postgresql":
        raise UnsupportedConnection(f"{what} is on {dialect.name}: advisory locks need PostgreSQL")


class _SQLAlchemy:
    """A SQLAlchemy Connection or ORM Session (``target``): autobegin is the IDLE state."""

    driver, how_to_begin = "sqlalchemy", "use `with conn.begin():` (or session.begin())"
    if_unlock_failed = _QUEUE_POOL

    def __init__(self, target: Any, session: bool) -> None:
        from sqlalchemy import text

        self.target, self.session, self.text = target, session, text
        self.errors = _sqlalchemy_errors()
        bind = target.get_bind() if session else target
        _postgresql(bind.dialect, "this SQLAlchemy connection")

    def state(self) -> State:
        began = self.target.in_transaction()
        # a Session's connection (autobegins the Session's transaction: no SQL is sent)
        sync = self.target.connection() if self.session else self.target
        return _sqlalchemy_state(sync, began)

    def run(self, statement: str) -> object:
        return self.target.execute(self.text(statement)).scalar()

    def savepoint(self) -> AbstractContextManager[object]:
        return self.target.begin_nested()  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.target.commit()

    def rollback(self) -> None:
        self.target.rollback()


class _AsyncSQLAlchemy:
    """A SQLAlchemy AsyncConnection or AsyncSession."""

    driver = "sqlalchemy"
    how_to_begin = "use `async with conn.begin():` (or session.begin())"
    if_unlock_failed = _QUEUE_POOL

    def __init__(self, target: Any, session: bool) -> None:
        from sqlalchemy import text

        self.target, self.session, self.text = target, session, text
        self.errors = _sqlalchemy_errors()
        bind = target.sync_session.get_bind() if session else target.sync_engine
        _postgresql(bind.dialect, "this SQLAlchemy connection")

    async def state(self) -> State:
        began = self.target.in_transaction()
        connection = await self.target.connection() if self.session else self.target
        return _sqlalchemy_state(connection.sync_connection, began)

    async def run(self, statement: str) -> object:
        """SQLAlchemy invalidates a connection whose statement is interrupted by a
        cancellation (the whole transaction then needs a rollback): the statement runs in a
        task of its own, and a cancellation of the caller cancels it on the server instead
        (pg_cancel_backend from another connection of the engine); it then ends with the
        server's QueryCanceled, the connection intact, and the CancelledError goes on."""
        connection = await self.target.connection() if self.session else self.target
        running = asyncio.ensure_future(connection.execute(self.text(statement)))
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            if not running.done():
                await self._cancel_on_server(connection)
                await asyncio.wait([running])
                if not running.cancelled():
                    running.exception()  # the server's QueryCanceled, retrieved: expected
            raise
        return result.scalar()

    async def _cancel_on_server(self, connection: Any) -> None:
        raw = (await connection.get_raw_connection()).driver_connection
        pid = raw.get_server_pid() if hasattr(raw, "get_server_pid") else raw.info.backend_pid
        async with connection.engine.connect() as other:
            await other.execute(self.text(f"SELECT pg_catalog.pg_cancel_backend({int(pid)})"))

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.target.begin_nested()  # type: ignore[no-any-return]

    async def commit(self) -> None:
        await self.target.commit()

    async def rollback(self) -> None:
        await self.target.rollback()


class _Asyncpg:
    """asyncpg runs each statement on its own unless inside ``conn.transaction()``; a nested
    ``transaction()`` is a savepoint. A pool's connection runs pg_advisory_unlock_all() when
    released (Connection.get_reset_query), so no session lock outlives ``pool.acquire()``."""

    driver, how_to_begin = "asyncpg", "use `async with conn.transaction():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        import asyncpg

        self.conn = conn
        self.errors = _errors(asyncpg.PostgresError, asyncpg.InterfaceError)

    async def state(self) -> State:
        return State.OPEN if self.conn.is_in_transaction() else State.AUTOCOMMIT

    async def run(self, statement: str) -> object:
        return await self.conn.fetchval(statement)

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    async def commit(self) -> None:  # never IDLE: there is no transaction of the helper's
        raise AssertionError("asyncpg has no implicit transaction")

    async def rollback(self) -> None:
        raise AssertionError("asyncpg has no implicit transaction")


class _Django:
    """Django's connection: an ``atomic()`` block is a transaction (a nested one a
    savepoint); outside one, Django's default autocommit runs each statement on its own."""

    driver, how_to_begin = "django", "use `with transaction.atomic():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        from django.db import Error

        self.conn, self.errors = conn, _errors(Error)
        if conn.vendor != "postgresql":
            raise UnsupportedConnection(f"Django database {conn.alias!r} is not PostgreSQL")

    def state(self) -> State:
        if self.conn.in_atomic_block:
            return State.OPEN
        return State.AUTOCOMMIT if self.conn.get_autocommit() else State.IDLE

    def run(self, statement: str) -> object:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    def savepoint(self) -> AbstractContextManager[object]:
        from django.db import transaction

        atomic: AbstractContextManager[object] = transaction.atomic(using=self.conn.alias)
        return atomic

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()


# (top-level module, class name) of the objects each adapter takes; the object's class and its
# bases are looked at, so a subclass (asyncpg's connection_class, say) is recognised too.
_SYNC: dict[tuple[str, str], Callable[[Any], _Adapter]] = {
    ("psycopg", "Connection"): _Psycopg,
    ("psycopg2", "connection"): _Psycopg2,
    ("sqlalchemy", "Connection"): lambda conn: _SQLAlchemy(conn, session=False),
    ("sqlalchemy", "Session"): lambda conn: _SQLAlchemy(conn, session=True),
    ("django", "ConnectionProxy"): _Django,
    ("django", "BaseDatabaseWrapper"): _Django,
}
_ASYNC: dict[tuple[str, str], Callable[[Any], _AsyncAdapter]] = {
    ("psycopg", "AsyncConnection"): _AsyncPsycopg,
    ("sqlalchemy", "AsyncConnection"): lambda conn: _AsyncSQLAlchemy(conn, session=False),
    ("sqlalchemy", "AsyncSession"): lambda conn: _AsyncSQLAlchemy(conn, session=True),
    ("asyncpg", "Connection"): _Asyncpg,
    ("asyncpg", "PoolConnectionProxy"): _Asyncpg,
}


def _kinds(conn: object) -> Iterator[tuple[str, str]]:
    for cls in type(conn).__mro__:
        yield cls.__module__.split(".")[0], cls.__name__


def _adapter(conn: object, api: str) -> _Adapter:
    for kind in _kinds(conn):
        if kind in _SYNC:
            return _SYNC[kind](conn)
        if kind in _ASYNC:
            raise UnsupportedConnection(f"{api} got an asyncio connection: use a{api}")
    raise UnsupportedConnection(f"{api}: {type(conn).__module__}.{type(conn).__name__} is not "
                                "a connection lockdiag knows")  # fmt: skip


def _async_adapter(conn: object, api: str) -> _AsyncAdapter:
    for kind in _kinds(conn):
        if kind in _ASYNC:
            return _ASYNC[kind](conn)
        if kind in _SYNC:
            raise UnsupportedConnection(f"{api} got a blocking connection: use {api[1:]}")
    raise UnsupportedConnection(f"{api}: {type(conn).__module__}.{type(conn).__name__} is not "
                                "a connection lockdiag knows")  # fmt: skip


# -- sync ------------------------------------------------------------------------------------


def _run(adapter: _Adapter, plan: Plan, statement: str) -> object:
    """Run STATEMENT the way PLAN says."""
    if plan == "savepoint":
        with adapter.savepoint():
            return adapter.run(statement)
    if plan == "alone":
        return adapter.run(statement)
    try:
        value = adapter.run(statement)
    except BaseException:
        try:
            adapter.rollback()  # the transaction this statement began, nothing else
        except adapter.errors as error:
            log.warning("lockdiag: rollback after a failed lock statement failed: %s", error)
        raise
    if plan == "own transaction":
        adapter.commit()
    return value


def _take(
    adapter: _Adapter,
    kind: Kind,
    namespace: str,
    key: LockTriple,
    wait: bool,
    timeout: float | None,
    events: Events | None,
) -> bool:
    plan = _plan(kind, adapter.state())
    with _Attempt(namespace, kind, key, timeout, events) as attempt:
        return attempt.done(_run(adapter, plan, _lock_statement(kind, key, wait, timeout)))


def xact_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """Take NAMESPACE RESOURCE's transaction-level lock; True when taken, False when busy.

    It must run inside a transaction (``with conn.transaction():``, ``with conn.begin():``,
    ``with transaction.atomic():``, or a connection not in autocommit mode): outside one it
    raises NotInTransaction rather than take a lock that would vanish at once. With
    ``wait=True`` it waits, at most ``timeout`` seconds when given (LockTimeout, and the
    caller's transaction goes on). The lock ends with the transaction; run the protected
    statements on this connection, in this transaction.
    """
    adapter = _adapter(conn, "xact_lock")
    key = _key(namespace, resource, registry or load_registry())
    if adapter.state() is State.AUTOCOMMIT:
        raise _refused(adapter, "xact_lock")
    return _take(adapter, "xact", namespace, key, wait, timeout, events)


@contextmanager
def session_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> Iterator[bool]:
    """A session-level lock for the block: yields whether it was taken.

    On the way out (normally, by an exception, by a cancellation) it is unlocked exactly once
    if it was taken, and an unlock that finds no lock held is logged and counted, not
    ignored. Taken inside a transaction, it stays held after a rollback (PostgreSQL's rule:
    session locks ignore transactions), and it is still released on the way out: inside a
    transaction the block runs in a savepoint, so a failed statement in it cannot leave the
    unlock unable to run. Refused (PooledSession) through a PgBouncer of the registry's
    ``[poolers]`` in transaction or statement pooling.
    """
    adapter = _adapter(conn, "session_lock")
    chosen = registry or load_registry()
    key = _key(namespace, resource, chosen)
    if chosen.poolers.pgbouncer or chosen.poolers.addresses:
        where = _run(adapter, _plan("unlock", adapter.state()), _CLIENT_ADDRESS)
        _check_pooler(chosen, namespace, str(where) if where else None)
    taken = _take(adapter, "session", namespace, key, wait, timeout, events)
    held_since, state = time.monotonic(), adapter.state()
    try:
        if taken and state is State.OPEN:
            with adapter.savepoint():
                yield taken
        else:
            yield taken
    finally:
        if taken:
            _unlock(adapter, namespace, key, held_since, events, state is State.IDLE)


def _unlock(
    adapter: _Adapter,
    namespace: str,
    key: LockTriple,
    held_since: float,
    events: Events | None,
    began_idle: bool,
) -> None:
    """Unlock, and report what the unlock found. When the block began a transaction itself
    (the connection was idle, not in autocommit mode) and a failed statement aborted it, the
    unlock cannot run in it: that transaction, which can only be rolled back, is rolled back
    and the unlock runs on its own."""
    statement = f"SELECT {_call('pg_advisory_unlock', key)}"
    try:
        value = _run(adapter, _plan("unlock", adapter.state()), statement)
    except adapter.errors as error:  # a broken connection: its session, and the lock, are gone
        if not began_idle:
            _released(adapter, namespace, key, None, error, held_since, events)
            return
        try:
            adapter.rollback()
            value = _run(adapter, _plan("unlock", adapter.state()), statement)
        except adapter.errors as again:
            _released(adapter, namespace, key, None, again, held_since, events)
            return
    _released(adapter, namespace, key, value, None, held_since, events)


# -- async: the same rules, awaited ---------------------------------------------------------


async def _arun(adapter: _AsyncAdapter, plan: Plan, statement: str) -> object:
    """:func:`_run`, awaited."""
    if plan == "savepoint":
        async with adapter.savepoint():
            return await adapter.run(statement)
    if plan == "alone":
        return await adapter.run(statement)
    try:
        value = await adapter.run(statement)
    except BaseException:
        try:
            await adapter.rollback()
        except adapter.errors as error:
            log.warning("lockdiag: rollback after a failed lock statement failed: %s", error)
        raise
    if plan == "own transaction":
        await adapter.commit()
    return value


async def _atake(
    adapter: _AsyncAdapter,
    kind: Kind,
    namespace: str,
    key: LockTriple,
    wait: bool,
    timeout: float | None,
    events: Events | None,
) -> bool:
    plan = _plan(kind, await adapter.state())
    with _Attempt(namespace, kind, key, timeout, events) as attempt:
        return attempt.done(await _arun(adapter, plan, _lock_statement(kind, key, wait, timeout)))


async def axact_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """:func:`xact_lock` for an asyncio connection."""
    adapter = _async_adapter(conn, "axact_lock")
    key = _key(namespace, resource, registry or load_registry())
    if await adapter.state() is State.AUTOCOMMIT:
        raise _refused(adapter, "axact_lock")
    return await _atake(adapter, "xact", namespace, key, wait, timeout, events)


@asynccontextmanager
async def asession_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> AsyncIterator[bool]:
    """:func:`session_lock` for an asyncio connection (a cancelled task unlocks too)."""
    adapter = _async_adapter(conn, "asession_lock")
    chosen = registry or load_registry()
    key = _key(namespace, resource, chosen)
    if chosen.poolers.pgbouncer or chosen.poolers.addresses:
        where = await _arun(adapter, _plan("unlock", await adapter.state()), _CLIENT_ADDRESS)
        await asyncio.to_thread(_check_pooler, chosen, namespace, str(where) if where else None)
    taken = await _atake(adapter, "session", namespace, key, wait, timeout, events)
    held_since, state = time.monotonic(), await adapter.state()
    try:
        if taken and state is State.OPEN:
            async with adapter.savepoint():
                yield taken
        else:
            yield taken
    finally:
        if taken:
            await _aunlock(adapter, namespace, key, held_since, events, state is State.IDLE)


async def _aunlock(
    adapter: _AsyncAdapter,
    namespace: str,
    key: LockTriple,
    held_since: float,
    events: Events | None,
    began_idle: bool,
) -> None:
    """:func:`_unlock`, awaited."""
    statement = f"SELECT {_call('pg_advisory_unlock', key)}"
    try:
        value = await _arun(adapter, _plan("unlock", await adapter.state()), statement)
    except adapter.errors as error:
        if not began_idle:
            _released(adapter, namespace, key, None, error, held_since, events)
            return
        try:
            await adapter.rollback()
            value = await _arun(adapter, _plan("unlock", await adapter.state()), statement)
        except adapter.errors as again:
            _released(adapter, namespace, key, None, again, held_since, events)
            return
    _released(adapter, namespace, key, value, None, held_since, events)
