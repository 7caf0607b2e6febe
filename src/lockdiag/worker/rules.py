"""The rules, written once for sync and async: which statement takes or releases a lock, how it
runs in each connection state, how the caller's ``lock_timeout`` is put back, and what is
reported.

Each rule (:func:`take_xact`, :func:`take_session`, :func:`unlock`) is a generator of steps: ask
the connection's state, run a statement (in a savepoint or not), commit, roll back, run a check
that may block. The executors (``sync.execute``, ``aio.execute``) perform each step on a
driver's adapter, send its value back, or throw its error in, where the rule handles it as if it
had made the call itself.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Literal, Protocol, TypeAlias, TypeVar

from lockdiag.keys import LockTriple
from lockdiag.registry import Registry, load_registry
from lockdiag.worker.errors import LockTimeout, NotInTransaction
from lockdiag.worker.events import Event, Events, Kind, Result, emit
from lockdiag.worker.poolers import check_pooler

log = logging.getLogger("lockdiag.worker")

T = TypeVar("T")


# -- the statements --------------------------------------------------------------------------
#
# Plain SQL text, the same for every driver (each has its own parameter style). Only integers
# are formatted into it, by int(): the registry's key numbers and the timeout in milliseconds.
# CAST(n AS integer), not n::integer: -2147483648::integer is -(2147483648::integer), an
# overflow.


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


def lock_statement(kind: Kind, key: LockTriple, wait: bool, timeout: float | None) -> str:
    """The one statement that takes the lock: a try, a wait, or a wait of at most TIMEOUT."""
    xact = "xact_" if kind == "xact" else ""
    function = f"pg_advisory_{xact}lock" if wait else f"pg_try_advisory_{xact}lock"
    if not wait or timeout is None:
        return f"SELECT {_call(function, key)}"
    return _WAIT.format(lock=_call(function, key), timeout=max(1, int(timeout * 1000)))


def unlock_statement(key: LockTriple) -> str:
    return f"SELECT {_call('pg_advisory_unlock', key)}"


def _taken(value: object) -> bool:
    """A try's boolean; a wait's void (psycopg: an empty string, asyncpg: None) is taken."""
    return value is not False


# The server address of this session as the server sees it: behind PgBouncer, the pooler's
# server connection, which its console lists as local_addr:local_port (SHOW SERVERS).
CLIENT_ADDRESS = (
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


# -- the connection, as the rules see it ------------------------------------------------------


class State(enum.Enum):
    """Where the connection is, in the driver's own terms, reduced to what the rules need."""

    AUTOCOMMIT = "autocommit"  # no transaction; each statement is its own
    IDLE = "idle"  # no transaction; the next statement begins one (psycopg2, autobegin)
    OPEN = "open"  # in a transaction (also a failed one: its statements fail)


class Facts(Protocol):
    """What the rules read from a driver's adapter, sync or async, besides its steps."""

    driver: str
    errors: tuple[type[BaseException], ...]  # what a failed statement raises
    how_to_begin: str  # for NotInTransaction
    if_unlock_failed: str  # what a failed unlock may leave behind, for the log


Plan = Literal["alone", "alone, rolled back on failure", "own transaction", "savepoint"]


def plan(kind: Kind | Literal["unlock"], state: State) -> Plan:
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


