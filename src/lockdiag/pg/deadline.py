"""A client-side deadline on every round trip lockdiag has with a server, and a time budget
for a whole exchange: a one-shot command, one refresh of `watch` or `sample`, one scrape.

statement_timeout is the server's own limit: it cannot help when the server itself is stopped
(SIGSTOP, a frozen VM) or the network path to it silently drops everything: the connection
stays open, the kernel accepts what is sent, and nothing ever comes back. psycopg 3 has no
client-side query timeout, and libpq's connect_timeout covers connection establishment only.
And a server that answers each round trip just in time would make a command of ten round trips
take ten times --timeout.

Every connection lockdiag opens comes from :func:`connect`, and every round trip on it (a
statement, the BEGIN and COMMIT of a transaction: :meth:`BoundedConnection.wait`) is watched by
one shared watchdog thread. Inside a budget (:meth:`lockdiag.pg.timeout.Timeout.budget`: the
diagnostic session opens one for each conversation; `terminate` one for its preview and one
for its action) the whole block has ``--timeout`` plus its margin from its start: connecting
gets what is left of it (libpq's connect_timeout, whole seconds, at least 2), and so does each
round trip, on every connection the block opens (a PgBouncer console's too). Outside one, a
round trip gets ``--timeout`` (the session's statement_timeout too) plus the margin. The margin
lets a live but slow server's own "canceling statement due to statement timeout" arrive first.
When a deadline passes, the watchdog sends a cancel request (bounded: it may go nowhere), then
shuts the connection's socket down: the blocked call wakes with psycopg's OperationalError, the
connection is closed and the caller gets :class:`NoAnswer`, one line with a hint. The next
conversation opens a new connection.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg.rows import RowFactory, tuple_row

from lockdiag.errors import ServerError
from lockdiag.pg.connection import one_line
from lockdiag.pg.timeout import Budget, Timeout, current_budget, libpq_seconds, seconds_text

if TYPE_CHECKING:
    from psycopg.abc import PQGen
    from psycopg.pq.abc import PGconn

RV = TypeVar("RV")

CANCEL_BOUND = 0.5  # seconds the cancel request may take (part of the margin)


class NoAnswer(ServerError):
    """The server (or what is in front of it) did not answer within the client's deadline."""


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every statement has a client-side deadline (see the module).

    ``timeout`` is what a statement may take on the server (its statement_timeout, when
    ``statement_timeout``), ``peer`` and ``where`` name the other end in messages."""

    def __init__(self, pgconn: PGconn, row_factory: RowFactory[Any] = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.timeout = Timeout()
        self.peer = "the server"
        self.where = ""
        self.statement_timeout = False  # whether the server was given the budget too
        self.alarm: _Alarm | None = None  # the statement under way

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        """Every round trip psycopg makes on the connection (a statement, BEGIN and COMMIT of
        ``transaction()``, a rollback) goes through here: each under the deadline."""
        with watched(self):
            return super().wait(gen, *args, **kwargs)


def connect(
    conninfo: str,
    timeout: Timeout,
    peer: str = "the server",
    statement_timeout: bool = False,
    **kwargs: Any,
) -> BoundedConnection:
    """A connection whose statements get ``timeout``'s deadline at most (less in a budget),
    opened within ``timeout`` (or what is left of the budget) as a whole,
    whatever number of hosts the DSN lists. ``peer`` names the other end in messages;
    ``statement_timeout``: the session has that server-side limit too (lockdiag's own
    session). ``kwargs`` go to psycopg.

    libpq's connect_timeout applies to each host (and each address a name resolves to) in
    turn: four silent hosts at 1s took 8s. So the hosts are tried here one at a time (split
    as psycopg does), each with its share of what is left (in libpq's whole seconds, at least
    2), and none once the time is spent."""
    whole = current_budget()
    ends_at = time.monotonic() + timeout.seconds
    if whole is not None:
        if whole.left() <= 0:  # spent: no new connection
            raise NoAnswer(*_ran_out(whole, peer, ""))
        ends_at = min(ends_at, whole.ends_at)
    attempts = conninfo_attempts(conninfo_to_dict(conninfo))
    failures: list[tuple[psycopg.OperationalError, str]] = []
    for number, attempt in enumerate(attempts):
        left = ends_at - time.monotonic()
        if left <= 0 and failures:
            break
        share = left / (len(attempts) - number)  # a silent first host leaves time for the next
        info = make_conninfo("", **{**attempt, "connect_timeout": libpq_seconds(share)})
        try:
            connection = BoundedConnection.connect(info, **kwargs)
        except psycopg.OperationalError as error:
            failures.append((error, _attempt_name(attempt)))
            continue
        connection.timeout, connection.peer = timeout, peer
        connection.statement_timeout = statement_timeout
        host = connection.info.host
        host = f"socket {host}" if host.startswith("/") else host
        connection.where = f"{host}:{connection.info.port}"
        return connection
    raise _not_connected(failures, len(attempts) - len(failures))


def _attempt_name(attempt: dict[str, Any]) -> str:
    host = attempt.get("host") or attempt.get("hostaddr") or "the default host"
    return f"{host}:{attempt['port']}" if attempt.get("port") else str(host)


def _not_connected(
    failures: list[tuple[psycopg.OperationalError, str]], untried: int
) -> psycopg.OperationalError:
    """The error of a connection that failed on every host tried: psycopg's own for one host,
    else each host's in turn, and how many hosts the time left untried."""
    last = failures[-1][0]
    if len(failures) == 1 and not untried:
        return last
    text = "; ".join(f"{name}: {one_line(str(error))}" for error, name in failures)
    if untried:
        text += f"; {untried} more host(s) not tried: the time to connect ran out"
    return type(last)(text)


