"""What check finds and reports: a finding's kind and severity (the policy's thresholds are
core.policy's), the finding, the census of one pass over every lock, and the report with its
status."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from lockdiag.core.analysis import Flag, LockEntry, namespace_of
from lockdiag.core.catalogue import Known
from lockdiag.core.graph import Blockers
from lockdiag.core.leaders import NO_CONTENTION, Contention
from lockdiag.core.model import Snapshot
from lockdiag.core.ownership import (
    Ownership,
)
from lockdiag.core.policy import Severity

SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class Kind(str, Enum):
    """A finding's kind, in the order findings of one severity are listed."""

    OUTLIVED_CLIENT = "outlived-client"
    SESSION_LOCK = "session-lock"
    LONG_WAIT = "long-wait"
    STUCK_OWNER = "stuck-owner"
    BLOCKED_MANY = "blocked-many"
    UNREGISTERED = "unregistered"
    EXPECT_VIOLATED = "expect-violated"
    MAX_HOLD = "max-hold"
    MAX_WAIT = "max-wait"
    LOCK_QUEUE = "lock-queue"
    STALLED = "stalled"

    def __str__(self) -> str:
        return self.value


# kinds whose value is a lower bound on a duration (PostgreSQL records no acquisition time)
LOWER_BOUND_KINDS = frozenset(
    {Kind.OUTLIVED_CLIENT, Kind.SESSION_LOCK, Kind.STUCK_OWNER, Kind.EXPECT_VIOLATED, Kind.MAX_HOLD}
)


@dataclass(frozen=True)
class Finding:
    kind: Kind
    severity: Severity
    pid: int | None
    lock: str
    evidence: str
    next_step: str
    entry: LockEntry | None = None  # the first lock it is about
    value: float | None = None  # seconds or a count, for perfdata
    locks: int = 1  # the locks it is about: one backend's, in one namespace where it matters
    root: int | None = None  # a wait's: the root blocker at the head of its chain
    caused: tuple[Finding, ...] = ()  # a cause's: the wait findings of its chains
    # a held lock's: the evidence that its owner's work is over (see core.ownership)
    owner: Ownership | None = None

    @property
    def lower_bound(self) -> bool:
        """Whether ``value`` is a lower bound (a hold, not an exact wait or a count)."""
        return self.kind in LOWER_BOUND_KINDS


@dataclass(frozen=True)
class Census:
    """What one pass over every lock says, for the detectors and for metrics."""

    flagged: dict[Flag, list[LockEntry]]  # the entries carrying each flag, in order
    software: dict[int, Known]  # the well-known software whose lock each backend holds
    waiters: list[LockEntry]  # locks not granted, in order
    # advisory locks by (database, namespace: the registry's, a known software's,
    # "(extension tag)" or "unregistered", "held" or "waiting")
    advisory: dict[tuple[str, str, str], int]
    # the longest lower bound of a certain session lock, or 0 (an extension's tag is not
    # one of the team's session locks)
    oldest_session_lock: float
    # each backend's lock of that software (the first seen), for advice in its terms
    software_locks: dict[int, LockEntry] = field(default_factory=dict)


def census(entries: list[LockEntry]) -> Census:
    flagged: dict[Flag, list[LockEntry]] = {flag: [] for flag in Flag}
    software: dict[int, Known] = {}
    software_locks: dict[int, LockEntry] = {}
    waiters: list[LockEntry] = []
    counted: dict[tuple[object, ...], _Count] = {}  # by identity of namespace and software
    oldest = 0.0
    for entry in entries:
        for flag in entry.flags:
            flagged[flag].append(entry)
        decoded, granted = entry.decoded, entry.lock.granted
        if not granted:
            waiters.append(entry)
        elif (
            entry.lifetime == "session"
            and (entry.held_at_least or 0.0) > oldest
            and entry.lock.advisory_tag is None
        ):
            oldest = entry.held_at_least or 0.0
        if decoded is None:
            if entry.lock.advisory_tag is None:
                continue  # not advisory; an extension's tag is counted as "(extension tag)"
            namespace, known = None, None
        else:
            namespace, known = decoded.namespace, decoded.known
        kind = (entry.database, id(namespace), id(known), granted, decoded is None)
        count = counted.get(kind)
        if count is None:
            count = counted[kind] = _Count(entry)
        count.locks += entry.lock.keys  # a span counts its every lock
        if known is not None and granted:
            pid = entry.lock.pid
            if pid is not None and pid not in software and known.behaviour is not None:
                software[pid], software_locks[pid] = known, entry
    advisory: dict[tuple[str, str, str], int] = {}
    for count in counted.values():
        first = count.first
        state = "held" if first.lock.granted else "waiting"
        key = (first.database or "", namespace_of(first), state)
        advisory[key] = advisory.get(key, 0) + count.locks
    return Census(flagged, software, waiters, advisory, oldest, software_locks)


class _Count:
    __slots__ = ("first", "locks")

    def __init__(self, first: LockEntry) -> None:
        self.first, self.locks = first, 0


@dataclass(frozen=True)
class CheckReport:
    snapshot: Snapshot
    findings: list[Finding]
    entries: list[LockEntry] = field(repr=False)
    graph: Blockers = field(repr=False)
    census: Census = field(repr=False)
    notes: list[str] = field(default_factory=list)
    # leaders and the sessions polling a try-lock: contention that leaves no row in pg_locks
    contention: Contention = field(default=NO_CONTENTION, repr=False)

    @property
    def status(self) -> Literal["OK", "WARNING", "CRITICAL"]:
        severities = {f.severity for f in self.findings}
        if "critical" in severities:
            return "CRITICAL"
        return "WARNING" if "warning" in severities else "OK"
