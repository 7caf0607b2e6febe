"""Pure analysis of a snapshot: decode keys, infer lifetimes and lower bounds, raise flags.

Nothing here talks to a server or prints: the same snapshot always gives the same entries.
:class:`lockdiag.core.diagnosis.Diagnosis` runs it once per snapshot for every command.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from functools import partial
from operator import itemgetter
from typing import Literal, NamedTuple

from lockdiag.core.decoding import Decoded, Decoder, decode
from lockdiag.core.model import IN_TRANSACTION_IDLE, LockRow, PoolLink, Session, Snapshot
from lockdiag.core.policy import DEFAULT_POLICY, Policy
from lockdiag.core.sort_key import (
    CLASSID_BIT,
    DATABASE_BIT,
    MODE_BITS,
    MODE_RANK,
    OTHER_MODE,
    PLACE,
    SUBID_BIT,
    TYPE_BIT,
    rest,
    sort_key,
)
from lockdiag.keys import BIGINT_SUBID, TAG_NAMESPACE, LockTriple, to_int4
from lockdiag.registry import Namespace, Registry

# what the other layers import from here (Decoded and decode live in core.decoding)
__all__ = [
    "DEFAULT_POLICY",
    "FLAG_MEANINGS",
    "BackendId",
    "Decoded",
    "Filters",
    "Flag",
    "Lifetime",
    "LockEntry",
    "Policy",
    "Seen",
    "SeenHeld",
    "analyse",
    "decode",
    "longer",
    "namespace_of",
    "older_than_transaction",
    "privilege_notes",
]

Lifetime = Literal["session", "unknown"]


class Flag(str, Enum):
    """A lock's flags, as they appear in JSON and in the FLAGS column."""

    LONG_SESSION_LOCK = "long-session-lock"
    STUCK_OWNER = "stuck-owner"
    UNREGISTERED = "unregistered"
    EXPECT_XACT = "expect-xact"
    MAX_HOLD = "max-hold"
    OUTLIVED_CLIENT = "outlived-client"
    POOLED_SESSION_LOCK = "pooled-session-lock"

    def __str__(self) -> str:
        return self.value

    @property
    def meaning(self) -> str:
        return FLAG_MEANINGS[self]


FLAG_MEANINGS = {
    Flag.LONG_SESSION_LOCK: "a certain session-level lock held longer than --session-age",
    Flag.STUCK_OWNER: "the holder is idle in transaction while others wait for it",
    Flag.UNREGISTERED: "the advisory key matches no namespace of the registry",
    Flag.EXPECT_XACT: "the namespace expects transaction locks, but this is a certain session lock",
    Flag.MAX_HOLD: "held longer than the namespace's max_hold (a certain lower bound)",
    Flag.OUTLIVED_CLIENT: "a session lock on a pooler's server connection with no client "
    "attached, or that transaction pooling lends to a client now: the lock outlived the client "
    "that took it",
    Flag.POOLED_SESSION_LOCK: "a session lock on a connection from a pooler address (no console "
    "access: whether a client is attached is unknown)",
}


def namespace_of(entry: LockEntry) -> str:
    """A bounded label: the registry namespace, the software of a known key, "(extension
    tag)" for an extension's advisory tag, else "unregistered"; never a resource number."""
    decoded = entry.decoded
    if decoded is None:
        return TAG_NAMESPACE if entry.lock.advisory_tag is not None else "unregistered"
    if decoded.namespace is not None:
        return decoded.namespace.name
    known = decoded.known
    return known.software if known is not None and known.names else "unregistered"


# What commands that read over time saw (core.observe.Looks): per backend (pid and
# backend_start: a pid reused is another backend), when each advisory lock it holds was first
# seen held, every look since having seen it held by that backend
BackendId = tuple[int, datetime | None]
Seen = Mapping[BackendId, Mapping[tuple[object, ...], datetime]]


