"""When commands that read over time read the lock table, and their loops' housekeeping.

:class:`Pacer` decides when a sampler (the exporter's, `sample`, `watch`) reads pg_locks: when
a cheap probe of the backends changed, within a duty cycle. What the reads show over time is
:mod:`lockdiag.core.observe`'s.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple


class Backend(NamedTuple):
    """One client backend as the cheap probe sees it (probe_activity.sql's columns, which
    tests/test_query_rows.py checks against these names)."""

    pid: int
    backend_start: datetime | None
    state: str | None
    state_change: datetime | None
    wait_event_type: str | None
    wait_event: str | None


# what a cheap probe of pg_stat_activity says of the backends: a full read of pg_locks is
# worth its cost only when this has changed (a new waiter, a holder gone idle, a new backend)
Activity = frozenset[tuple[object, ...]]  # of Backend rows
STALE_AFTER = 60.0  # seconds: a full read at least this often, when the duty cycle allows it


@dataclass
class Pacer:
    """When a sampler reads the whole lock table. Reading pg_locks takes every lock-manager
    partition lock and copies the table, so those reads may keep the server busy ``duty`` of
    the wall time at most, whatever the lock count: a read that took ``d`` seconds allows the
    next one ``d / duty`` seconds after it began. Within that budget a read is due when a cheap
    probe of the backends (:data:`Activity`) changed since the last read, or when the last
    read is older than ``stale`` seconds. Times are ``time.monotonic()`` seconds."""

    duty: float = 0.01
    stale: float = STALE_AFTER
    started: float | None = None
    allowed: float = 0.0  # no read before this
    last: float | None = None  # when the last read began
    seen: Activity | None = None  # the probe at the last read
    busy: float = 0.0  # seconds spent in reads
    reads: int = 0
    gaps: list[float] = field(default_factory=list)  # between the last reads' starts

    def due(self, now: float, activity: Activity | None) -> bool:
        """Whether to read now; ``activity`` None: no probe (read whenever allowed)."""
        if self.started is None:
            self.started = now
        if now < self.allowed:
            return False
        if self.last is None or activity is None:
            return True
        return activity != self.seen or now - self.last >= self.stale

    def read(self, began: float, seconds: float, activity: Activity | None) -> None:
        """A read that began at ``began`` and kept the server ``seconds``."""
        if self.started is None:
            self.started = began
        if self.last is not None:
            self.gaps = [*self.gaps[-9:], began - self.last]
        self.allowed = began + seconds / self.duty
        self.last, self.seen = began, activity
        self.busy += seconds
        self.reads += 1

    def spent(self, seconds: float) -> None:
        """Work a read caused after it (its analysis, on another thread): it counts in the
        duty cycle as the read itself does."""
        self.allowed += seconds / self.duty
        self.busy += seconds

    def forget(self) -> None:
        """After a failed read or probe: what was read no longer holds, so the next probe
        reads, whatever the duty cycle."""
        self.last, self.seen, self.allowed = None, None, 0.0

    def duty_cycle(self, now: float) -> float:
        """The share of wall time spent in reads since the first probe."""
        elapsed = now - self.started if self.started is not None else 0.0
        return self.busy / elapsed if elapsed > 0 else 0.0

    @property
    def interval(self) -> float | None:
        """The mean time between the last reads (up to ten), None before the second."""
        return sum(self.gaps) / len(self.gaps) if self.gaps else None


COLLECT_EVERY = 30  # refreshes or samples between two runs of the cycle collector


def collect_now_and_then(iteration: int) -> None:
    """Run Python's cycle collector every COLLECT_EVERY iterations of a long-running loop.

    main() turns automatic collection off, and watch and sample keep it off: its passes would
    rescan every live lock object again and again, which tripled the time of a refresh at
    100k locks. What only the collector frees (exception tracebacks, renderables that refer
    to each other) is freed here instead, at the cost of one pass a minute or so.
    """
    if iteration % COLLECT_EVERY == COLLECT_EVERY - 1:
        gc.collect()
