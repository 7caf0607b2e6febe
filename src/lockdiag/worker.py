"""Advisory locks for job workers, taken the way the guidance says, named by the registry.

    from lockdiag.worker import xact_lock, session_lock

    with conn.transaction():
        if not xact_lock(conn, "tenant_summary", 73):
            return "busy"                      # a failed try is not permission to go on
        rebuild_summary(conn, 73)              # same connection, same transaction

    with session_lock(conn, "nightly_export", 1, wait=True, timeout=30) as taken:
        ...                                    # unlocked exactly once on the way out

What each helper guarantees: the key comes from the registry (the CLI decodes what workers
take); a transaction lock is only taken inside a transaction; the boolean of a try is
returned, never hidden; a waiting lock gives up after ``timeout`` (LockTimeout) without
aborting the caller's transaction, and leaves the caller's ``lock_timeout`` (the only setting
a helper touches) as it found it, whatever the outcome; a session lock is unlocked exactly
once whatever ends the block (return, exception, cancellation), and an unlock that finds no
lock is logged and counted. What they cannot guarantee: that an external effect happens
once. Durable job state and constraints still do that; a lock only keeps two workers from
doing the same work at the same time.

Every attempt, wait, hold and outcome is reported to ``events`` (a callable), or to the default
set with :func:`report_to` (for instance :class:`PrometheusEvents`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

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


def _key(namespace: str, resource: tuple[object, ...], registry: Registry | None) -> LockTriple:
    """The registry's key: one integer, or the namespace's parts in order."""
    return (registry or load_registry()).key(namespace, *resource).triple


def _call(function: str, key: LockTriple) -> sql.Composed:
    arguments = sql.SQL(", ").join(sql.Literal(arg) for arg in key.args)
    return sql.SQL("pg_catalog.{}({})").format(sql.Identifier(function), arguments)


def _statement(function: str, key: LockTriple) -> sql.Composed:
    return sql.SQL("SELECT {}").format(_call(function, key))


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
    " pg_catalog.set_config('lock_timeout', {timeout}, true) OFFSET 0) AS caller"
)


def _lock_statement(kind: Kind, key: LockTriple, wait: bool, timeout: float | None) -> sql.Composed:
    """The one statement that takes the lock: a try, a wait, or a wait of at most TIMEOUT."""
    xact = "xact_" if kind == "xact" else ""
    function = f"pg_advisory_{xact}lock" if wait else f"pg_try_advisory_{xact}lock"
    if not wait or timeout is None:
        return _statement(function, key)
    return sql.SQL(_WAIT).format(
        lock=_call(function, key),
        timeout=sql.Literal(f"{max(1, int(timeout * 1000))}ms"),
    )


def _on_its_own(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], kind: Kind) -> bool:
    """No transaction open, and the lock statement may run without a savepoint (one round
    trip): in autocommit mode it is its own transaction, nothing of the caller's to protect
    and nothing it sets outlives it; a transaction lock on a connection not in autocommit mode
    opens the caller's transaction (psycopg begins one before the first statement), so the
    lock lasts until the caller commits; if the statement fails, that transaction is rolled
    back and the connection is as it was. Otherwise it runs in a savepoint inside the caller's
    transaction, or (a session lock, not in autocommit mode) in a transaction of its own."""
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    return idle and (conn.autocommit or kind == "xact")


def _taken(row: tuple[Any, ...] | None) -> bool:
    """A try's boolean; a wait's void (an empty string) is a lock taken."""
    return bool(row and row[0] is not False)


# -- sync ------------------------------------------------------------------------------------


def xact_lock(
    conn: psycopg.Connection[Any],
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """Take NAMESPACE RESOURCE's transaction-level lock; True when taken, False when busy.

    It must run inside a transaction (``with conn.transaction():``, or a connection that is
    not in autocommit mode): outside one it raises NotInTransaction rather than take a lock
    that would vanish at once. With ``wait=True`` it waits, at most ``timeout`` seconds when
    given (LockTimeout, and the caller's transaction goes on). The lock ends with the
    transaction; run the protected statements on this connection, in this transaction.
    """
    key = _key(namespace, resource, registry)
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "xact_lock needs a transaction: a transaction-level lock taken in autocommit mode "
            "ends at once; use `with conn.transaction():`"
        )
    return _take(conn, "xact", namespace, key, wait, timeout, events)


def _take(
    conn: psycopg.Connection[Any],
    kind: Kind,
    namespace: str,
    key: LockTriple,
    wait: bool,
    timeout: float | None,
    events: Events | None,
) -> bool:
    statement = _lock_statement(kind, key, wait, timeout)
    started = time.monotonic()
    result: Result = "error"
    try:
        if _on_its_own(conn, kind):
            try:
                row = conn.execute(statement).fetchone()
            except psycopg.Error:
                if not conn.autocommit and not conn.broken:
                    conn.rollback()  # the transaction this statement opened, nothing else
                raise
        else:
            with conn.transaction():  # a savepoint: a timeout leaves the caller's transaction be
                row = conn.execute(statement).fetchone()
        taken = _taken(row)
        result = "acquired" if taken else "busy"
        return taken
    except psycopg.errors.LockNotAvailable:
        result = "timeout"
        raise _timed_out(namespace, key, timeout) from None
    finally:
        _emit(events, Event(namespace, kind, "attempt", result, time.monotonic() - started))


def _timed_out(namespace: str, key: LockTriple, timeout: float | None) -> LockTimeout:
    """A wait that ran out: of TIMEOUT, or, without one, of the caller's own lock_timeout."""
    within = "the caller's lock_timeout" if timeout is None else f"{timeout:g}s"
    return LockTimeout(f"{namespace} {key.args}: not granted within {within}")


@contextmanager
def session_lock(
    conn: psycopg.Connection[Any],
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
    unlock unable to run.
    """
    key = _key(namespace, resource, registry)
    taken = _take(conn, "session", namespace, key, wait, timeout, events)
    held_since = time.monotonic()
    try:
        if taken and conn.info.transaction_status == TransactionStatus.INTRANS:
            with conn.transaction():
                yield taken
        else:
            yield taken
    finally:
        if taken:
            _unlock(conn, namespace, key, held_since, events)


def _unlock(
    conn: psycopg.Connection[Any],
    namespace: str,
    key: LockTriple,
    held_since: float,
    events: Events | None,
) -> None:
    try:
        row = conn.execute(_statement("pg_advisory_unlock", key)).fetchone()
    except psycopg.Error as error:  # a broken connection: its session, and the lock, are gone
        _released(namespace, key, None, error, held_since, events)
    else:
        _released(namespace, key, row, None, held_since, events)


def _released(
    namespace: str,
    key: LockTriple,
    row: Any,
    error: psycopg.Error | None,
    held_since: float,
    events: Events | None,
) -> None:
    """Log and report what an unlock found: released, not held, or failed."""
    if error is not None:
        result = "error"
        log.warning("lockdiag: %s %s: unlock failed: %s", namespace, key.args, error)
    elif row and row[0]:
        result = "ok"
    else:
        result = "not-held"
        log.warning("lockdiag: %s %s was not held when unlocked", namespace, key.args)
    _emit(events, Event(namespace, "session", "release", result, time.monotonic() - held_since))


@contextmanager
def work(namespace: str, *, events: Events | None = None) -> Iterator[None]:
    """Record the outcome of the protected work (ok, or error when it raises)."""
    try:
        yield
    except BaseException:
        _emit(events, Event(namespace, None, "outcome", "error"))
        raise
    _emit(events, Event(namespace, None, "outcome", "ok"))


# -- async: the same helpers for psycopg.AsyncConnection ------------------------------------


async def axact_lock(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """:func:`xact_lock` for an AsyncConnection."""
    key = _key(namespace, resource, registry)
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "axact_lock needs a transaction: a transaction-level lock taken in autocommit "
            "mode ends at once; use `async with conn.transaction():`"
        )
    return await _atake(conn, "xact", namespace, key, wait, timeout, events)


async def _atake(
    conn: psycopg.AsyncConnection[Any],
    kind: Kind,
    namespace: str,
    key: LockTriple,
    wait: bool,
    timeout: float | None,
    events: Events | None,
) -> bool:
    statement = _lock_statement(kind, key, wait, timeout)
    started = time.monotonic()
    result: Result = "error"
    try:
        if _on_its_own(conn, kind):
            try:
                row = await (await conn.execute(statement)).fetchone()
            except psycopg.Error:
                if not conn.autocommit and not conn.broken:
                    await conn.rollback()  # the transaction this statement opened, nothing else
                raise
        else:
            async with conn.transaction():
                row = await (await conn.execute(statement)).fetchone()
        taken = _taken(row)
        result = "acquired" if taken else "busy"
        return taken
    except psycopg.errors.LockNotAvailable:
        result = "timeout"
        raise _timed_out(namespace, key, timeout) from None
    finally:
        _emit(events, Event(namespace, kind, "attempt", result, time.monotonic() - started))


@asynccontextmanager
async def asession_lock(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> AsyncIterator[bool]:
    """:func:`session_lock` for an AsyncConnection (a cancelled task unlocks too)."""
    key = _key(namespace, resource, registry)
    taken = await _atake(conn, "session", namespace, key, wait, timeout, events)
    held_since = time.monotonic()
    try:
        if taken and conn.info.transaction_status == TransactionStatus.INTRANS:
            async with conn.transaction():
                yield taken
        else:
            yield taken
    finally:
        if taken:
            try:
                cursor = await conn.execute(_statement("pg_advisory_unlock", key))
                row = await cursor.fetchone()
            except psycopg.Error as error:
                _released(namespace, key, None, error, held_since, events)
            else:
                _released(namespace, key, row, None, held_since, events)
