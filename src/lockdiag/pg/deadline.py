"""A client-side deadline on every round trip lockdiag has with a server.

statement_timeout is the server's own limit: it cannot help when the server itself is stopped
(SIGSTOP, a frozen VM) or the network path to it silently drops everything: the connection
stays open, the kernel accepts what is sent, and nothing ever comes back. psycopg 3 has no
client-side query timeout, and libpq's connect_timeout covers connection establishment only.

Every connection lockdiag opens comes from :func:`connect`: connection establishment is bounded
by connect_timeout, and each statement sent on the connection (``execute``, through
:class:`BoundedCursor`) is watched by one shared watchdog thread. A statement's deadline is its
budget -- ``--timeout``, which is also the session's statement_timeout -- plus :func:`margin`,
so that a live but slow server's own "canceling statement due to statement timeout" arrives
first; :func:`limit` shortens the budget for a conversation (`sample`'s last snapshots). When a
deadline passes, the watchdog sends a cancel request (bounded: it may go nowhere), then shuts the
connection's socket down: the blocked call wakes with psycopg's OperationalError, the
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
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import RowFactory, tuple_row

from lockdiag.errors import ServerError
from lockdiag.pg.connection import connect_timeout

if TYPE_CHECKING:
    from psycopg.pq.abc import PGconn
    from typing_extensions import Self

MARGIN_FRACTION = 0.2  # of the budget: after statement_timeout, the server's error is on its way
MARGIN_MIN = 1.0  # seconds: room for the server's error to arrive over a slow link
MARGIN_MAX = 5.0
CANCEL_BOUND = 0.5  # seconds the cancel request may take (part of the margin)


def margin(timeout: float) -> float:
    """Seconds past ``timeout`` (the server's statement_timeout) before lockdiag gives up."""
    return min(MARGIN_MAX, max(MARGIN_MIN, timeout * MARGIN_FRACTION))


def client_deadline(timeout: float) -> float:
    """How long a statement may go unanswered: ``timeout`` plus :func:`margin`."""
    return timeout + margin(timeout)


def seconds_text(seconds: float) -> str:
    return f"{round(seconds, 2):g}s"


class NoAnswer(ServerError):
    """The server (or what is in front of it) did not answer within the client's deadline."""


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every statement has a client-side deadline (see the module).

    ``budget`` is the seconds a statement may take on the server (its statement_timeout),
    ``ends_at`` the end of the conversation under way when :func:`limit` set one, ``peer`` and
    ``where`` name the other end in messages."""

    def __init__(self, pgconn: PGconn, row_factory: RowFactory[Any] = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.cursor_factory = BoundedCursor
        self.budget = 5.0
        self.ends_at: float | None = None
        self.peer = "the server"
        self.where = ""
        self.statement_timeout = False  # whether the server was given the budget too
        self.alarm: _Alarm | None = None  # the statement under way


class BoundedCursor(psycopg.Cursor[Any]):
    """Every ``execute`` (``connection.execute`` too) under the connection's deadline."""

    def execute(  # any query psycopg takes (str, bytes, sql.Composed; a Template in 3.3)
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        connection = self.connection
        if not isinstance(connection, BoundedConnection):
            return super().execute(query, params, prepare=prepare, binary=binary)
        with watched(connection):
            return super().execute(query, params, prepare=prepare, binary=binary)


def connect(
    conninfo: str,
    timeout: float,
    peer: str = "the server",
    statement_timeout: bool = False,
    **kwargs: Any,
) -> BoundedConnection:
    """A connection whose statements get ``timeout`` plus :func:`margin` at most, opened within
    libpq's connect_timeout (derived from ``timeout`` too). ``peer`` names the other end in
    messages; ``statement_timeout``: the session has that server-side limit too (lockdiag's
    own session). ``kwargs`` go to psycopg."""
    info = make_conninfo(conninfo, connect_timeout=connect_timeout(timeout))
    connection = BoundedConnection.connect(info, **kwargs)
    connection.budget, connection.peer = timeout, peer
    connection.statement_timeout = statement_timeout
    host = connection.info.host
    host = f"socket {host}" if host.startswith("/") else host
    connection.where = f"{host}:{connection.info.port}"
    return connection


@contextlib.contextmanager
def limit(connection: BoundedConnection, seconds: float | None) -> Iterator[None]:
    """A conversation that must end within ``seconds`` (plus the margin): each of its
    statements gets what is left of that, if less than the connection's budget."""
    if seconds is None:
        yield
        return
    saved = connection.ends_at
    ends_at = time.monotonic() + max(0.0, seconds)
    connection.ends_at = ends_at if saved is None else min(saved, ends_at)
    try:
        yield
    finally:
        connection.ends_at = saved


@contextlib.contextmanager
def watched(connection: BoundedConnection) -> Iterator[None]:
    """One round trip on ``connection`` under its deadline: past it, the call is woken up and
    :class:`NoAnswer` raised (the connection is then closed)."""
    now = time.monotonic()
    budget = connection.budget
    if connection.ends_at is not None:
        budget = min(budget, max(0.0, connection.ends_at - now))
    extra = margin(connection.budget)
    alarm = _Alarm(connection, budget + extra, min(CANCEL_BOUND, extra / 2))
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

    def __init__(self, connection: BoundedConnection, seconds: float, cancel_bound: float):
        self.connection, self.seconds, self.cancel_bound = connection, seconds, cancel_bound
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
        within = seconds_text(self.seconds)
        where = f" ({connection.where})" if connection.where else ""
        hint = (
            f"{connection.peer}, or the network path to it, may be stopped or overloaded; "
            "check it from another session, and raise --timeout if it is only slow"
        )
        if connection.statement_timeout:
            hint = (
                f"even its statement_timeout of {seconds_text(connection.budget)} did not end "
                f"the query: {hint}"
            )
        return NoAnswer(
            f"{connection.peer} did not answer within {within}{where}: lockdiag gave up and "
            "closed its connection",
            hint=hint,
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