class SeenHeld(NamedTuple):
    """A lock seen held at every look since ``since``, by the same backend: a second lower
    bound beside the state bound. ``busy``: the session ran statements since (its
    state_change moved, or it was not idle): not proof of one unbroken hold."""

    since: datetime
    seconds: float
    busy: bool


def longer(held: float | None, seen: SeenHeld | None) -> float | None:
    """The longer of a state bound and the time seen held: what --session-age and max_hold
    judge."""
    return held if seen is None or (held or 0.0) >= seen.seconds else seen.seconds


class LockEntry(NamedTuple):
    """One pg_locks row with everything known about it.

    A named tuple rather than a dataclass: analyse() makes one per lock, and at a hundred
    thousand locks the construction cost is what a person waits for.
    """

    lock: LockRow
    session: Session | None
    database: str | None
    decoded: Decoded | None
    lifetime: Lifetime | None  # None for a waiter
    held_at_least: float | None  # seconds; a lower bound, only where one is certain
    waited: float | None  # seconds since waitstart, for a waiter
    blocks: tuple[int, ...] = ()  # waiters held up by this lock, in queue order
    waits_for: tuple[int, ...] = ()  # for a waiter: pids holding a conflicting lock
    queued_behind: tuple[int, ...] = ()  # for a waiter: conflicting waiters ahead in the queue
    flags: tuple[Flag, ...] = ()
    pool: PoolLink | None = None  # set when the backend is a pooler's server connection
    seen: SeenHeld | None = None  # watch, sample, the exporter: seen held since

    @property
    def held_for(self) -> float | None:
        """The longer of the two lower bounds: the state bound and the time seen held."""
        return longer(self.held_at_least, self.seen)


@dataclass(frozen=True)
class Filters:
    namespace: Namespace | None = None
    pids: frozenset[int] = frozenset()
    app: str | None = None  # fnmatch pattern on application_name
    waiting: bool = False  # only locks that wait or that others wait for
    min_age: float | None = None

    def accept(self, entry: LockEntry) -> bool:
        if self.namespace is not None and (
            entry.decoded is None or entry.decoded.namespace != self.namespace
        ):
            return False
        if self.pids and entry.lock.pid not in self.pids:
            return False
        if self.app is not None:
            name = entry.session.application_name if entry.session else None
            if name is None or not fnmatch.fnmatchcase(name, self.app):
                return False
        if self.waiting and entry.lock.granted and not entry.blocks:
            return False
        if self.min_age is not None:
            age = entry.waited if entry.waited is not None else entry.held_at_least
            if age is None or age < self.min_age:
                return False
        return True