# -- the steps an executor performs -----------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Run STATEMENT (in a savepoint when asked); its value is the first column of the first
    row, or None."""

    statement: str
    savepoint: bool = False


@dataclass(frozen=True)
class Check:
    """Call a check that may block (it may read a PgBouncer console): the async executor runs
    it in a thread."""

    call: Callable[[], None]


Step: TypeAlias = Run | Check | Literal["state", "commit", "rollback"]
Steps: TypeAlias = Generator[Step, object, T]


@dataclass(frozen=True)
class Request:
    """One helper's call: the registry's key of the lock, and how long it may wait."""

    namespace: str
    key: LockTriple
    wait: bool
    timeout: float | None
    registry: Registry
    events: Events | None

    @classmethod
    def of(
        cls,
        namespace: str,
        resource: tuple[object, ...],
        wait: bool,
        timeout: float | None,
        registry: Registry | None,
        events: Events | None,
    ) -> Request:
        """The key from the registry (one integer, or the namespace's parts in order)."""
        chosen = registry or load_registry()
        key = chosen.key(namespace, *resource).triple
        return cls(namespace, key, wait, timeout, chosen, events)


@dataclass(frozen=True)
class Held:
    """A session lock's attempt: whether it was taken, when, and where the connection was."""

    taken: bool
    since: float
    state: State

    @property
    def in_savepoint(self) -> bool:
        """Taken inside a transaction: the block runs in a savepoint, so a failed statement in
        it cannot leave the unlock unable to run."""
        return self.taken and self.state is State.OPEN


# -- the rules --------------------------------------------------------------------------------


def _state() -> Steps[State]:
    state = yield "state"
    assert isinstance(state, State)
    return state


def _run(facts: Facts, how: Plan, statement: str) -> Steps[object]:
    """Run STATEMENT the way HOW says."""
    if how in ("savepoint", "alone"):
        return (yield Run(statement, savepoint=how == "savepoint"))
    try:
        value = yield Run(statement)
    except BaseException:
        try:
            yield "rollback"  # the transaction this statement began, nothing else
        except facts.errors as error:
            log.warning("lockdiag: rollback after a failed lock statement failed: %s", error)
        raise
    if how == "own transaction":
        yield "commit"
    return value


class _Attempt:
    """Times one attempt, turns a lock timeout into LockTimeout, and reports the result."""

    def __init__(self, kind: Kind, request: Request) -> None:
        self.kind, self.request = kind, request
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
        request = self.request
        emit(request.events, Event(request.namespace, self.kind, "attempt", self.result, waited))
        if timed_out:
            within = (
                "the caller's lock_timeout" if request.timeout is None else f"{request.timeout:g}s"
            )
            key = request.key.describe()  # (4102, 73), as SQL writes it, not a Python tuple
            raise LockTimeout(f"{request.namespace} {key}: not granted within {within}")


def _take(facts: Facts, kind: Kind, request: Request) -> Steps[bool]:
    how = plan(kind, (yield from _state()))
    with _Attempt(kind, request) as attempt:
        statement = lock_statement(kind, request.key, request.wait, request.timeout)
        return attempt.done((yield from _run(facts, how, statement)))


def take_xact(facts: Facts, api: str, request: Request) -> Steps[bool]:
    """A transaction lock, refused outside a transaction: it would end at once."""
    if (yield from _state()) is State.AUTOCOMMIT:
        raise NotInTransaction(
            f"{api} needs a transaction: a transaction-level lock taken in autocommit mode "
            f"ends at once; {facts.how_to_begin}"
        )
    return (yield from _take(facts, "xact", request))


def take_session(facts: Facts, request: Request) -> Steps[Held]:
    """A session lock, refused through a pooler of the registry that would hand it on."""
    registry = request.registry
    if registry.poolers.pgbouncer or registry.poolers.addresses:
        where = yield from _run(facts, plan("unlock", (yield from _state())), CLIENT_ADDRESS)
        address = str(where) if where else None
        yield Check(partial(check_pooler, registry, request.namespace, address))
    taken = yield from _take(facts, "session", request)
    return Held(taken, time.monotonic(), (yield from _state()))


def unlock(facts: Facts, request: Request, held: Held) -> Steps[None]:
    """Unlock, and report what the unlock found. When the block began a transaction itself
    (the connection was idle, not in autocommit mode) and a failed statement aborted it, the
    unlock cannot run in it: that transaction, which can only be rolled back, is rolled back
    and the unlock runs on its own."""
    statement = unlock_statement(request.key)
    try:
        value = yield from _run(facts, plan("unlock", (yield from _state())), statement)
    except facts.errors as error:  # a broken connection: its session, and the lock, are gone
        if held.state is not State.IDLE:
            _released(facts, request, held, None, error)
            return
        try:
            yield "rollback"
            value = yield from _run(facts, plan("unlock", (yield from _state())), statement)
        except facts.errors as again:
            _released(facts, request, held, None, again)
            return
    _released(facts, request, held, value, None)


def _released(
    facts: Facts, request: Request, held: Held, value: object, error: BaseException | None
) -> None:
    """Log and report what an unlock found: released, not held, or failed."""
    key = request.key.describe()
    if error is not None:
        result = "error"
        log.warning(
            "lockdiag: %s %s: unlock failed: %s%s",
            request.namespace,
            key,
            error,
            facts.if_unlock_failed,
        )
    elif value:
        result = "ok"
    else:
        result = "not-held"
        log.warning(
            "lockdiag: %s %s was not held when unlocked%s",
            request.namespace,
            key,
            facts.if_unlock_failed,
        )
    held_for = time.monotonic() - held.since
    emit(request.events, Event(request.namespace, "session", "release", result, held_for))
