"""Whether a lock's owner is done with it, and how strong the evidence is.

An idle session proves only that it is idle. A coordinator keeps its lock on a dedicated idle
connection while its work runs on others; a library sits between two statements inside its
critical section; pg_repack keeps a connection idle in transaction for the whole repack. So
the advice that follows a held lock states its evidence, at one of three levels:

- ``proven``: the owner is gone: a pooled server connection with no client attached (read
  from the pooler's console), or a session lock on a connection that transaction pooling
  lends to a client now, older than that client's transaction (a waiter began before it) or
  seen by an earlier read with no client attached;
- ``declared``: the team declared the lock should not be held like this (the namespace's
  ``expect = "xact"`` for a certain session lock, or its ``max_hold`` exceeded);
- ``unknown``: idle, nothing more.

With ``unknown`` the advice names both possibilities and the step that tells them apart (the
owning process, found from the client address and port; the program's other sessions now),
and never offers to end the session.

The exclusion rule (:func:`may_release`): a timeout, a termination or a cancel releases every
lock of the session, and a program that holds an advisory lock believes it keeps it. Some hold
one idle in a transaction by design (a coordination library's lock connection, a two-phase
commit between its phases): ended, another instance takes the lock while the first still
believes it holds it. Such an action is advised for a holder of advisory locks only with
``proven`` or ``declared`` evidence; otherwise the advice says what it would break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lockdiag.core.analysis import Flag, LockEntry
from lockdiag.core.leaders import poll_of
from lockdiag.core.model import PoolLink, Remembered, Session, Snapshot
from lockdiag.durations import format_duration
from lockdiag.registry import Namespace

Level = Literal["proven", "declared", "unknown"]
SIBLINGS_SHOWN = 3  # the program's other sessions named in the advice


@dataclass(frozen=True)
class Ownership:
    """The evidence that the owner's work is over: its level and what it rests on."""

    level: Level
    evidence: str
    going_on: bool = False  # the evidence is of its work going on elsewhere (core.holding)

    @property
    def sentence(self) -> str:
        """The evidence as a sentence of its own."""
        return self.evidence[:1].upper() + self.evidence[1:]

    @property
    def allows_ending(self) -> bool:
        """Whether ending the session may be offered (never as the first step)."""
        return self.level != "unknown"


def ownership(group: list[LockEntry], remembered: Remembered | None = None) -> Ownership:
    """The strongest evidence any of one backend's locks gives that its work is over;
    ``remembered``: what earlier reads showed of the backend (commands that read over time)."""
    for entry in group:
        pool = entry.pool
        if pool is not None and pool.via == "console" and pool.client is None:
            return Ownership(
                "proven",
                f"a server connection of {pool.pooler} pool {pool.pool or '?'} with no client "
                "attached: the client that took the lock is gone",
            )
        if pool is not None and pool.client and Flag.OUTLIVED_CLIENT in entry.flags:
            return Ownership("proven", borrowed(entry, pool, remembered))
    for entry in group:
        namespace = entry.decoded.namespace if entry.decoded else None
        if namespace is None:
            continue
        if Flag.MAX_HOLD in entry.flags and namespace.max_hold is not None:
            return Ownership(
                "declared",
                f"held past {namespace.name}'s max_hold of {format_duration(namespace.max_hold)}",
            )
        if Flag.EXPECT_XACT in entry.flags:
            return Ownership(
                "declared",
                f"its namespace {namespace.name} declares transaction-level locks "
                '(expect = "xact"), and this one outlived its transaction',
            )
    return Ownership("unknown", "the session is idle: that proves only that it is idle")


def borrowed(entry: LockEntry, pool: PoolLink, remembered: Remembered | None) -> str:
    """The evidence that a session lock on a connection lent to a client now is not that
    client's: what the lock outlived, and how that is known."""
    session = entry.session
    if remembered is not None and entry.lock.lock_object in remembered.locks:
        seen = remembered.seen.isoformat(timespec="seconds")
        how = (
            f"a read at {seen} showed it with no client attached, holding this lock, and "
            "every read since the same backend holding it"
        )
    elif session is not None and session.xact_start is not None and entry.blocks:
        how = (
            f"pid {entry.blocks[0]} has waited for it since before the current transaction "
            "on this connection began, so it was taken in an earlier one and is a session lock"
        )
    else:
        how = "it is held with no transaction open, so it is a session lock"
    return (
        f"a server connection of {pool.pooler} pool {pool.pool or '?'} that {pool.pool_mode} "
        f"pooling lends to client {pool.client} now: {how}; it outlived the transaction that "
        "took it, and the client that took it no longer has the connection"
    )


