"""Leaders and their standbys: contention that leaves no row in pg_locks.

A leader-election library (or an in-house elector) holds a session-level advisory lock on a
dedicated idle connection for the life of its process, while the standbys of the same program
retry ``pg_try_advisory_lock`` every few seconds. A failed try never waits, so it leaves nothing
in pg_locks (lockfuncs.c: ``LockAcquire(..., dontWait = true)``); the standbys show only in
pg_stat_activity, as their last query. Drivers that bind parameters on the server send
``pg_try_advisory_lock($1, $2)``, so the key polled is known only when the text has literals.

:func:`contention` is the one recognition, for `check`, `who-holds`, `sample` and the exporter: a
certain session lock held by an idle session while other sessions of the same program (the
same application_name; the same user when it is empty), in the same database, holding no
advisory lock themselves, last ran a try-lock of that key (or of a key the text does not say).
A migration or a deploy's lock is held for a run, not a life: a second instance that retries
it (postgres-migrations every second) is no standby, and :func:`retrying` counts it among the
sessions that retry a key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from lockdiag.core.analysis import LockEntry, namespace_of
from lockdiag.core.model import Session, Snapshot
from lockdiag.keys import INT4_MAX, INT4_MIN, InvalidKey, LockTriple, from_bigint, from_pair

# pg_try_advisory_lock(...), its xact and shared forms, schema-qualified or not
TRY_LOCK = re.compile(r"\bpg_try_advisory_(?:xact_)?lock(?:_shared)?\s*\(", re.IGNORECASE)
# one argument written as a literal: 17, -3, CAST(17 AS integer), 17::bigint
LITERAL = re.compile(
    r"\s*(?:cast\s*\(\s*(?P<cast>[-+]?\d+)\s+as\s+\w+\s*\)|(?P<plain>[-+]?\d+)(?:\s*::\s*\w+)?)\s*",
    re.IGNORECASE,
)
STANDBYS_NAMED = 5  # standbys listed by pid in a sentence
DECLARATION = 'expect = "session"'
# what that declaration silences, and what it leaves on
SILENCES = (
    "it silences the session-age alert (session-lock) for that namespace's locks only; "
    "max_hold, outlived-client and every wait still alert"
)


@dataclass(frozen=True)
class Poll:
    """A session whose last query is a try-lock: the key when its text has literals."""

    session: Session
    key: LockTriple | None


@dataclass(frozen=True)
class Leader:
    """A certain session lock on an idle connection, and the sessions of its program that
    poll for it."""

    entry: LockEntry  # the lock it leads with
    standbys: tuple[Poll, ...]
    keys: int = 1  # the certain session locks it holds in that lock's key space

    @property
    def pid(self) -> int | None:
        return self.entry.lock.pid

    @property
    def namespace(self) -> str:
        """A bounded label: the registry's namespace, a known software's, or unregistered."""
        return namespace_of(self.entry)

    @property
    def label(self) -> str:
        decoded = self.entry.decoded
        return decoded.label if decoded is not None else str(self.entry.lock.advisory_key)

    def who(self) -> str:
        session = self.entry.session
        app = session.application_name if session is not None else None
        return f"pid {self.pid}" + (f" ({app})" if app else "")

    def polling(self) -> str:
        """``2 standbys poll pg_try_advisory_lock (pid 13, 14)``."""
        pids = sorted(p.session.pid for p in self.standbys)
        shown = ", ".join(map(str, pids[:STANDBYS_NAMED]))
        more = f" and {len(pids) - STANDBYS_NAMED} more" if len(pids) > STANDBYS_NAMED else ""
        noun = "standby polls" if len(pids) == 1 else "standbys poll"
        return f"{len(pids)} {noun} a try-lock (pid {shown}{more})"

    def sentence(self) -> str:
        """The leader in one sentence, failover named as the design."""
        return (
            f"{self.who()} holds {self.label} as a leader lock, idle; {self.polling()}: "
            "a failed try leaves no row in pg_locks, and if the leader ends a standby takes "
            "the lock, which is how failover is meant to work"
        )

    def declaration(self) -> str:
        """The registry declaration that quiets a healthy leader, and what it silences."""
        decoded = self.entry.decoded
        namespace = decoded.namespace if decoded is not None else None
        if namespace is not None:
            step = f"add {DECLARATION} to [namespaces.{namespace.name}] in the registry"
        elif decoded is not None:  # an entry to paste: one constant's key, else its space
            key = decoded.triple
            names = (
                f"key = {key.toml()}"
                if self.keys == 1
                else f'id = {key.pair[0]}, form = "{key.form}"'
            )
            step = f"name it in the registry: [namespaces.NAME] {names}, {DECLARATION}"
        else:
            step = f"add {DECLARATION} to its namespace in the registry"
        return f"a healthy leader: {step}; {SILENCES}"


def poll_of(session: Session) -> Poll | None:
    """The session's try-lock, when its last query is one (and it is not waiting for a lock:
    a try never waits)."""
    query = session.query
    if not query or session.hidden or session.wait_event_type == "Lock":
        return None
    if session.backend_type not in (None, "client backend"):
        return None
    found = TRY_LOCK.search(query)
    if found is None:
        return None
    return Poll(session, _key(query[found.end() :]))


def _key(arguments: str) -> LockTriple | None:
    """The key of a try-lock's arguments (the text after its opening parenthesis), when they
    are literals: one bigint or two int4; None for parameters ($1) or expressions."""
    depth, parts, start = 0, [], 0
    for index, char in enumerate(arguments):
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif char == ")" or (char == "," and not depth):
            parts.append(arguments[start:index])
            start = index + 1
            if char == ")":
                break
    else:
        return None  # cut short (pg_stat_activity keeps track_activity_query_size bytes)
    numbers = []
    for part in parts:
        literal = LITERAL.fullmatch(part)
        if literal is None:
            return None
        numbers.append(int(literal.group("cast") or literal.group("plain")))
    try:
        if len(numbers) == 1:
            return from_bigint(numbers[0])
        if len(numbers) == 2 and all(INT4_MIN <= n <= INT4_MAX for n in numbers):
            return from_pair(*numbers)
    except InvalidKey:
        return None
    return None


def polls(snapshot: Snapshot) -> list[Poll]:
    """Every session whose last query is a try-lock, lockdiag's own excluded."""
    own = snapshot.server.backend_pid
    found = (poll_of(s) for pid, s in snapshot.sessions.items() if pid != own)
    return [p for p in found if p is not None]