def analyse(
    snapshot: Snapshot,
    registry: Registry,
    policy: Policy = DEFAULT_POLICY,
    advisory_only: bool = True,
    seen: Seen | None = None,
) -> list[LockEntry]:
    """Every lock of the snapshot (advisory ones only by default) as LockEntry, in a stable
    order: by database and lock, holders before waiters, waiters by wait start. ``seen``: when
    looks up to this snapshot saw each of its granted advisory locks held (commands that read
    over time, core.observe.Looks); --session-age and max_hold use the longer of that and the
    state bound.

    Work that depends only on the backend (lifetime, lower bound, pool) is done once per
    backend, flags once per backend and namespace: per lock there is a key to decode and an
    entry to make, which matters at a hundred thousand locks.
    """
    now = snapshot.server.now
    rows = (
        [r for r in snapshot.locks if r.locktype == "advisory"] if advisory_only else snapshot.locks
    )

    waiters, holders, contested = _queues(rows)
    decoder = Decoder(registry, snapshot)
    backends: dict[tuple[int | None, int | None], _Backend] = {}
    flags_of: dict[tuple[object, ...], tuple[Flag, ...]] = {}
    # the common lock: granted, uncontested, in a key space where one namespace (or none)
    # names every key but a few listed ones. All but its resource is its backend's and its
    # key space's, found with one lookup per lock.
    common: dict[tuple[object, ...], _Common] = {}
    entries: list[LockEntry] = []
    # the sort key, one int per lock (core.sort_key)
    rank = {name: n for n, name in enumerate(sorted({r.locktype for r in rows}))}
    advisory = rank.get("advisory", 0) << TYPE_BIT
    order: list[int] = []
    mode_rank = MODE_RANK.get
    for row in rows:
        locktype, database, classid, objid, objsubid, pid, granted, keys, mode = _FIELDS(row)
        uncontested = granted and id(row) not in contested
        space = (pid, database, objsubid, classid, locktype)
        shared = common.get(space) if uncontested and keys == 1 else None
        if shared is not None:
            triple = _new_triple((classid, objid, objsubid))
            if triple not in shared.listed:  # the fast path: most locks of a large lock table
                namespace = shared.namespace
                if namespace is None:
                    resource = None
                elif objsubid == BIGINT_SUBID:
                    resource = objid
                else:
                    resource = to_int4(objid)
                key = objsubid << SUBID_BIT | classid << CLASSID_BIT | objid
                order.append(
                    ((database or 0) << DATABASE_BIT | advisory | key) << PLACE
                    | (pid or 0) << MODE_BITS
                    | mode_rank(mode, OTHER_MODE)
                )
                one = _new_decoded((triple, namespace, resource, None, None, 1))
                entries.append(
                    _new_entry((row, shared.session, shared.database, one, *shared.rest))
                )
                continue
        backend = backends.get((pid, database))
        if backend is None:
            backend = backends[(pid, database)] = _backend(snapshot, pid, database, now, seen)
        order.append(sort_key(row, rank))
        decoded = decoder.of(row)
        if not uncontested:
            entries.append(_contested(row, backend, decoded, waiters, holders, now, policy))
            continue
        entry = _uncontested(row, backend, decoded, policy, now, flags_of)
        entries.append(entry)
        # its key space may be common (not where earlier reads tell some locks apart, nor
        # where earlier looks saw its locks held since different times)
        quiet = entry.seen is backend.seen and not backend.remembered
        if quiet and decoded is not None and decoded.known is None:
            listed = decoder.listed(objsubid, classid)
            if listed is not None:
                common[space] = _Common(
                    entry.session, entry.database, entry[4:], decoded.namespace, listed
                )
    return [entries[i] for i in sorted(range(len(entries)), key=order.__getitem__)]


def _uncontested(
    row: LockRow,
    backend: _Backend,
    decoded: Decoded | None,
    policy: Policy,
    now: datetime,
    flags_of: dict[tuple[object, ...], tuple[Flag, ...]],
) -> LockEntry:
    """A granted lock nobody waits for; its flags made once per backend, lifetime,
    namespace (or being unregistered) and time seen held (``flags_of``)."""
    lifetime, held = _lifetime(row, backend), _seen_held(row, backend, now)
    context = (row.pid, row.database, lifetime, _naming(decoded), held)
    flags = flags_of.get(context)
    if flags is None:
        flags = flags_of[context] = _flags(backend, decoded, True, (), policy, lifetime, held)
    return LockEntry(
        row,
        backend.session,
        backend.database,
        decoded,
        lifetime,
        backend.held,
        None,
        flags=flags,
        pool=backend.pool,
        seen=held,
    )


