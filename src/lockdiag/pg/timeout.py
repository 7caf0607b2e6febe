"""``--timeout``, one value for the four things it sets, and the time left of an exchange.

A :class:`Timeout` is what the option says, carried whole from the command line to each
connection: the server's own limits (statement_timeout and lock_timeout of lockdiag's session,
:attr:`Timeout.milliseconds`), libpq's connect_timeout (:attr:`Timeout.connect`), the client's
deadline on each round trip (:attr:`Timeout.deadline`: the timeout plus a margin, so that a
live but slow server's own "canceling statement due to statement timeout" arrives first) and
the budget of a whole exchange (:meth:`Timeout.budget`: a one-shot command, one refresh of
`watch` or `sample`, one scrape, connecting and every round trip included).

A :class:`Budget` is a Timeout started: the time of one exchange, until ``ends_at``.
:mod:`lockdiag.pg.deadline` holds every round trip to it.

Pure: no driver is imported here (a command that reads a file parses --timeout too).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

MARGIN_FRACTION = 0.2  # of the timeout: after statement_timeout, the server's error is on its way
MARGIN_MIN = 1.0  # seconds: room for the server's error to arrive over a slow link
MARGIN_MAX = 5.0
DEFAULT_SECONDS = 5.0


def seconds_text(seconds: float) -> str:
    """``2.5s``: a duration as messages say it."""
    return f"{round(seconds, 2):g}s"


def libpq_seconds(seconds: float) -> str:
    """libpq's connect_timeout for ``seconds`` (whole seconds, at least 2: libpq treats 1 as 2
    anyway)."""
    return str(max(2, math.ceil(seconds)))


@dataclass(frozen=True)
class Timeout:
    """What ``--timeout`` allows a conversation with a server, in seconds."""

    seconds: float = DEFAULT_SECONDS

    @classmethod
    def of(cls, value: Timeout | float) -> Timeout:
        """A Timeout, from the documented Python API's seconds too."""
        return value if isinstance(value, Timeout) else cls(float(value))

    @property
    def margin(self) -> float:
        """Seconds past the server's own limit before lockdiag gives up on a round trip."""
        return min(MARGIN_MAX, max(MARGIN_MIN, self.seconds * MARGIN_FRACTION))

    @property
    def deadline(self) -> float:
        """How long a round trip may go unanswered on the client: the timeout plus its margin."""
        return self.seconds + self.margin

    @property
    def milliseconds(self) -> int:
        """The server's statement_timeout and lock_timeout of lockdiag's own session."""
        return max(1, int(self.seconds * 1000))

    @property
    def connect(self) -> str:
        """libpq's connect_timeout."""
        return libpq_seconds(self.seconds)

    def at_most(self, seconds: float) -> Timeout:
        """This timeout, or ``seconds`` if shorter (never below zero): what is left of a
        longer exchange (a refresh near the end of `sample`)."""
        return self if seconds >= self.seconds else Timeout(max(0.0, seconds))

    def plus(self, seconds: float) -> Timeout:
        """A longer exchange: terminate's action waits for the backend on top of it."""
        return Timeout(self.seconds + seconds)

    def started(self) -> Budget:
        """This timeout's budget, from now."""
        return Budget(self, time.monotonic() + self.deadline)

    def budget(self) -> contextlib.AbstractContextManager[Budget]:
        """Everything sent to any server inside the block, by this thread, connecting
        included, ends within the timeout plus its margin from now; a block inside another
        ends no later than the outer one."""
        return _budget(self)

    def __str__(self) -> str:
        return seconds_text(self.seconds)


DEFAULT_TIMEOUT = Timeout()  # --timeout's default


@dataclass(frozen=True)
class Budget:
    """The time of one exchange with servers: its ``timeout`` and margin, until ``ends_at``
    (time.monotonic())."""

    timeout: Timeout
    ends_at: float

    @property
    def seconds(self) -> float:
        return self.timeout.deadline

    def left(self) -> float:
        return self.ends_at - time.monotonic()


_BUDGET: ContextVar[Budget | None] = ContextVar("lockdiag_budget", default=None)


def current_budget() -> Budget | None:
    """The budget of the exchange this thread is in, if any."""
    return _BUDGET.get()


@contextlib.contextmanager
def _budget(timeout: Timeout) -> Iterator[Budget]:
    outer = _BUDGET.get()
    whole = timeout.started()
    if outer is not None and outer.ends_at <= whole.ends_at:
        whole = outer
    token = _BUDGET.set(whole)
    try:
        yield whole
    finally:
        _BUDGET.reset(token)
