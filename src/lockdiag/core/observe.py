"""Locks watched over time: what a single snapshot cannot say.

A granted lock carries no acquisition time in pg_locks; seeing it in successive snapshots gives
an observed hold ("seen held for 4m12s") next to the snapshot's lower bound. ``Tracker`` keeps
first-seen times for `watch`; ``Sampler`` accumulates per-key statistics for `sample`. Both are
pure: they read snapshots, never a server.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from lockdiag.core.analysis import BackendId, LockEntry, Seen, namespace_of
from lockdiag.core.decoding import ordinal
from lockdiag.core.leaders import Standing
from lockdiag.core.model import LockRow, Snapshot, tag_label
from lockdiag.keys import AdvisoryTag, LockTriple

# waits, and idle holds with waiters, shorter than this are ordinary contention: the broad-key
# and idle-holder patterns count only longer ones
PATTERN_WAIT = 1.0

# how one lock is recognised from one snapshot to the next: the object, who, and the mode
Identity = tuple[object, ...]


def identity(entry: LockEntry) -> Identity:
    lock = entry.lock
    return (*lock.held_object, lock.pid, lock.mode, lock.granted)


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


# -- seen held at every look: one rule for watch, sample and the exporter ---------------------


@dataclass
class Looks:
    """When each granted advisory lock was first seen held by its backend (pid and
    backend_start: a pid reused is another backend), every look since having seen it held.

    What :func:`lockdiag.core.analysis.analyse` takes as ``seen``: --session-age and max_hold
    then judge a holder that keeps running statements (a leader library's keep-alive ping, a
    pool's) as one that never speaks, whose state bound alone grows. A lock missing from one
    look starts again at the next. Per backend: a look at a backend whose locks are those of
    the look before costs one comparison of two sets; each look's new locks share one datetime
    object (the analysis then judges all of a backend's locks at once).

    A span of an aggregated read (:attr:`LockRow.keys`) is followed by its extent
    (:attr:`LockRow.held_object`): it continues while its count and ends stay the same, and
    starts again when they change, though most of its keys may still be held (which ones is
    not known). A sparse span (gaps between its ends) continues only where its backend was
    idle since the look before: another key could have taken a released one's place in it."""

    first_seen: dict[BackendId, dict[tuple[object, ...], datetime]] = field(default_factory=dict)
    last: datetime | None = None  # the server's time at the look before

    def look(self, snapshot: Snapshot) -> Seen:
        """Take one snapshot's granted advisory locks; what it returns describes them."""
        now, sessions = snapshot.server.now, snapshot.sessions
        held: dict[int, list[tuple[object, ...]]] = defaultdict(list)
        sparse: dict[int, set[tuple[object, ...]]] = defaultdict(set)
        for row in snapshot.locks:
            if row.granted and row.locktype == "advisory" and row.pid is not None:
                held[row.pid].append(row.held_object)
                if row.sparse:
                    sparse[row.pid].add(row.held_object)
        before, seen, last = self.first_seen, {}, self.last
        for pid, objects in held.items():
            session = sessions.get(pid)
            backend = (pid, session.backend_start if session is not None else None)
            earlier = before.get(backend)
            quiet = last is not None and session is not None and session.idle_throughout(last)
            again = () if quiet else sparse.get(pid, ())
            if earlier is None:
                seen[backend] = dict.fromkeys(objects, now)
            elif not again and len(earlier) == len(objects) and earlier.keys() >= set(objects):
                seen[backend] = earlier  # the same locks as at the last look
            else:
                seen[backend] = {
                    lock: now if lock in again else earlier.get(lock, now) for lock in objects
                }
        self.first_seen, self.last = seen, now
        return seen

    def forget(self) -> None:
        """After a read that failed: what went on while nothing could look is unknown, so
        every lock starts again at the next look."""
        self.first_seen, self.last = {}, None


# -- holds followed across samples: one rule for `sample` and the exporter ---------------------

HoldKey = TypeVar("HoldKey", bound=Hashable)


@dataclass
class Holds(Generic[HoldKey]):
    """Holds followed from sample to sample, with the time each was first seen.

    The one rule of acquisitions, for ``Sampler`` and ``Episodes`` alike: a hold began while
    sampling only when a sample sees it that the previous sample did not. What the first sample
    sees began before sampling began, and is never counted as an acquisition."""

    first_seen: dict[HoldKey, datetime] = field(default_factory=dict)
    started: bool = False

    def follow(
        self, current: Iterable[HoldKey], now: datetime
    ) -> tuple[list[HoldKey], dict[HoldKey, datetime]]:
        """Take one sample's holds: those that began since the previous sample (never any at
        the first), and those that ended, with when each was first seen."""
        previous = self.first_seen
        seen: dict[HoldKey, datetime] = {}
        began: list[HoldKey] = []
        for key in current:
            first = previous.get(key)
            if first is None:
                first = now
                if self.started:
                    began.append(key)
            seen[key] = first
        ended = {key: first for key, first in previous.items() if key not in seen}
        self.first_seen, self.started = seen, True
        return began, ended


def waits_by_pid(entries: Iterable[LockEntry]) -> dict[int, float]:
    """Seconds each waiting backend has waited (a backend waits for one lock at a time)."""
    return {
        entry.lock.pid: entry.waited or 0.0
        for entry in entries
        if not entry.lock.granted and entry.lock.pid is not None
    }


def hold_lower_bound(entry: LockEntry, waited: dict[int, float]) -> float:
    """Seconds a granted lock has certainly been held, from one snapshot: the idle lower bound
    (an idle holder has held its session lock since state_change at least), and the longest
    wait it causes (a waiter that has waited W seconds for it means it was held for W)."""
    bound = entry.held_at_least or 0.0
    for pid in entry.blocks:
        bound = max(bound, waited.get(pid, 0.0))
    return bound


# -- sampling ----------------------------------------------------------------------------------

KeyId = tuple[str | None, str]  # (database, decoded label)
# a backend's locks of one key space and mode, what an aggregated read gathers into a span:
# (pid, backend_start, database, classid, objsubid, mode); a pid reused is another holder
Space = tuple[object, ...]
HoldId = tuple[KeyId, Space]  # one hold, as the exporter's episodes count them


def space_of(entry: LockEntry) -> Space:
    lock, session = entry.lock, entry.session
    started = session.backend_start if session is not None else None
    return (lock.pid, started, lock.database, lock.classid, lock.objsubid, lock.mode)


# a read's spans: per space, the ordinals (signed for an int4 pair) of each span's ends
Spans = dict[Space, list[tuple[int, int]]]


def spans_of(entries: Iterable[LockEntry]) -> Spans:
    found: Spans = defaultdict(list)
    for entry in entries:
        lock = entry.lock
        if lock.keys > 1 and lock.objid is not None and lock.objid_last is not None:
            ends = (ordinal(lock.objsubid, lock.objid), ordinal(lock.objsubid, lock.objid_last))
            found[space_of(entry)].append(ends)
    return found


def followed(entry: LockEntry, other: Spans) -> bool:
    """Whether a hold's beginning or end (seen by comparing two reads) is one: not for a
    sparse span (which of its keys came or went is not known; :func:`keys_of` gives a dense
    one's keys), nor for a key inside one of its space at the other read (it may only have
    joined or left that span)."""
    lock = entry.lock
    if lock.keys > 1:
        return False
    ranges = other.get(space_of(entry)) if other else None
    if not ranges or lock.objid is None:
        return True
    place = ordinal(lock.objsubid, lock.objid)
    return not any(low <= place <= high for low, high in ranges)


_OBJID, _DECODED = LockRow._fields.index("objid"), LockEntry._fields.index("decoded")


def keys_of(entries: Iterable[LockEntry]) -> Iterator[LockEntry]:
    """Each lock as the full read gives it: a dense span (every key between its ends, so
    each one known) as one entry per key; a sparse span as itself (:func:`followed`)."""
    for entry in entries:
        lock, decoded = entry.lock, entry.decoded
        if lock.keys == 1 or decoded is None or lock.sparse:
            yield entry
            continue
        # built as tuples, fields in order (a dense span of 100k keys at every read)
        one = lock._replace(keys=1, objid_last=None)
        before, after = one[:_OBJID], one[_OBJID + 1 :]
        middle, rest = entry[1:_DECODED], entry[_DECODED + 1 :]
        new = tuple.__new__
        for key in decoded.first_keys(lock.keys):
            lock_of_key = new(LockRow, (*before, key.triple.objid, *after))
            yield new(LockEntry, (lock_of_key, *middle, key, *rest))


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
    acquisitions: int = 0  # holds that began while sampling (not those of the first sample)
    releases: int = 0  # holds that ended while sampling
    # seconds: observed across samples, or the hold's lower bound when longer (hold_lower_bound)
    longest_hold: float = 0.0
    # the two apart: the longest a session was seen holding it at every look (capped by the
    # sampling window), and the longest lower bound one read gave (idle since, a wait caused)
    longest_seen: float = 0.0
    held_at_least: float = 0.0
    longest_wait: float = 0.0  # seconds, from waitstart
    idle_holders: set[int] = field(default_factory=set)  # pids of those idle holds
    idle_holds: int = 0  # samples where a holder idle PATTERN_WAIT or more had waiters
    # a sparse span's keys (an aggregated read's: one backend's keys nobody waited for, with
    # gaps between its ends): its acquisitions and releases are not counted (not known)
    keys: int = 1
    tag: bool = False  # an extension's advisory tag (objsubid not 1 or 2), never named
    resource: int | None = None  # the namespace's resource number, when the key has one

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
class _Read:
    """What one read of the lock table saw that every sample counts: kept so that a sample
    without a read (the backends unchanged since it, :meth:`Sampler.again`) counts it again,
    its times moved on by the seconds since the read."""

    now: datetime
    held: list[KeyStats]
    waited: list[KeyStats]
    holds: dict[KeyId, tuple[datetime, float]]  # per key: its oldest hold's first sight, bound
    blocking: list[tuple[KeyStats, int, float | None]]  # holders with waiters: idle bound
    waiting: list[tuple[KeyStats, int, float | None]]  # waiters: seconds waited


@dataclass
class Sampler:
    """Per-key statistics over samples. A sample is a read of the lock table (:meth:`add`),
    or a probe that found the backends as they were at the last read (:meth:`again`): the
    locks are those of that read, their times moved on. A read is tallied at once; the samples
    that repeat it when the next read comes, or by :meth:`settle`, which a caller that repeats
    reads runs before reporting."""

    samples: int = 0
    query_seconds: list[float] = field(default_factory=list)  # one per read of the lock table
    keys: dict[KeyId, KeyStats] = field(default_factory=dict)
    _holds: Holds[HoldId] = field(default_factory=Holds)
    _held: dict[HoldId, LockEntry] = field(default_factory=dict)  # at the last read
    _spans: Spans = field(default_factory=dict)  # at the last read
    looks: Looks = field(default_factory=Looks)  # what the reads saw held: Diagnosis's seen
    started: datetime | None = None
    ended: datetime | None = None
    _read: _Read | None = None
    _later: list[float] = field(default_factory=list)  # seconds after _read of its samples
    first_read: datetime | None = None
    # leaders and sessions polling a try-lock, seen at the reads (core.leaders)
    standing: Standing = field(default_factory=Standing)

    @property
    def reads(self) -> int:
        return len(self.query_seconds)

    @property
    def read_interval(self) -> float | None:
        """The mean time between reads of the lock table, first to last; None before two."""
        if self.reads < 2 or self.first_read is None or self._read is None:
            return None
        return (self._read.now - self.first_read).total_seconds() / (self.reads - 1)

    def add(self, entries: list[LockEntry], now: datetime, query_seconds: float) -> None:
        """A sample that read the lock table: ``entries`` as of ``now``."""
        self.settle()
        self.query_seconds.append(query_seconds)
        self.first_read = self.first_read or now
        held_now: dict[HoldId, LockEntry] = {}
        waited: dict[KeyId, KeyStats] = {}
        held: dict[KeyId, KeyStats] = {}
        blocking: list[tuple[KeyStats, int, float | None]] = []
        waiting: list[tuple[KeyStats, int, float | None]] = []
        for entry in keys_of(entries):
            decoded = entry.decoded
            label = decoded.label if decoded is not None else tag_label(entry.lock)
            if label is None or entry.lock.pid is None:
                continue  # not advisory
            key: KeyId = (entry.database, label)
            stats = self.keys.get(key)
            if stats is None:
                namespace = decoded.namespace.name if decoded and decoded.namespace else None
                stats = self.keys[key] = KeyStats(label, entry.database, namespace)
                stats.tag = decoded is None
                stats.resource = decoded.resource if decoded and namespace is not None else None
            session = entry.session
            who = (
                (session.application_name or "") if session else "",
                (session.client_addr or "local") if session else "",
            )
            stats.names[entry.lock.pid] = who[0]
            if entry.lock.granted:
                held[key] = stats
                stats.holders.add(who)
                stats.holder_pids.add(entry.lock.pid)
                held_now[(key, space_of(entry))] = entry
                stats.keys = entry.lock.keys
                if entry.blocks:
                    blocking.append((stats, entry.lock.pid, entry.held_at_least))
            else:
                waited[key] = stats
                stats.waiters.add(who)
                stats.waiter_pids.add(entry.lock.pid)
                waiting.append((stats, entry.lock.pid, entry.waited))
        self._follow(held_now, now)
        waits = waits_by_pid(entries) if waited else {}
        first_seen = self._holds.first_seen
        holds: dict[KeyId, tuple[datetime, float]] = {}
        for hold, entry in held_now.items():
            # seen held: the analysis' looks when it had them (pid and backend_start), else
            # this sampler's own first sight
            seen = entry.seen
            first = seen.since if seen is not None else first_seen[hold]
            bound = hold_lower_bound(entry, waits)
            before = holds.get(hold[0])
            if before is not None:
                first, bound = min(first, before[0]), max(bound, before[1])
            holds[hold[0]] = (first, bound)
        self._read = _Read(
            now, list(held.values()), list(waited.values()), holds, blocking, waiting
        )
        self._count(now)
        self.settle()

    def _follow(self, held_now: dict[HoldId, LockEntry], now: datetime) -> None:
        """Count the holds that began and ended since the last read (``Holds``' rule), where
        a span does not hide which (:func:`followed`)."""
        began, ended = self._holds.follow(held_now, now)
        spans = spans_of(held_now.values())
        for hold in began:
            if followed(held_now[hold], self._spans):
                self.keys[hold[0]].acquisitions += 1
        for hold in ended:
            if followed(self._held[hold], spans):
                self.keys[hold[0]].releases += 1
        self._held, self._spans = held_now, spans

    def again(self, now: datetime) -> None:
        """A sample without a read: the backends are as they were at the last read, so are
        its locks, as of ``now``. O(1): tallied with the read's by :meth:`settle`."""
        assert self._read is not None, "a sample repeats a read: add() first"
        self._count(now)

    def _count(self, now: datetime) -> None:
        assert self._read is not None
        self.samples += 1
        self.started = self.started or now
        self.ended = now
        self._later.append((now - self._read.now).total_seconds())

    def settle(self) -> None:
        """Tally the samples not yet counted (a read, the samples that repeated it) into the
        per-key statistics. Counts grow by the number of samples; times by the seconds
        from the read to its last sample (a hold, a wait, an idle bound only grow)."""
        read, later = self._read, self._later
        if read is None or not later:
            return
        samples, last = len(later), later[-1]
        for stats in read.held:
            stats.samples_held += samples
        for stats in read.waited:
            stats.samples_waited += samples
        for stats, pid, idle in read.blocking:
            if idle is None:
                continue
            idle_samples = sum(1 for seconds in later if idle + seconds >= PATTERN_WAIT)
            if idle_samples:
                stats.idle_holds += idle_samples
                stats.idle_holders.add(pid)
        for stats, pid, waited in read.waiting:
            longest = waited + last if waited is not None else 0.0
            stats.longest_wait = max(stats.longest_wait, longest)
            if longest >= PATTERN_WAIT:
                stats.long_waiter_pids.add(pid)
        ended = read.now + timedelta(seconds=last)
        for key, (first, bound) in read.holds.items():
            stats = self.keys[key]
            observed = (ended - first).total_seconds()
            stats.longest_hold = max(stats.longest_hold, observed, bound + last)
            stats.longest_seen = max(stats.longest_seen, observed)
            stats.held_at_least = max(stats.held_at_least, bound + last)
        self._later = []


@dataclass(frozen=True)
class Pattern:
    kind: str  # idle-holder, broad-key, duplicate-dispatch
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
        stuck = bool(stats.samples_waited) and stats.idle_holds >= max(2, stats.samples_waited // 2)
        if stuck:
            found.append(
                Pattern(
                    "idle-holder",  # idle or idle in transaction: list's stuck-owner is the latter
                    stats.label,
                    f"held by {stats.who(stats.idle_holders)}, idle (in a transaction or not), in "
                    f"{stats.idle_holds} sample(s) while {len(stats.waiter_pids)} session(s) "
                    f"waited: {stats.who(stats.waiter_pids)}",
                )
            )
        # broad: one key of a namespace serialises sessions while the namespace's other keys,
        # seen in the samples, are mostly free; a stuck owner is that, never also broad, and a
        # namespace with no other key seen says nothing of how broad its keys are
        siblings = len(by_namespace[stats.namespace]) - 1
        siblings_held = (s.samples_held for s in busiest[stats.namespace] if s is not stats)
        if (
            not stuck
            and stats.namespace is not None
            and siblings > 0
            and len(stats.long_waiter_pids) >= 3
            and len(stats.waiters | stats.holders) >= 2
            and max(siblings_held, default=0) <= stats.samples_held // 4
        ):
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


# -- episodes, for the exporter's histograms -------------------------------------------------

EpisodeKey = tuple[Space, LockTriple | AdvisoryTag]  # a key, or an extension's tag


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
    observed (first to last sight), or its lower bound when that is longer (hold_lower_bound:
    the idle bound, the longest wait it caused); a wait's is its time since waitstart at the
    last sight. Acquisitions follow ``Holds``' rule, as `sample`'s do: what the first sample
    sees is none. Episodes shorter than the interval can be missed; none is invented.

    A dense span of an aggregated read (one backend's keys nobody waits for, every key
    between its ends) is followed key by key, as the full read's rows (:func:`keys_of`). A
    sparse one is no episode: which of its keys were taken or released is not known; nor is
    a key's coming or going where a sparse span of its space covered it at the other read
    (it may only have joined or left the span): followed, never counted as begun or ended."""

    holds: dict[EpisodeKey, tuple[str, float]] = field(default_factory=dict)  # name, longest
    waits: dict[EpisodeKey, tuple[str, float]] = field(default_factory=dict)
    followed: Holds[EpisodeKey] = field(default_factory=Holds)
    granted: dict[EpisodeKey, tuple[str, LockEntry]] = field(default_factory=dict)  # last read
    spans: Spans = field(default_factory=dict)  # at the last read

    @property
    def started(self) -> bool:
        return self.followed.started

    def add(self, entries: list[LockEntry], now: datetime) -> Tick:
        tick = Tick()
        granted: dict[EpisodeKey, tuple[str, LockEntry]] = {}
        waits: dict[EpisodeKey, tuple[str, float]] = {}
        for entry in keys_of(entries):
            numbers = entry.decoded.triple if entry.decoded else entry.lock.advisory_tag
            if numbers is None or entry.lock.pid is None:
                continue  # not advisory
            key: EpisodeKey = (space_of(entry), numbers)
            name = namespace_of(entry)
            if entry.lock.granted:
                granted[key] = (name, entry)
            else:
                waits[key] = (name, entry.waited or 0.0)
                tick.contended.add(name)
        spans = spans_of(entry for _, entry in granted.values())
        began, _ = self.followed.follow(granted, now)
        for key in began:
            name, entry = granted[key]
            if followed(entry, self.spans):
                tick.acquired[name] = tick.acquired.get(name, 0) + 1
        waiting = waits_by_pid(entries) if waits else {}
        holds: dict[EpisodeKey, tuple[str, float]] = {}
        for key, (name, entry) in granted.items():
            observed = (now - self.followed.first_seen[key]).total_seconds()
            before = self.holds[key][1] if key in self.holds else 0.0
            holds[key] = (name, max(before, observed, hold_lower_bound(entry, waiting)))
        tick.holds = [
            (n, length)
            for k, (n, length) in self.holds.items()
            if k not in holds and followed(self.granted[k][1], spans)
        ]
        tick.waits = [(n, waited) for k, (n, waited) in self.waits.items() if k not in waits]
        self.holds, self.waits = holds, waits
        self.granted, self.spans = granted, spans
        return tick