def _queues(
    rows: list[LockRow],
) -> tuple[dict[tuple[object, ...], list[LockRow]], dict[tuple[object, ...], set[int]], set[int]]:
    """Waiters by lock object in queue order, the pids holding each object waited for, and
    the id() of every granted row a waiter may wait for.

    pg_blocking_pids() names hard blockers (they hold a conflicting lock) and soft ones
    (queued ahead with a conflicting request); holders of the same object are the hard ones.
    """
    waiters: dict[tuple[object, ...], list[LockRow]] = defaultdict(list)
    blocker_pids: set[int] = set()
    for row in rows:
        if not row.granted:
            waiters[row.lock_object].append(row)
            blocker_pids.update(row.blocked_by or ())
    holders: dict[tuple[object, ...], set[int]] = defaultdict(set)
    contested: set[int] = set()
    objids = {objid for *_, objid, _ in waiters}  # a lock object ends with objid, objsubid
    for row in rows if waiters else ():
        if row.objid not in objids or not row.granted or row.pid not in blocker_pids:
            continue  # most rows: the cheap tests first
        if row.lock_object in waiters:
            holders[row.lock_object].add(row.pid)
            contested.add(id(row))
    for queue in waiters.values():
        queue.sort(key=rest)  # by wait start, then pid
    return waiters, holders, contested


def _contested(
    row: LockRow,
    backend: _Backend,
    decoded: Decoded | None,
    waiters: dict[tuple[object, ...], list[LockRow]],
    holders: dict[tuple[object, ...], set[int]],
    now: datetime,
    policy: Policy,
) -> LockEntry:
    """A lock that waits, or that a waiter may wait for."""
    blocks: tuple[int, ...] = ()
    waits_for: tuple[int, ...] = ()
    queued_behind: tuple[int, ...] = ()
    if row.granted:
        blocked = [w for w in waiters.get(row.lock_object, ()) if row.pid in (w.blocked_by or ())]
        blocks = tuple(w.pid for w in blocked if w.pid is not None)
        lifetime, held, waited = _lifetime(row, backend), backend.held, None
        seen = _seen_held(row, backend, now)
        began = blocked[0].waitstart if blocked else None  # the queue is by wait start
        if lifetime == "unknown" and older_than_transaction(backend.session, began, now):
            lifetime = "session"
    else:
        lifetime, held, seen = None, None, None
        # now() is the snapshot statement's start, pg_locks copied after it: a wait that began
        # in between has waited no time, not less
        waited = max(0.0, (now - row.waitstart).total_seconds()) if row.waitstart else None
        holding = holders.get(row.lock_object, set())
        queued = {w.pid for w in waiters.get(row.lock_object, ()) if w.pid != row.pid}
        blocked_by = row.blocked_by or ()
        # pid 0 is a prepared transaction: it holds, it cannot be queued. pg_blocking_pids()
        # runs after pg_locks was copied, so it can name a pid that took or queued for the
        # lock since: with no row on this object in the snapshot, it gets no edge at all.
        waits_for = tuple(p for p in blocked_by if p in holding or p == 0)
        queued_behind = tuple(p for p in blocked_by if p in queued and p not in holding)
    flags = _flags(backend, decoded, row.granted, blocks, policy, lifetime, seen)
    session, pool = backend.session, backend.pool
    return LockEntry(
        row,
        session,
        backend.database,
        decoded,
        lifetime,
        held,
        waited,
        blocks,
        waits_for,
        queued_behind,
        flags,
        pool,
        seen,
    )


class _Backend(NamedTuple):
    """What every lock of one backend in one database shares."""

    session: Session | None
    database: str | None
    lifetime: Lifetime  # of its granted locks
    held: float | None  # the lower bound of its granted locks
    pool: PoolLink | None
    remembered: frozenset[tuple[object, ...]]  # locks earlier reads proved session locks
    looks: Mapping[tuple[object, ...], datetime] | None  # when earlier looks first saw each
    seen: SeenHeld | None  # when earlier looks first saw all its locks at once (the usual case)


def _seen_held(row: LockRow, backend: _Backend, now: datetime) -> SeenHeld | None:
    """When earlier looks first saw this granted advisory lock held by this backend."""
    looks = backend.looks
    if not looks or backend.seen is not None or row.locktype != "advisory":
        return backend.seen if row.locktype == "advisory" else None
    since = looks.get(row.held_object)
    return None if since is None else _seen_since(backend.session, since, now)