@contextlib.contextmanager
def watched(connection: BoundedConnection) -> Iterator[None]:
    """One round trip on ``connection`` under its deadline: past it, the call is woken up and
    :class:`NoAnswer` raised (the connection is then closed). In a budget, the
    deadline is what is left of it, if sooner."""
    seconds, whole = connection.timeout.deadline, current_budget()
    if whole is not None and whole.left() < seconds:
        seconds = whole.left()
    else:
        whole = None  # the statement's own deadline comes first
    alarm = _Alarm(connection, seconds, min(CANCEL_BOUND, connection.timeout.margin / 2), whole)
    if seconds <= 0:  # the budget is spent: nothing more is sent
        connection.close()
        raise alarm.no_answer()
    # a descriptor of our own: the same socket until settled, whatever libpq closes meanwhile
    # (if the connection is closed, the statement fails on its own at once)
    with contextlib.suppress(psycopg.Error, OSError):
        alarm.descriptor = os.dup(connection.fileno())
    connection.alarm = alarm
    WATCHDOG.arm(alarm.ends_at - alarm.cancel_bound, alarm)  # the cancel goes first
    try:
        yield
    except BaseException as error:
        if alarm.settle() and isinstance(error, psycopg.Error):
            raise alarm.no_answer() from None
        raise
    finally:
        connection.alarm = None
    if alarm.settle():
        raise alarm.no_answer()


def interrupt(connection: BoundedConnection | None) -> None:
    """Wake the statement under way on ``connection`` now (from another thread), without a
    cancel request: its caller gets :class:`NoAnswer`. Nothing when none is under way."""
    alarm = connection.alarm if connection is not None else None
    if alarm is not None:
        alarm.fire(cancel=False)