def retrying(snapshot: Snapshot, key: LockTriple, holders: Iterable[LockEntry]) -> list[Poll]:
    """The sessions whose last query tries ``key`` (its numbers written in the text) in a
    database where ``holders`` hold it (advisory locks are per database), in pid order, the
    holders excluded: waiters that retry, which pg_locks never shows."""
    held = list(holders)
    pids, databases = {e.lock.pid for e in held}, {e.database for e in held}
    found = (
        p
        for p in polls(snapshot)
        if p.key == key and p.session.pid not in pids and p.session.database in databases
    )
    return sorted(found, key=lambda p: p.session.pid)


def retry_words(polls: list[Poll]) -> str:
    """``2 sessions retry this key (pid 13, 14: ...)``."""
    pids = [p.session.pid for p in polls]
    shown = ", ".join(map(str, pids[:STANDBYS_NAMED]))
    more = f" and {len(pids) - STANDBYS_NAMED} more" if len(pids) > STANDBYS_NAMED else ""
    noun = "session retries" if len(pids) == 1 else "sessions retry"
    return (
        f"{len(pids)} {noun} this key (pid {shown}{more}: the last query tries it, and a "
        "failed try leaves no row in pg_locks)"
    )


def _program(session: Session) -> tuple[str | None, str | None, str | None]:
    """Who a session belongs to: its database and application_name, or its user when it
    sends no application_name."""
    app = session.application_name or None
    return (session.database, app, None if app else session.user)


@dataclass(frozen=True)
class Contention:
    """What one snapshot shows of contention that leaves no row: the sessions polling a
    try-lock that hold no advisory lock (their try failed, or took and let go), and the
    leaders they stand by for."""

    leaders: list[Leader]
    polling: list[Poll]

    def leader_of(self, pid: int | None) -> Leader | None:
        return next((leader for leader in self.leaders if leader.pid == pid), None)

    def by_namespace(self) -> dict[str, int]:
        """The polling sessions by the namespace of the leader they stand by for ("unknown"
        for the others, 0 when none, so that the series always exists): bounded labels."""
        counts = {"unknown": 0}
        standing = {
            p.session.pid: leader.namespace for leader in self.leaders for p in leader.standbys
        }
        for poll in self.polling:
            name = standing.get(poll.session.pid, "unknown")
            counts[name] = counts.get(name, 0) + 1
        return counts


