"""Entries to what the report says, aggregated as they are read: per key its totals and its
episodes (waits close together in time), the deadlocks and the cancellations, and an optional
timeline of one advisory key.

Memory is flat in the log's size: per key its totals and episodes, bounded in number (a log
where every wait is on its own key, such as ``transaction N``, folds the least waited keys into
one total per lock type, and keeps the episodes with the most wait); only the waits open at
once are held one by one, at most OPEN_WAITS of them (and OPEN_HOLDERS holders among them):
past that, the oldest are closed as the log's end closes those still open, and counted. An
entry with a number out of its range (messages.Malformed) is counted with the lines that
could not be read. Imports ``messages`` and ``events``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Literal, NamedTuple

from lockdiag.keys import AdvisoryTag, LockTriple
from lockdiag.logs.events import LogReader, ReadCounts
from lockdiag.logs.messages import (
    INTERESTING_ERRORS,
    PID_MAX,
    WAITED_MAX_MS,
    CycleStep,
    Entry,
    Identity,
    LockTag,
    Malformed,
    WaitMessage,
    holders_of,
    parse_cycle,
    parse_tag,
    parse_wait,
)

Outcome = Literal[
    "acquired",
    "deadlock",
    "lock timeout",
    "statement timeout",
    "cancelled",
    "terminated",
    "no end logged",
]

LISTED_PIDS = 200  # holders and waiters kept by pid per episode; the rest are counted
KEPT_EVENTS = 1000  # deadlocks and timeouts kept in full; the rest are counted
KEPT_KEYS = 1000  # keys tallied one by one; past twice this, the least waited half is folded
KEPT_EPISODES = 1000  # episodes kept whole; past twice this, the closed ones least waited go
KEPT_TIMELINE = 10_000  # events of the --key timeline kept (the first); the rest are counted
# Waits open at once, held one by one until their end is logged: a server has fewer sessions
# (max_connections is at most 262143 and in practice a few thousand), so more are waits whose
# end the log did not tell (a crash, a log cut) and whose pid did not wait again. Past it, the
# oldest tenth (first logged first) are closed as "no end logged", as the log's end closes the
# rest, and counted (Tally.closed_early): should the end of one come after all, it counts as a
# wait of its own. The holders listed by the open waits are bounded alike.
OPEN_WAITS = 50_000
OPEN_HOLDERS = 500_000
DURATIONS_KEPT = 4096  # the first figures of waits kept as timedeltas (Tally._duration)
DATABASE_NAMES = 100_000  # database names (by oid, from %d) kept; the next are left out
TIMELINE_EVENTS = {  # a wait message's verb, as the --key timeline says it (with the mode)
    "still waiting for": "waiting for {}",
    "avoided deadlock for": "avoided deadlock (queue rearranged)",
    "acquired": "acquired {}",
}


@dataclass(slots=True)
class Wait:
    """One session's wait for one lock, as far as the log tells it."""

    pid: int
    tag: LockTag
    mode: str
    start: datetime | None
    seen: datetime | None  # the last time the log spoke of it
    waited_ms: float  # what the server said (or the time between its messages)
    identity: Identity
    holders: tuple[int, ...] = ()
    outcome: Outcome = "no end logged"
    avoided_deadlock: bool = False


@dataclass(slots=True)
class Episode:
    """Waits on one key close together in time (no gap longer than the tally's ``gap``)."""

    first: datetime | None
    last: datetime | None
    waits: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0
    holders: dict[int, Identity] = field(default_factory=dict)
    waiters: dict[int, Identity] = field(default_factory=dict)
    pids_left_out: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class KeyTally:
    tag: LockTag
    episodes: list[Episode] = field(default_factory=list)
    waits: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0
    failures: int = 0  # PostgreSQL 18 log_lock_failures: a NOWAIT attempt that failed
    deadlocks: int = 0
    first: datetime | None = None
    last: datetime | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    episodes_left_out: int = 0  # counted in the totals above, not kept (KEPT_EPISODES)
    folded: int = 0  # keys counted together here, one lock type's least waited (KEPT_KEYS)

    def absorb(self, other: KeyTally) -> None:
        """Count ``other``'s totals here, its episodes as left out."""
        self.folded += max(other.folded, 1)
        self.waits += other.waits
        self.longest_ms = max(self.longest_ms, other.longest_ms)
        self.total_ms += other.total_ms
        self.failures += other.failures
        self.deadlocks += other.deadlocks
        self.episodes_left_out += other.episodes_left_out + len(other.episodes)
        for moment in (other.first, other.last):
            if moment is not None:
                self.first = moment if self.first is None else min(self.first, moment)
                self.last = moment if self.last is None else max(self.last, moment)
        for outcome, count in other.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + count