def may_release(owner: Ownership, advisory: bool) -> bool:
    """The exclusion rule, decided here only: whether an action that releases the session's
    locks (a timeout, a termination, a cancel) may be advised. Never for a holder of advisory
    locks, unless its program is gone (proven) or its lock is outside its design (declared)."""
    return owner.allows_ending or not advisory


def what_ending_breaks(action: str, namespace: Namespace | None) -> str:
    """For a holder of advisory locks without that evidence: what ``action`` would break, and
    the registry's declared terms for the lock where it has any."""
    breaks = (
        f"{action} would release its lock while its program may believe it holds it: another "
        "instance would take it"
    )
    if namespace is None:
        return breaks
    declared = f'{namespace.name} declares expect = "{namespace.expect}"'
    if namespace.max_hold is None:
        return f"{breaks}. {declared} and no max_hold: declare one to bound its holds"
    limit = format_duration(namespace.max_hold)
    return f"{breaks}. {declared} and max_hold {limit}, not seen passed"


def written(session: Session | None) -> str:
    """What ending the session would lose of its writes, from its transaction id; "" when the
    snapshot does not say (a file from before lockdiag read it)."""
    if session is None or session.wrote is None:
        return ""
    if not session.wrote:
        return "it has written nothing (no transaction id), so ending it loses no writes"
    return (
        f"it holds transaction id {session.backend_xid}, so it may have written: ending it "
        "rolls that back"
    )


def tell_apart(entry: LockEntry, snapshot: Snapshot) -> str:
    """The step that tells "its work goes on elsewhere" from "the unlock was missed": where
    the owning process is, then what the same program's other sessions do now."""
    return f"{locate(entry)}, and {siblings(entry, snapshot)}"


def locate(entry: LockEntry) -> str:
    """How to find the process that owns the session, from its client address and port."""
    session, pool = entry.session, entry.pool
    if pool is not None and pool.via == "console" and pool.client:
        host, _, port = pool.client.rpartition(":")
        return (
            f"its client is the pool's {pool.client}: on {host}, "
            f"`ss -tnp 'sport = :{port}'` names the owning process"
        )
    if session is None or session.hidden:
        return "its client address is hidden (a role with pg_read_all_stats sees it)"
    if session.client_addr and session.client_port and session.client_port > 0:
        return (
            f"on {session.client_addr}, `ss -tnp 'sport = :{session.client_port}'` names the "
            "owning process"
        )
    return (
        f"it came through the server's Unix socket: the owning process is on the database "
        f"host (`ss -xp` pairs its socket with backend pid {entry.lock.pid})"
    )


def siblings(entry: LockEntry, snapshot: Snapshot) -> str:
    """The program's other sessions now (same application name, same client host): work
    going on there is work the lock may still guard."""
    session = entry.session
    if session is None or session.hidden:
        return "then see what that program is doing"
    app, host = session.application_name, session.client_addr
    same = [
        s
        for s in snapshot.sessions.values()
        if s.pid != session.pid
        and s.backend_type in (None, "client backend")
        and (s.application_name or None) == (app or None)
        and s.client_addr == host
    ]
    # a session waiting for a lock does no work the lock guards (it may wait for this one);
    # nor does one whose last query is a try-lock: a standby polling, maybe for this lock
    others = [s for s in same if s.wait_event_type != "Lock" and poll_of(s) is None]
    waiting = sum(1 for s in same if s.wait_event_type == "Lock")
    polling = len(same) - len(others) - waiting
    who = (f"of {app} " if app else "") + (f"from {host}" if host else "on the local socket")
    blocked = f" ({waiting} more wait for a lock)" if waiting else ""
    if polling:
        blocked += f" ({polling} more poll a try-lock)"
    if not others:
        return f"no other session {who} is at work now{blocked}: any work it guards runs elsewhere"
    others.sort(key=lambda s: (s.state != "active", s.pid))
    shown = ", ".join(_doing(s, snapshot) for s in others[:SIBLINGS_SHOWN])
    more = f" and {len(others) - SIBLINGS_SHOWN} more" if len(others) > SIBLINGS_SHOWN else ""
    return f"other sessions {who} now: {shown}{more}{blocked}"


def _doing(session: Session, snapshot: Snapshot) -> str:
    state = session.state or "state hidden"
    since = ""
    if session.state_change is not None:
        since = f" {format_duration((snapshot.server.now - session.state_change).total_seconds())}"
    return f"pid {session.pid} {state}{since}"