NO_CONTENTION = Contention([], [])


def contention(snapshot: Snapshot, entries: Iterable[LockEntry]) -> Contention:
    """The leaders of the snapshot, in pid order, and every polling session: a leader is a
    backend holding a certain session advisory lock, idle, with at least one standby of its
    program polling for it. A standby holds no advisory lock; when its try-lock names a key,
    it is the leader's."""
    held: dict[int, list[LockEntry]] = {}
    holders: set[int] = set()
    for entry in entries:
        lock, pid = entry.lock, entry.lock.pid
        if lock.locktype != "advisory" or not lock.granted or pid is None:
            continue
        holders.add(pid)
        if entry.lifetime == "session" and entry.decoded is not None and not _runs(entry):
            held.setdefault(pid, []).append(entry)
    polling = [p for p in polls(snapshot) if p.session.pid not in holders]
    if not polling:
        return NO_CONTENTION
    found = []
    for pid in sorted(held):
        locks = held[pid]
        session = locks[0].session
        if session is None or session.state != "idle":
            continue
        keys = {e.decoded.triple: e for e in locks if e.decoded is not None}
        program = _program(session)
        standbys = tuple(
            p
            for p in polling
            if _program(p.session) == program and (p.key is None or p.key in keys)
        )
        if standbys:
            named = next((keys[p.key] for p in standbys if p.key is not None), locks[0])
            found.append(Leader(named, standbys, _in_space(named, locks)))
    return Contention(found, polling)


def _runs(entry: LockEntry) -> bool:
    """A migration or a deploy's lock: held for one run, not a life, and a second instance
    that retries waits for the run to end (postgres-migrations polls every second): no
    leader, and no failover."""
    known = entry.decoded.known if entry.decoded is not None else None
    behaviour = known.behaviour if known is not None else None
    return behaviour is not None and behaviour.runs


def _in_space(entry: LockEntry, locks: list[LockEntry]) -> int:
    """How many of ``locks`` share ``entry``'s key space (form and first number), a span
    counting its every lock."""
    assert entry.decoded is not None
    space = (entry.decoded.triple.form, entry.decoded.triple.pair[0])
    return sum(
        e.lock.keys
        for e in locks
        if e.decoded is not None and (e.decoded.triple.form, e.decoded.triple.pair[0]) == space
    )


@dataclass
class Standing:
    """Contention that leaves no row, over the reads of `sample`: the sessions seen polling
    a try-lock, and each leader with the standbys seen polling for it."""

    reads: int = 0
    polling: dict[str, set[int]] = field(default_factory=dict)  # namespace: pids seen polling
    leaders: dict[tuple[int | None, str], Seen] = field(default_factory=dict)

    def add(self, found: Contention) -> None:
        """One read of the lock table and the backends."""
        self.reads += 1
        standing = {p.session.pid: x.namespace for x in found.leaders for p in x.standbys}
        for poll in found.polling:
            pid = poll.session.pid
            self.polling.setdefault(standing.get(pid, "unknown"), set()).add(pid)
        for leader in found.leaders:
            seen = self.leaders.setdefault((leader.pid, leader.label), Seen(leader))
            seen.leader = leader
            seen.reads += 1
            seen.standbys.update(p.session.pid for p in leader.standbys)


@dataclass
class Seen:
    """A leader over the reads that saw it: the last sight, how many reads, every standby."""

    leader: Leader
    reads: int = 0
    standbys: set[int] = field(default_factory=set)

    def sentence(self, reads: int) -> str:
        pids = sorted(self.standbys)
        shown = ", ".join(map(str, pids[:STANDBYS_NAMED]))
        more = f" and {len(pids) - STANDBYS_NAMED} more" if len(pids) > STANDBYS_NAMED else ""
        return (
            f"{self.leader.who()} held {self.leader.label} as a leader lock in {self.reads} of "
            f"{reads} read(s); {len(pids)} standby(s) seen polling a try-lock (pid {shown}{more}):"
            " failed tries leave no row in pg_locks, so WAITED and CONTENTION do not count them"
        )