def _seen_since(session: Session | None, since: datetime, now: datetime) -> SeenHeld:
    # idle since before the first look, it ran nothing between looks (its state bound is then
    # the longer one anyway); else the lock may have been released and taken again meanwhile
    quiet = session is not None and session.idle_throughout(since)
    return SeenHeld(since, max(0.0, (now - since).total_seconds()), not quiet)


def _lifetime(row: LockRow, backend: _Backend) -> Lifetime:
    """The backend's lifetime, or "session" for a lock earlier reads proved one."""
    if backend.remembered and row.lock_object in backend.remembered:
        return "session"
    return backend.lifetime


def older_than_transaction(session: Session | None, began: datetime | None, now: datetime) -> bool:
    """Whether a holder's lock on an object is older than its current transaction: a waiter
    it blocks began waiting (``began``, pg_locks.waitstart) before that transaction started,
    and the transaction started before this read (``now``), so it was the current one while
    pg_locks was read.

    Why that proves a session lock (PostgreSQL's queue, lock.c and proc.c; checked on
    PostgreSQL 15 with PgBouncer 1.18, tests/test_borrowed_leak.py): a request that conflicts
    with a waiting one queues behind it unless its backend already holds a lock on the
    object, so a backend holding nothing there when the waiter began cannot be granted the
    lock while that waiter waits. The holder therefore held the lock, or was queued ahead for
    it inside an earlier transaction, before the waiter began; it still holds it inside a
    later transaction: the lock survived a transaction end, which a transaction-level lock
    never does. xact_start is its first statement's arrival, before any lock of the
    transaction. A holder queued ahead and granted after the waiter began (A holds, B and C
    wait, A ends) is in the transaction it waited in: its xact_start is before the wait
    start, and nothing is proven. Not proven either where the deadlock detector reordered a
    queue to resolve a soft deadlock (it may move a later request ahead)."""
    if session is None or began is None:
        return False
    start = session.xact_start
    return start is not None and began < start < now


def _backend(
    snapshot: Snapshot, pid: int | None, database: int | None, now: datetime, seen: Seen | None
) -> _Backend:
    session = snapshot.session(pid)
    remembered = snapshot.remembered.get(pid) if pid is not None else None
    looks = None
    if seen and pid is not None:
        looks = seen.get((pid, session.backend_start if session is not None else None))
    return _Backend(
        session,
        snapshot.server.databases.get(database) if database is not None else None,
        "session" if session and session.certainly_outside_transaction(now) else "unknown",
        _idle_since(session, now),
        snapshot.pool.get(pid) if pid is not None else None,
        remembered.locks if remembered is not None else frozenset(),
        looks,
        _seen_by_all(looks, session, now) if looks else None,
    )


def _seen_by_all(
    looks: Mapping[tuple[object, ...], datetime], session: Session | None, now: datetime
) -> SeenHeld | None:
    """The usual case: one look first saw all of a backend's locks (Looks keeps one datetime
    object per look), so one bound serves them all and its locks keep the fast path."""
    first = next(iter(looks.values()))
    if all(since is first for since in looks.values()):
        return _seen_since(session, first, now)
    return None


# the fast path's constructors: a named tuple made from a tuple, without the keyword handling
# of its __new__ (which costs more than the tuple itself)
_new_triple = partial(tuple.__new__, LockTriple)
_new_decoded = partial(tuple.__new__, Decoded)
_new_entry = partial(tuple.__new__, LockEntry)


class _Common(NamedTuple):
    """What the granted, uncontested locks of one backend in one key space share: their
    entry's fields but the row and the decoded key, and how to decode the key."""

    session: Session | None
    database: str | None
    rest: tuple[object, ...]  # LockEntry's fields after the decoded key
    namespace: Namespace | None  # the space's namespace, or None: unregistered
    listed: frozenset[LockTriple]  # the space's keys of well-known software: decoded alone


