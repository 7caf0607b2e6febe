"""Locks watched over time: what a single snapshot cannot say.

A granted lock carries no acquisition time in pg_locks; seeing it in successive snapshots gives
an observed hold ("seen held for 4m12s") next to the snapshot's lower bound. ``Tracker`` keeps
first-seen times for `watch`; ``Sampler`` accumulates per-key statistics for `sample`. Both are
pure: they read snapshots, never a server.
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from lockdiag.core.analysis import LockEntry, namespace_of

# waits, and idle holds with waiters, shorter than this are ordinary contention: the broad-key
# and stuck-owner patterns count only longer ones
PATTERN_WAIT = 1.0

# how one lock is recognised from one snapshot to the next: the object, who, and the mode
Identity = tuple[object, ...]


def identity(entry: LockEntry) -> Identity:
    lock = entry.lock
    return (*lock.lock_object, lock.pid, lock.mode, lock.granted)


@dataclass
class Tracker:
    """First-seen times across refreshes, and what appeared or went since the last one."""

    first_seen: dict[Identity, datetime] = field(default_factory=dict)
    appeared: set[Identity] = field(default_factory=set)
    gone: list[LockEntry] = field(default_factory=list)
    _last: dict[Identity, LockEntry] = field(default_factory=dict)
    refreshes: int = 0

    def update(self, entries: list[LockEntry], now: datetime) -> None:
        current = {identity(e): e for e in entries}
        self.appeared = set(current) - set(self._last) if self.refreshes else set()
        self.gone = [e for key, e in self._last.items() if key not in current]
        for key in current:
            self.first_seen.setdefault(key, now)
        for key in list(self.first_seen):
            if key not in current:
                del self.first_seen[key]
        self._last = current
        self.refreshes += 1

    def observed(self, entry: LockEntry, now: datetime) -> float | None:
        """Seconds this lock has been seen, when it was seen before this refresh."""
        seen = self.first_seen.get(identity(entry))
        return None if seen is None else max(0.0, (now - seen).total_seconds())


# -- sampling ----------------------------------------------------------------------------------

KeyId = tuple[str | None, str]  # (database, decoded label)


@dataclass
class KeyStats:
    label: str
    database: str | None
    namespace: str | None
    samples_held: int = 0
    samples_waited: int = 0
    holders: set[tuple[str, str]] = field(default_factory=set)  # (application, client)
    waiters: set[tuple[str, str]] = field(default_factory=set)
    names: dict[int, str] = field(default_factory=dict)  # pid: application_name, as last seen
    holder_pids: set[int] = field(default_factory=set)
    waiter_pids: set[int] = field(default_factory=set)
    long_waiter_pids: set[int] = field(default_factory=set)  # seen waiting PATTERN_WAIT or more
    acquisitions: int = 0  # holds that began while sampling (or were there at the start)
    releases: int = 0  # holds that ended while sampling
    longest_hold: float = 0.0  # seconds, observed across samples (plus the idle lower bound)
    longest_wait: float = 0.0  # seconds, from waitstart
    idle_holders: set[int] = field(default_factory=set)  # pids of those idle holds
    idle_holds: int = 0  # samples where a holder idle PATTERN_WAIT or more had waiters

    def who(self, pids: set[int], most: int = 5) -> str:
        """``pid 4163 (billing-worker), pid 9933 ...``: who took part, for a callout."""
        shown = [
            f"pid {pid}" + (f" ({self.names[pid]})" if self.names.get(pid) else "")
            for pid in sorted(pids)[:most]
        ]
        return ", ".join(shown) + (f" and {len(pids) - most} more" if len(pids) > most else "")

    @property
    def contention(self) -> float:
        return self.samples_waited / self.samples_held if self.samples_held else 0.0


@dataclass
class Sampler:
    samples: int = 0
    query_seconds: list[float] = field(default_factory=list)
    keys: dict[KeyId, KeyStats] = field(default_factory=dict)
    _holding: dict[tuple[KeyId, int], datetime] = field(default_factory=dict)
    started: datetime | None = None
    ended: datetime | None = None

    def add(self, entries: list[LockEntry], now: datetime, query_seconds: float) -> None:
        self.samples += 1
        self.query_seconds.append(query_seconds)
        self.started = self.started or now
        self.ended = now
        held_now: dict[tuple[KeyId, int], LockEntry] = {}
        waited: set[KeyId] = set()
        held: set[KeyId] = set()
        for entry in entries:
            if entry.decoded is None or entry.lock.pid is None:
                continue
            key: KeyId = (entry.database, entry.decoded.label)
            stats = self.keys.get(key)
            if stats is None:
                namespace = entry.decoded.namespace.name if entry.decoded.namespace else None
                stats = self.keys[key] = KeyStats(entry.decoded.label, entry.database, namespace)
            session = entry.session
            who = (
                (session.application_name or "") if session else "",
                (session.client_addr or "local") if session else "",
            )
            if entry.lock.granted:
                held.add(key)
                stats.holders.add(who)
                stats.names[entry.lock.pid] = who[0]
                stats.holder_pids.add(entry.lock.pid)
                held_now[(key, entry.lock.pid)] = entry
                if entry.blocks and (entry.held_at_least or 0.0) >= PATTERN_WAIT:
                    stats.idle_holds += 1
                    stats.idle_holders.add(entry.lock.pid)
            else:
                waited.add(key)
                stats.waiters.add(who)
                stats.names[entry.lock.pid] = who[0]
                stats.waiter_pids.add(entry.lock.pid)
                if (entry.waited or 0.0) >= PATTERN_WAIT:
                    stats.long_waiter_pids.add(entry.lock.pid)
                stats.longest_wait = max(stats.longest_wait, entry.waited or 0.0)
        for key in held:
            self.keys[key].samples_held += 1
        for key in waited:
            self.keys[key].samples_waited += 1
        for hold, entry in held_now.items():
            began = self._holding.setdefault(hold, now)
            if began == now:
                self.keys[hold[0]].acquisitions += 1
            observed = (now - began).total_seconds()
            stats = self.keys[hold[0]]
            stats.longest_hold = max(stats.longest_hold, observed, entry.held_at_least or 0.0)
        for hold in [h for h in self._holding if h not in held_now]:
            del self._holding[hold]
            self.keys[hold[0]].releases += 1


@dataclass(frozen=True)
class Pattern:
    kind: str  # stuck-owner, broad-key, duplicate-dispatch
    label: str
    evidence: str


def patterns(sampler: Sampler) -> list[Pattern]:
    """The behaviours an operator must tell apart, from the accumulated statistics."""
    found: list[Pattern] = []
    by_namespace: dict[str | None, list[KeyStats]] = defaultdict(list)
    for stats in sampler.keys.values():
        by_namespace[stats.namespace].append(stats)
    # the two busiest keys of each namespace: the busiest of a key's siblings is one of them
    busiest = {
        namespace: heapq.nlargest(2, group, key=lambda s: s.samples_held)
        for namespace, group in by_namespace.items()
    }
    for stats in sampler.keys.values():
        if stats.samples_waited and stats.idle_holds >= max(2, stats.samples_waited // 2):
            found.append(
                Pattern(
                    "stuck-owner",
                    stats.label,
                    f"held by {stats.who(stats.idle_holders)}, doing nothing, in "
                    f"{stats.idle_holds} sample(s) while {len(stats.waiter_pids)} session(s) "
                    f"waited: {stats.who(stats.waiter_pids)}",
                )
            )
        siblings_held = (s.samples_held for s in busiest[stats.namespace] if s is not stats)
        if (
            stats.namespace is not None
            and len(stats.long_waiter_pids) >= 3
            and len(stats.waiters | stats.holders) >= 2
            and max(siblings_held, default=0) <= stats.samples_held // 4
        ):
            siblings = len(by_namespace[stats.namespace]) - 1
            found.append(
                Pattern(
                    "broad-key",
                    stats.label,
                    f"{len(stats.long_waiter_pids)} distinct sessions waited "
                    f"{PATTERN_WAIT:g}s or more on this one key "
                    f"({stats.who(stats.long_waiter_pids)}) while the namespace's other "
                    f"{siblings} key(s) were mostly idle: the key may serialise unrelated work",
                )
            )
        if len(stats.holder_pids) >= 3 and stats.acquisitions >= 3:
            found.append(
                Pattern(
                    "duplicate-dispatch",
                    stats.label,
                    f"taken {stats.acquisitions} times by {len(stats.holder_pids)} different "
                    f"sessions ({stats.who(stats.holder_pids)}): the same work may be "
                    "dispatched again and again",
                )
            )
    return found


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


# -- episodes, for the exporter's histograms -------------------------------------------------

EpisodeKey = tuple[object, ...]


@dataclass
class Tick:
    """What one sample ended or began, per namespace."""

    holds: list[tuple[str, float]] = field(default_factory=list)  # ended: (namespace, seconds)
    waits: list[tuple[str, float]] = field(default_factory=list)  # ended: (namespace, seconds)
    acquired: dict[str, int] = field(default_factory=dict)  # holds that began
    contended: set[str] = field(default_factory=set)  # namespaces someone waited on


@dataclass
class Episodes:
    """Hold and wait episodes followed from sample to sample. A hold's length is what was
    observed (first to last sight), or the idle lower bound when that is longer; a wait's is
    its time since waitstart at the last sight. Episodes shorter than the interval can be
    missed; none is invented."""

    holds: dict[EpisodeKey, tuple[str, datetime, float]] = field(default_factory=dict)
    waits: dict[EpisodeKey, tuple[str, float]] = field(default_factory=dict)
    started: bool = False

    def add(self, entries: list[LockEntry], now: datetime) -> Tick:
        tick = Tick()
        holds: dict[EpisodeKey, tuple[str, datetime, float]] = {}
        waits: dict[EpisodeKey, tuple[str, float]] = {}
        for entry in entries:
            if entry.decoded is None or entry.lock.pid is None:
                continue
            key = (entry.lock.pid, entry.database, entry.decoded.triple, entry.lock.mode)
            name = namespace_of(entry)
            if entry.lock.granted:
                first = self.holds[key][1] if key in self.holds else now
                longest = max(entry.held_at_least or 0.0, (now - first).total_seconds())
                holds[key] = (name, first, longest)
                if key not in self.holds and self.started:
                    tick.acquired[name] = tick.acquired.get(name, 0) + 1
            else:
                waits[key] = (name, entry.waited or 0.0)
                tick.contended.add(name)
        tick.holds = [(n, length) for k, (n, _, length) in self.holds.items() if k not in holds]
        tick.waits = [(n, waited) for k, (n, waited) in self.waits.items() if k not in waits]
        self.holds, self.waits, self.started = holds, waits, True
        return tick
