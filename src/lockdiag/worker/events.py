"""What the helpers report: an event per attempt, release and work outcome, sent to a callable
(``events=``, or the process-wide one of :func:`report_to`); :class:`PrometheusEvents` turns
them into prometheus_client metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["xact", "session"]
Result = Literal["acquired", "busy", "timeout", "error"]


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


def emit(events: Events | None, event: Event) -> None:
    target = events or _default
    if target is not None:
        target(event)


class PrometheusEvents:
    """Events as prometheus_client metrics: attempts by result, wait and hold histograms, and
    work outcomes, per namespace (bounded labels)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        where = REGISTRY if registry is None else registry
        by_kind = ["namespace", "kind"]
        self.attempts = Counter(
            "lockdiag_worker_lock_attempts",
            "Lock attempts, by namespace, kind and result.",
            [*by_kind, "result"],
            registry=where,
        )
        self.waits = Histogram(
            "lockdiag_worker_lock_wait_seconds",
            "Time spent taking a lock.",
            by_kind,
            registry=where,
        )
        self.holds = Histogram(
            "lockdiag_worker_lock_hold_seconds",
            "Time a lock was held (session locks).",
            by_kind,
            registry=where,
        )
        self.unlocks = Counter(
            "lockdiag_worker_lock_releases",
            "Unlocks, by namespace and result.",
            ["namespace", "result"],
            registry=where,
        )
        self.work = Counter(
            "lockdiag_worker_work",
            "Outcomes of the protected work.",
            ["namespace", "outcome"],
            registry=where,
        )

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
        emit(events, Event(namespace, None, "outcome", "error"))
        raise
    emit(events, Event(namespace, None, "outcome", "ok"))
