"""Detectors of holders: a session lock that outlived its pooled client, a certain session
lock held past --session-age (a leader's said so), an owner idle in transaction while others
wait; and the next steps for them, in a known software's terms where it is one."""

from __future__ import annotations

from collections.abc import Iterator

from lockdiag.core.analysis import LockEntry
from lockdiag.core.findings.model import Finding, Kind
from lockdiag.core.findings.programs import program_owner, software_step
from lockdiag.core.findings.words import (
    by_backend,
    held_words,
    label,
    labels,
    listed,
    locks_in,
    who,
)
from lockdiag.core.holding import Holding, holding, named_session
from lockdiag.core.leaders import NO_CONTENTION, Contention, Leader
from lockdiag.core.model import Snapshot
from lockdiag.core.ownership import (
    Ownership,
    may_release,
    ownership,
    tell_apart,
    what_ending_breaks,
    written,
)
from lockdiag.core.policy import CheckPolicy
from lockdiag.durations import format_duration
from lockdiag.registry import Namespace


def _program(pid: int | None, software: dict[int, LockEntry], snapshot: Snapshot) -> Holding | None:
    """How the well-known program whose lock ``pid`` holds holds it, for advice in its terms."""
    entry = software.get(pid) if pid is not None else None
    return holding(entry, snapshot) if entry is not None else None


def outlived_clients(
    leaked: list[LockEntry], software: dict[int, LockEntry], snapshot: Snapshot
) -> Iterator[Finding]:
    """The leak this tool exists for: a session lock taken through a transaction-pooling
    PgBouncer, on a server connection that no client is using any more, or that the pool
    lends to a client now which did not take it (flagged so)."""
    for group in by_backend(leaked):
        entry, pool, count = group[0], group[0].pool, locks_in(group)
        assert pool is not None
        pid = entry.lock.pid
        held = entry.held_at_least
        bound = f" for at least {format_duration(held)}" if held is not None else ""
        waiting = sum(len(e.blocks) for e in group)
        what = "lock outlived its client" if count == 1 else f"{count} locks outlived their client"
        attached = (
            f"lent to client {pool.client} now (it only borrows the connection)"
            if pool.client
            else "with no client attached"
        )
        program = _program(pid, software, snapshot)
        yield Finding(
            Kind.OUTLIVED_CLIENT,
            "critical" if waiting else "warning",
            pid,
            labels(group),
            f"{what}: taken through pool {pool.pool} of {pool.pooler} "
            f"({pool.pool_mode or 'unknown'} pooling), held{bound} by server connection "
            f"pid {pid} {attached}{listed(group)}"
            + (f"; {waiting} session(s) wait for it" if waiting else ""),
            software_step(program, snapshot)
            if program is not None
            else "use transaction-level locks (pg_advisory_xact_lock) behind a transaction "
            "pooler, or session pooling, or server_reset_query_always = 1; last resort: "
            f"lockdiag terminate {pid} (ends that pooled server connection; "
            + (
                f"it refuses while client {pool.client} is attached: once that client's "
                "transaction ends, run it again"
                if pool.client
                else "only while its preview shows no client attached: between transactions "
                "the pool hands it to other clients"
            )
            + ")",
            entry,
            held,
            count,
            owner=ownership(group, snapshot.remembered.get(pid) if pid is not None else None),
        )


def session_locks(
    old: list[LockEntry],
    policy: CheckPolicy,
    software: dict[int, LockEntry],
    snapshot: Snapshot,
    standing: Contention = NO_CONTENTION,
) -> Iterator[Finding]:
    # the flag: a certain session lock held past --session-age's warning level, in a namespace
    # not declared long-lived (a leader lock never raises an alert)
    for group in by_backend(old):
        entry, count = group[0], locks_in(group)
        held = entry.held_for  # the backend's: the same for each of its locks
        severity = policy.session_age.severity(held)
        if severity is None or held is None:
            continue
        what = (
            "certain session-level lock" if count == 1 else f"{count} certain session-level locks"
        )
        program = _program(entry.lock.pid, software, snapshot)
        owner = (program_owner(program) if program else None) or ownership(group)
        leader = standing.leader_of(entry.lock.pid)
        yield Finding(
            Kind.SESSION_LOCK,
            severity,
            entry.lock.pid,
            labels(group),
            f"{what} held by {who(entry)}, idle, for at least {held_words(entry)}"
            + listed(group)
            + (f"; a leader lock: {leader.polling()}" if leader is not None else ""),
            software_step(program, snapshot)
            if program is not None
            else _leader_step(leader)
            if leader is not None
            else _idle_holder_step(entry, owner, snapshot),
            entry,
            held,
            count,
            owner=owner,
        )


def _leader_step(leader: Leader) -> str:
    """For a leader with standbys polling: failover is the design, not a hazard, and the
    registry declaration that quiets it."""
    return (
        "a leader lock is held for the life of its process, and its standbys take it over when "
        f"that process ends (failover, by design): {leader.declaration()}. If no process of "
        "that program should lead now, the unlock was missed: find it from the leader's client "
        "address and port"
    )