class _Alarm:
    """The deadline of one round trip; fired by the watchdog, settled by the caller."""

    def __init__(
        self,
        connection: BoundedConnection,
        seconds: float,
        cancel_bound: float,
        whole: Budget | None = None,
    ) -> None:
        self.connection, self.seconds, self.cancel_bound = connection, seconds, cancel_bound
        self.whole = whole  # the budget that set this deadline, if it was not the statement's
        self.ends_at = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.returned = threading.Event()
        self.settled = False  # the caller's call returned: the socket is no longer ours to touch
        self.fired = False
        self.finished = threading.Event()  # the firing is over (cancel sent, socket shut down)
        self.descriptor: int | None = None  # a duplicate of the connection's socket

    def fire(self, cancel: bool = True) -> None:
        """Send a cancel request, in case the server still listens (it may go nowhere: at most
        ``cancel_bound``); at the deadline, shut the socket down so the blocked call returns."""
        with self.lock:
            if self.settled or self.fired:
                return  # answered meanwhile, or fired already (the watchdog, an interrupt)
            self.fired = True
        try:
            if cancel:
                with contextlib.suppress(Exception):  # a stopped server never answers it
                    self.connection.cancel_safe(timeout=self.cancel_bound)
                # a server that took the cancel answers the query now: let it, until the deadline
                self.returned.wait(max(0.0, self.ends_at - time.monotonic()))
            with self.lock:
                if not self.settled and self.descriptor is not None:
                    _shut_down(self.descriptor)
        finally:
            self.finished.set()

    def settle(self) -> bool:
        """The call returned (answered or woken): whether the deadline had fired. If it had,
        the connection is closed, once the firing is over."""
        with self.lock:
            first, self.settled = not self.settled, True
            fired = self.fired
            if self.descriptor is not None:
                os.close(self.descriptor)
                self.descriptor = None
        self.returned.set()
        if fired and first:
            self.finished.wait(self.cancel_bound + 1.0)
            self.connection.close()
        return fired

    def no_answer(self) -> NoAnswer:
        connection = self.connection
        if self.whole is not None:
            return NoAnswer(*_ran_out(self.whole, connection.peer, connection.where))
        where = f" ({connection.where})" if connection.where else ""
        hint = _SLOW_HINT.format(peer=connection.peer)
        if connection.statement_timeout:
            hint = (
                f"even its statement_timeout of {connection.timeout} did not end the query: {hint}"
            )
        return NoAnswer(
            f"{connection.peer} did not answer within {seconds_text(self.seconds)}{where}: "
            "lockdiag gave up and closed its connection",
            hint=hint,
        )


_SLOW_HINT = (
    "{peer}, or the network path to it, may be stopped or overloaded; check it from another "
    "session, and raise --timeout if it is only slow"
)


def _ran_out(whole: Budget, peer: str, where: str) -> tuple[str, str]:
    """The message and hint of a budget spent before the exchange ended."""
    where = f" ({where})" if where else ""
    return (
        f"{peer} did not answer within {seconds_text(whole.seconds)}{where} (--timeout bounds "
        "the whole exchange, every round trip included, plus a margin): lockdiag gave up and "
        "closed its connection",
        _SLOW_HINT.format(peer=peer),
    )


def _shut_down(descriptor: int) -> None:
    """Shut the socket down (through a duplicate of ``descriptor``, closed at once): psycopg's
    wait sees the end of the stream and raises OperationalError."""
    duplicate = socket.socket(fileno=os.dup(descriptor))
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more: the call is returning anyway
    finally:
        duplicate.close()


class _Watchdog:
    """One thread for every deadline of the process: a heap of alarms, each fired in a thread
    of its own when its time comes (a cancel request that hangs delays no other alarm)."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.heap: list[tuple[float, int, _Alarm]] = []
        self.order = itertools.count()
        self.thread: threading.Thread | None = None

    def arm(self, when: float, alarm: _Alarm) -> None:
        with self.condition:
            heapq.heappush(self.heap, (when, next(self.order), alarm))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True, name="deadlines")
                self.thread.start()
            elif self.heap[0][2] is alarm:
                self.condition.notify()  # sooner than what the thread sleeps for

    def _run(self) -> None:
        while True:
            with self.condition:
                while not self.heap:
                    self.condition.wait()
                when, _, alarm = self.heap[0]
                delay = when - time.monotonic()
                if delay > 0:
                    self.condition.wait(delay)
                    continue
                heapq.heappop(self.heap)
            if not alarm.settled:
                threading.Thread(target=alarm.fire, daemon=True, name="deadline").start()


WATCHDOG = _Watchdog()