@dataclass(frozen=True)
class Deadlock:
    time: datetime | None
    victim: int | None
    victim_identity: Identity
    statement: str | None
    cycle: tuple[CycleStep, ...]


@dataclass(frozen=True)
class Cancellation:
    """A statement ended by lock_timeout or statement_timeout (or a cancel) while it waited,
    or a lock_timeout whose lock the log does not name (it fired before deadlock_timeout)."""

    time: datetime | None
    pid: int | None
    identity: Identity
    kind: str
    tag: LockTag | None
    waited_ms: float | None
    statement: str | None


class TimelineEvent(NamedTuple):
    time: datetime | None
    event: str
    pid: int | None
    identity: Identity
    waited_ms: float | None
    detail: str


def key_of(tag: LockTag) -> tuple[object, ...]:
    numbers = tag.advisory or tag.tag
    return (tag.kind, tag.database, numbers) if numbers else (tag.kind, tag.text)


class Tally:
    """Aggregates entries as they are read: per key, its episodes; the deadlocks and the
    cancellations; an optional timeline of one advisory key."""

    def __init__(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        gap: float = 60.0,
        timeline_key: LockTriple | AdvisoryTag | None = None,
        kept_keys: int = KEPT_KEYS,
        kept_episodes: int = KEPT_EPISODES,
    ) -> None:
        self.since, self.until, self.gap = since, until, timedelta(seconds=gap)
        self.timeline_key = timeline_key
        self.kept_keys, self.kept_episodes = kept_keys, kept_episodes
        self.keys: dict[tuple[object, ...], KeyTally] = {}
        # a tag's text -> its key's tally, for the tags met again and again (see _tally)
        self._by_text: dict[str, KeyTally] = {}
        self._durations: dict[float, timedelta] = {}  # see _duration
        self.folded: dict[str, KeyTally] = {}  # lock type -> its least waited keys' totals
        self.episode_count = 0  # kept, across keys
        self._episode_limit = 2 * kept_episodes
        self.open: dict[int, Wait] = {}
        # holders listed by waits since the open waits' were counted: at least as many as
        # they list, counted again when past OPEN_HOLDERS (not a subtraction at every close)
        self.holders_added = 0
        self.closed_early = 0  # waits closed while open, past OPEN_WAITS or OPEN_HOLDERS
        self.database_names_left_out = 0  # past DATABASE_NAMES
        self.deadlocks: list[Deadlock] = []
        self.deadlock_count = 0
        self.cancellations: list[Cancellation] = []
        self.cancellation_count = 0
        self.unnamed_lock_timeouts = 0
        self.database_names: dict[int, str] = {}
        self.identities: dict[int, Identity] = {}
        self.reads: list[ReadCounts] = []
        self.timeline: list[TimelineEvent] = []
        self.timeline_left_out = 0
        self.first: datetime | None = None
        self.last: datetime | None = None

    # reading

    def read(self, reader: LogReader) -> None:
        """Every entry of ``reader``; one with a number out of its range is counted with the
        lines that could not be read."""
        counts = reader.counts
        reader.identities = self.identities
        self.reads.append(counts)
        add = self.add
        if self.since is None and self.until is None:
            for entry in reader:
                try:  # costs nothing until it catches
                    add(entry)
                except Malformed:
                    counts.unparsed += 1
            return
        for entry in reader:
            if entry.time is not None and (
                (self.since is not None and entry.time < self.since)
                or (self.until is not None and entry.time > self.until)
            ):
                counts.outside += 1
                continue
            try:
                add(entry)
            except Malformed:
                counts.unparsed += 1

    def finish(self) -> None:
        """Close the waits whose end the log does not tell (their last figure is a lower
        bound)."""
        for wait in list(self.open.values()):
            self._close(wait, "no end logged", None)
        self.open.clear()
        self.holders_added = 0

    def add(self, entry: Entry) -> None:
        """One entry; Malformed (nothing counted) when a number in it is out of its range."""
        if entry.severity == "LOG":  # a lock message (events: messages.interesting)
            said = entry.wait or parse_wait(entry.message)  # read by the reader, or here
            if said is None:
                raise Malformed("a lock message that is not one")
            self._wait_message(entry, said)
        else:
            kind = INTERESTING_ERRORS.get(entry.message)
            if kind == "deadlock":
                self._deadlock(entry)
            elif kind is not None:
                self._cancelled(entry, kind)
        time = entry.time
        if time is not None:
            if self.first is None or time < self.first:
                self.first = time
            if self.last is None or time > self.last:
                self.last = time

    def _wait_message(self, entry: Entry, said: WaitMessage) -> None:
        pid_text, verb, mode, tag_text, after = said
        pid = int(pid_text)  # 10 digits at most, the mode 64 characters (messages._WAIT_HEAD)
        waited = float(after) if after else 0.0  # inf for a long one, never an error
        if pid > PID_MAX or not waited <= WAITED_MAX_MS:  # compared, not called: twice a wait
            raise Malformed(f"pid {pid_text} or a wait of {(after or '')[:20]} ms")
        tag = parse_tag(tag_text)
        time = entry.time
        holders = holders_of(entry.detail) if entry.detail else ()
        database = tag.database
        if (
            database
            and database not in self.database_names  # the first name met is kept
            and entry.identity.database
            and tag.kind != "other"
        ):
            if len(self.database_names) < DATABASE_NAMES:
                self.database_names[database] = entry.identity.database
            else:
                self.database_names_left_out += 1
        wait = self.open.get(pid)
        if wait is not None and wait.tag is not tag and key_of(wait.tag) != key_of(tag):
            self._close(wait, "no end logged", None)  # a wait whose end went unlogged
            wait = None
        if verb == "could not obtain":
            tally = self._tally(tag)
            tally.failures += 1
            self._note(tag, entry, "could not obtain (NOWAIT)", None, holders)
            return
        if wait is None:
            ago = self._durations.get(waited)
            if ago is None:
                ago = self._duration(waited)
            start = time - ago if time else None
            wait = Wait(pid, tag, mode, start, time, waited, entry.identity)
            self.open[pid] = wait
            if len(self.open) > OPEN_WAITS:
                self._close_oldest()
        else:
            wait.seen = time
            if waited > wait.waited_ms:  # noqa: PLR1730 - not max(), a call: twice a wait
                wait.waited_ms = waited
        if holders and holders != wait.holders:
            wait.holders = _merged(wait.holders, holders)
            self.holders_added += len(holders)  # as many as it adds, or more
            if self.holders_added > OPEN_HOLDERS:
                self._close_oldest()
        if verb == "avoided deadlock for":
            wait.avoided_deadlock = True
        if self.timeline_key is not None and verb in TIMELINE_EVENTS:
            listed = () if verb == "acquired" else holders
            self._note(tag, entry, TIMELINE_EVENTS[verb].format(mode), waited, listed)
        if verb == "acquired":
            self._close(wait, "acquired", waited)
        # "detected deadlock while waiting": the ERROR that follows closes the wait

    def _duration(self, waited: float) -> timedelta:
        """A wait's first figure as a timedelta, kept: the first figure of most waits is
        deadlock_timeout and a little, a few thousand values (the figures are finite:
        _wait_message refuses others)."""
        if len(self._durations) >= DURATIONS_KEPT:
            self._durations.clear()
        # by position (days, seconds, microseconds, milliseconds): cheaper than by keyword
        ago = self._durations[waited] = timedelta(0, 0, 0, waited)
        return ago

    def _close_oldest(self) -> None:
        """Past OPEN_WAITS or OPEN_HOLDERS: the oldest open waits closed, as ends not logged,
        until a tenth of each bound is free (counted in ``closed_early``)."""
        waits, holders = OPEN_WAITS - OPEN_WAITS // 10, OPEN_HOLDERS - OPEN_HOLDERS // 10
        listed = sum(len(wait.holders) for wait in self.open.values())
        while len(self.open) > waits or listed > holders:
            for wait in list(islice(self.open.values(), OPEN_WAITS // 10)):
                listed -= len(wait.holders)
                self._close(wait, "no end logged", None)
                self.closed_early += 1
                if len(self.open) <= waits and listed <= holders:
                    break
        self.holders_added = listed

    def _note(
        self, tag: LockTag, entry: Entry, event: str, waited: float | None, holders: tuple[int, ...]
    ) -> None:
        if self.timeline_key is None or (tag.advisory or tag.tag) != self.timeline_key:
            return
        if len(self.timeline) >= KEPT_TIMELINE:
            self.timeline_left_out += 1
            return
        detail = f"holders {', '.join(map(str, holders))}" if holders else ""
        self.timeline.append(
            TimelineEvent(entry.time, event, entry.pid, entry.identity, waited, detail)
        )

    def _tally(self, tag: LockTag) -> KeyTally:
        """The tally of the tag's key. A tag's text always gives the same key (parse_tag), so
        the tally is found by the text, whose hash a string keeps, before the key is made;
        folding keys forgets the texts (their tallies may be gone)."""
        tally = self._by_text.get(tag.text)
        if tally is not None:
            return tally
        key = key_of(tag)
        tally = self.keys.get(key)
        if tally is None:
            if len(self.keys) >= 2 * self.kept_keys:
                self._fold_keys()
            tally = self.keys[key] = KeyTally(tag)
        if len(self._by_text) >= 4 * self.kept_keys:
            self._by_text.clear()  # bounded: texts of keys folded, or written another way
        self._by_text[tag.text] = tally
        return tally

    def _fold_keys(self) -> None:
        """The least waited half of the keys counted together, one total per lock type (a key
        met again later starts a tally of its own; the totals stay exact)."""
        self._by_text.clear()
        ranked = sorted(self.keys.items(), key=lambda item: (item[1].total_ms, item[1].waits))
        for key, one in ranked[: len(ranked) - self.kept_keys]:
            del self.keys[key]
            self.episode_count -= len(one.episodes)
            kind = one.tag.kind
            into = self.folded.get(kind)
            if into is None:
                into = self.folded[kind] = KeyTally(LockTag(kind, f"{kind} (other keys)"))
            into.absorb(one)

    def _fold_episodes(self) -> None:
        """Only the episodes with the most wait kept whole, among those that ended (a later
        one of their key began: a key's last episode may still grow); the others stay in their
        key's totals, counted as left out."""
        closed: list[tuple[float, int, KeyTally, Episode]] = []
        for one in self.keys.values():
            closed += [(e.total_ms, id(e), one, e) for e in one.episodes[:-1]]
        closed.sort(key=lambda item: item[:2])
        dropped: dict[int, KeyTally] = {}
        gone: set[int] = set()
        for _, identity, one, _ in closed[: max(0, self.episode_count - self.kept_episodes)]:
            gone.add(identity)
            dropped[id(one)] = one
        for one in dropped.values():
            kept = [e for e in one.episodes if id(e) not in gone]
            one.episodes_left_out += len(one.episodes) - len(kept)
            one.episodes = kept
        self.episode_count -= len(gone)
        # when most are still open, look again only after as many more
        self._episode_limit = max(2 * self.kept_episodes, self.episode_count + self.kept_episodes)

    def _close(self, wait: Wait, outcome: Outcome, waited: float | None) -> None:
        self.open.pop(wait.pid, None)
        wait.outcome = outcome
        if waited is not None:
            wait.waited_ms = waited
        waited_ms = wait.waited_ms
        tally = self._tally(wait.tag)
        tally.waits += 1
        if waited_ms > tally.longest_ms:  # noqa: PLR1730 - not max(), a call: once a wait
            tally.longest_ms = waited_ms
        tally.total_ms += waited_ms
        outcomes = tally.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        start, end = wait.start, wait.seen
        # compared in place of min() and max() of values that may be None: once per wait
        if start is not None and (tally.first is None or start < tally.first):
            tally.first = start
        if end is not None and (tally.last is None or end > tally.last):
            tally.last = end
        episode = tally.episodes[-1] if tally.episodes else None
        if (
            episode is None
            or start is None
            or episode.last is None
            or start - episode.last > self.gap
        ):
            episode = Episode(start, end)
            tally.episodes.append(episode)
            self.episode_count += 1
            if self.episode_count > self._episode_limit:
                self._fold_episodes()
        if start is not None and (episode.first is None or start < episode.first):
            episode.first = start
        if end is not None and (episode.last is None or end > episode.last):
            episode.last = end
        episode.waits += 1
        if waited_ms > episode.longest_ms:  # noqa: PLR1730 - as above
            episode.longest_ms = waited_ms
        episode.total_ms += waited_ms
        outcomes = episode.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if wait.pid not in episode.waiters:
            self._list(episode, episode.waiters, wait.pid, wait.identity)
        for holder in wait.holders:
            if holder not in episode.holders:
                self._list(episode, episode.holders, holder, self.identities.get(holder))

    @staticmethod
    def _list(episode: Episode, where: dict[int, Identity], pid: int, who: Identity | None) -> None:
        """A pid not listed yet, or counted as left out once the list is full."""
        if len(where) >= LISTED_PIDS:
            episode.pids_left_out += 1
            return
        where[pid] = who or Identity(None, None, None)

    def _deadlock(self, entry: Entry) -> None:
        cycle = parse_cycle(entry.detail or "")
        self.deadlock_count += 1
        for tag in {key_of(step.tag): step.tag for step in cycle}.values():
            self._tally(tag).deadlocks += 1
            self._note(tag, entry, "deadlock detected", None, ())
        wait = self.open.get(entry.pid) if entry.pid is not None else None
        if wait is not None:
            self._close(wait, "deadlock", _elapsed(wait, entry.time))
        if len(self.deadlocks) < KEPT_EVENTS:
            self.deadlocks.append(
                Deadlock(entry.time, entry.pid, entry.identity, entry.statement, cycle)
            )

    def _cancelled(self, entry: Entry, kind: str) -> None:
        wait = self.open.get(entry.pid) if entry.pid is not None else None
        if wait is None and kind != "lock timeout":
            return  # a statement cancelled while it waited for no lock: not ours
        self.cancellation_count += 1
        waited = _elapsed(wait, entry.time) if wait is not None else None
        if wait is not None:
            self._note(wait.tag, entry, f"cancelled: {kind}", waited, ())
            self._close(wait, kind, waited)  # type: ignore[arg-type]
        else:
            self.unnamed_lock_timeouts += 1
        if len(self.cancellations) < KEPT_EVENTS:
            self.cancellations.append(
                Cancellation(
                    entry.time,
                    entry.pid,
                    entry.identity,
                    kind,
                    wait.tag if wait else None,
                    waited,
                    entry.statement,
                )
            )


def _merged(listed: tuple[int, ...], more: tuple[int, ...]) -> tuple[int, ...]:
    """The holders a wait listed, then those of a DETAIL not among them, each once; the
    first DETAIL of a wait naming one holder (most of them) as it is."""
    if not listed and len(more) == 1:
        return more
    return tuple(dict.fromkeys((*listed, *more)))


def _elapsed(wait: Wait, now: datetime | None) -> float:
    if wait.start is None or now is None:
        return wait.waited_ms
    wait.seen = now
    return max(wait.waited_ms, (now - wait.start).total_seconds() * 1000)