def _idle_holder_step(entry: LockEntry, owner: Ownership, snapshot: Snapshot) -> str:
    """For an idle holder of session locks: with no evidence that its work is over, both
    possibilities and the step that tells them apart; ending it only once that is known."""
    apart = tell_apart(entry, snapshot)
    if not may_release(owner, advisory=True):
        return (
            "idle proves only that it is idle: its work may go on elsewhere (on another "
            "connection, or outside the database), or the unlock was missed (a missing "
            "pg_advisory_unlock, a lock taken through a pooled connection). Tell them apart: "
            f"{apart}. Do not end it before you know: "
            + what_ending_breaks("ending it", _namespace(entry))
        )
    return _ending_step(entry, owner, apart)


def _ending_step(entry: LockEntry, owner: Ownership, apart: str, lost: str = "") -> str:
    """Ending the session, offered after the step that checks the owning process, for a
    holder whose evidence allows it (see core.ownership.may_release)."""
    return (
        f"{owner.sentence}. Check the owning process first: {apart}. Once its work is known "
        f"to be over: lockdiag terminate {entry.lock.pid}" + (f" ({lost})" if lost else "")
    )


def _namespace(entry: LockEntry) -> Namespace | None:
    return entry.decoded.namespace if entry.decoded is not None else None


def stuck_owners(
    stuck: list[LockEntry], policy: CheckPolicy, snapshot: Snapshot, software: dict[int, LockEntry]
) -> Iterator[Finding]:
    server = snapshot.server
    reported: set[int | None] = set()
    advisory = _advisory_holders(snapshot) if stuck else set()  # read only when needed
    for entry in stuck:
        session = entry.session
        if session is None or entry.lock.pid in reported:
            continue
        idle = entry.held_at_least  # for an idle backend: time since it went idle
        severity = policy.idle_age.severity(idle)
        if severity is None or idle is None:
            continue
        reported.add(entry.lock.pid)
        pid = entry.lock.pid
        program = _program(pid, software, snapshot) or named_session(entry)
        owner = (program_owner(program) if program else None) or ownership([entry])
        yield Finding(
            Kind.STUCK_OWNER,
            severity,
            entry.lock.pid,
            label(entry, server),
            f"{who(entry)} is {session.state} for {format_duration(idle)} while "
            f"{len(entry.blocks)} session(s) wait for its lock",
            software_step(program, snapshot)
            if program is not None
            else _stuck_owner_step(entry, owner, snapshot, pid in advisory),
            entry,
            idle,
            owner=owner,
        )


def _advisory_holders(snapshot: Snapshot) -> set[int | None]:
    """The backends holding an advisory lock: their exclusion depends on their sessions."""
    return {r.pid for r in snapshot.locks if r.granted and r.locktype == "advisory"}


def _stuck_owner_step(
    entry: LockEntry, owner: Ownership, snapshot: Snapshot, advisory: bool
) -> str:
    """For a holder idle in transaction while others wait: what its idleness can mean and the
    step that tells it apart. A holder of advisory locks may be idle in its transaction by
    design: no timeout and no terminate without evidence (see core.ownership.may_release).
    For one holding none: a timeout for that program only (a server-wide one would also end
    the pauses of programs that do), and ending it where it has written nothing."""
    apart, lost = tell_apart(entry, snapshot), written(entry.session)
    if advisory:
        if may_release(owner, advisory):
            return _ending_step(entry, owner, apart, lost or "rolls back its transaction")
        return (
            "idle in transaction proves only that it is idle: some programs hold their lock so "
            "by design (a coordination library's lock connection, a two-phase commit between "
            f"its phases), others lost track of it. Tell them apart: {apart}. No "
            "idle_in_transaction_session_timeout and no terminate: "
            + what_ending_breaks("either", _namespace(entry))
        )
    session = entry.session
    role = session.user if session and session.user and not session.hidden else "ROLE"
    step = (
        "idle in transaction proves only that it is idle: the program keeps its transaction "
        f"open between statements, or lost track of it. Tell them apart: {apart}. It holds no "
        "advisory lock, so idle_in_transaction_session_timeout is safe for it: set it above "
        "its longest normal pause in its own connections (SET at connect), or by ALTER ROLE "
        f"{role} if no program of that role holds advisory locks in a transaction (never "
        "server-wide)"
    )
    if session is not None and session.wrote is False:  # a reader: ending it costs no data
        return f"{step}. {lost[:1].upper()}{lost[1:]}: lockdiag terminate {entry.lock.pid}"
    if owner.allows_ending:
        return f"{step}. {owner.sentence}: once its work is known to be over, " + (
            f"lockdiag terminate {entry.lock.pid} ({lost or 'rolls back its transaction'})"
        )
    return f"{step}. {lost[:1].upper()}{lost[1:]}" if lost else step