def _naming(decoded: Decoded | None) -> object:
    """What the flags of a lock take from its key: its namespace, or whether it is
    unregistered."""
    if decoded is None:
        return None
    if decoded.namespace:
        return id(decoded.namespace)
    return not (decoded.known and decoded.known.names)


# the LockRow fields the analysis reads of every row, in one call
_FIELDS = itemgetter(
    *map(
        LockRow._fields.index,
        ("locktype", "database", "classid", "objid", "objsubid", "pid", "granted", "keys", "mode"),
    )
)


def _idle_since(session: Session | None, now: datetime) -> float | None:
    """A lower bound on how long any lock of an idle backend has been held.

    An idle backend (in a transaction or not) acquires nothing: its locks were all taken
    before it went idle at ``state_change``. PostgreSQL records no acquisition time. Only a
    backend idle for the whole pg_locks read has one (``now`` is the statement's start):
    one that went idle after it may have been working when its locks were read.
    """
    if session is None or session.state_change is None or not session.idle_throughout(now):
        return None
    return (now - session.state_change).total_seconds()


def _flags(
    backend: _Backend,
    decoded: Decoded | None,
    granted: bool,
    blocks: tuple[int, ...],
    policy: Policy,
    lifetime: Lifetime | None,
    seen: SeenHeld | None = None,
) -> tuple[Flag, ...]:
    flags: list[Flag] = []
    session, pool, held = backend.session, backend.pool, backend.held if granted else None
    bound = longer(held, seen)  # --session-age and max_hold
    namespace = decoded.namespace if decoded else None
    certain_session = granted and lifetime == "session"
    expected_session = namespace is not None and namespace.expect == "session"
    long = bound is not None and bound >= policy.session_age
    if certain_session and decoded is not None and not expected_session and long:
        flags.append(Flag.LONG_SESSION_LOCK)
    if blocks and session and session.state in IN_TRANSACTION_IDLE and held is not None:
        flags.append(Flag.STUCK_OWNER)  # idle in transaction for the whole read
    if decoded is not None and namespace is None and not (decoded.known and decoded.known.names):
        flags.append(Flag.UNREGISTERED)  # nobody named it ("could be" names nothing)
    if pool is not None and certain_session and decoded is not None:
        if pool.via == "address":
            flags.append(Flag.POOLED_SESSION_LOCK)
        elif pool.client is None or pool.lends:  # a client attached now only borrows it
            flags.append(Flag.OUTLIVED_CLIENT)
    if namespace is not None and granted:
        if namespace.expect == "xact" and certain_session:
            flags.append(Flag.EXPECT_XACT)
        if namespace.max_hold is not None and bound is not None and bound > namespace.max_hold:
            flags.append(Flag.MAX_HOLD)
    return tuple(flags)


def privilege_notes(snapshot: Snapshot, entries: list[LockEntry]) -> list[str]:
    """Say which fields are hidden and which role would show them, and what kind of server
    was read."""
    notes = []
    if snapshot.server.in_recovery:
        notes.append(
            "this server is a standby in recovery: it shows only its own sessions' locks; "
            "advisory locks taken on the primary are not visible here"
        )
    return notes + _hidden_notes(snapshot, entries)


def _hidden_notes(snapshot: Snapshot, entries: list[LockEntry]) -> list[str]:
    sessions = {id(e.session): e.session for e in entries if e.session}.values()
    hidden = sorted(s.pid for s in sessions if s.hidden)
    if not hidden:
        return []
    user = snapshot.server.current_user
    shown = ", ".join(str(pid) for pid in hidden[:8]) + (" ..." if len(hidden) > 8 else "")
    return [
        f"{len(hidden)} session(s) of other roles ({shown}) show no state, times, client address "
        f"or query to {user}: lifetimes there are 'unknown'. "
        f"GRANT pg_monitor (or pg_read_all_stats) TO {user} to see them."
    ]
