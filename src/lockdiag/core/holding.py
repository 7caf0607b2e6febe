"""How a well-known program holds its lock, as one snapshot shows it.

The catalogue says how each program takes and holds its locks
(:class:`~lockdiag.core.catalogue.Software`: the routines that take each key, the connection its
work runs on when that is not the lock's, whether its routines run in the server); this reads
one snapshot against it:

- the routine: the holder's query names one of the routines that take the key (pg_partman's
  ``CALL partman.run_maintenance_proc()``), and with it the lock function;
- the sibling: the connection the work runs on while the lock waits on its own (the main
  connection of a Rails 6.1 migration, the psql of a Sqitch change): from the same client
  address, database and user, with the program's application_name, connected together with the
  holder, looked for only while the holder waits as that program's lock connection does;
- a lock left behind: a session lock of a program whose routines run in the server, held by an
  idle session: no call of them runs there, so the unlock at the end of the call was never
  reached (pg_partman's procedures release theirs on their normal path only).

Pure; the words of the advice are :mod:`lockdiag.core.findings.holders`'.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockdiag.core.analysis import Decoded, LockEntry
from lockdiag.core.catalogue import Hold, Known, Sibling, Software, calls_of, software_of_session
from lockdiag.core.leaders import poll_of
from lockdiag.core.model import IDLE_STATES, Session, Snapshot


@dataclass(frozen=True)
class Holding:
    """A lock of a well-known program and what the snapshot shows of how it is held."""

    entry: LockEntry
    known: Known
    software: Software
    call: Hold | None = None  # the call its holder's query names, taking this key
    sibling: Session | None = None  # the connection its work runs on (the nearest that fits)
    gap: float = 0.0  # seconds from the holder's ``since`` to the sibling's connection
    fits: int = 0  # the sessions that fit the sibling's description
    searched: bool = False  # looked for: "none" is an answer
    # the holder runs the program's work itself: its catalogue entry's lock-only connection
    # (Rails 6.1's) is not this one, whose last query is not the lock call (Rails 7.1's)
    works_here: bool = False

    @property
    def pid(self) -> int | None:
        return self.entry.lock.pid

    @property
    def calls(self) -> tuple[Hold, ...]:
        """The calls that take this key, as a holder's query shows them."""
        return calls_of(self.known.software, self.known.meaning)

    @property
    def keeps_working(self) -> bool:
        """Ending the lock's session does not stop the program's work, says its catalogue
        entry, and this holder is not one that runs the work itself."""
        return self.software.keeps_working and not self.works_here

    @property
    def sibling_gone(self) -> bool:
        """Its work's connection stays for the whole run, and none is left: the run's process
        is most likely gone, its lock's connection outliving it."""
        spec = self.software.sibling
        return spec is not None and spec.lasting and self.searched and self.sibling is None

    @property
    def left_behind(self) -> bool:
        """A session lock of routines that run in the server, on a session idle now and
        throughout the read: no call of them runs there to release it."""
        session = self.entry.session
        return (
            self.software.in_server
            and self.entry.lifetime == "session"
            and session is not None
            and session.state == "idle"
        )

    @property
    def in_transaction(self) -> bool:
        """Its holder is idle in a transaction (a call that returned inside it, or a program's
        own connection that waits in one by design)."""
        session = self.entry.session
        return session is not None and session.state in IDLE_STATES - {"idle"}


def holding(entry: LockEntry, snapshot: Snapshot) -> Holding | None:
    """How the program of ``entry``'s key holds it, or None when no catalogue entry speaks for
    it (no name, a mere guess, a registry namespace, a plugin's name without behaviour)."""
    decoded = entry.decoded
    known = decoded.known if decoded is not None else None
    software = known.behaviour if known is not None else None
    if known is None or software is None or not entry.lock.granted:
        return None
    session = entry.session
    call = None
    if session is not None and not session.hidden:
        query = session.query or ""
        call = next((c for c in calls_of(known.software, known.meaning) if c.named_in(query)), None)
    spec = software.sibling
    if spec is None or session is None or session.hidden:
        return Holding(entry, known, software, call)
    if spec.lock_only and not _lock_call(session, decoded):
        return Holding(entry, known, software, call, works_here=True)
    return _with_sibling(Holding(entry, known, software, call), spec, session, snapshot)


def _lock_call(session: Session, decoded: Decoded | None) -> bool:
    """Whether the session's last query is a try-lock of the decoded key."""
    poll = poll_of(session)
    return poll is not None and decoded is not None and poll.key == decoded.triple


def _with_sibling(found: Holding, spec: Sibling, holder: Session, snapshot: Snapshot) -> Holding:
    """The sibling, where the holder waits as the program's lock connection does (Rails 6.1:
    idle, its last query the lock call; Sqitch: idle in transaction); otherwise its work may
    be its own (Rails 7.1 takes the lock on its migration's connection), and none is looked
    for."""
    if holder.hidden or holder.state != spec.holder:
        return found
    since = holder.backend_start if spec.since == "backend_start" else holder.xact_start
    if since is None:  # between two changes: no transaction, no psql
        return found
    names = {spec.application or holder.application_name or None}
    if holder.application_name:  # a name set for the program (PGAPPNAME) names its children too
        names.add(holder.application_name)
    earliest, latest = spec.window
    own = {snapshot.server.backend_pid, holder.pid}
    lock = found.entry.lock
    key = (lock.classid, lock.objid, lock.objsubid)
    lockers = {r.pid for r in snapshot.locks if (r.classid, r.objid, r.objsubid) == key}
    # the sibling's user is the holder's: a role that sees the holder sees its sessions, so
    # none that could be it is hidden, and finding none is an answer
    fits: list[tuple[float, Session]] = []
    for other in snapshot.sessions.values():
        if other.pid in own or other.database != holder.database or other.hidden:
            continue
        if (
            other.backend_type not in (None, "client backend")
            or (other.application_name or None) not in names
            or other.user != holder.user
            or other.client_addr != holder.client_addr
            or other.backend_start is None
            or other.pid in lockers  # another instance, holding or waiting for the key
            or poll_of(other) is not None  # another instance, trying the key
        ):
            continue
        gap = (other.backend_start - since).total_seconds()
        if earliest <= gap <= latest:
            fits.append((gap, other))
    if not fits:
        return Holding(found.entry, found.known, found.software, found.call, searched=True)
    gap, sibling = min(fits, key=lambda pair: (abs(pair[0]), pair[1].pid))
    return Holding(
        found.entry, found.known, found.software, found.call, sibling, gap, len(fits), True
    )


def named_session(entry: LockEntry) -> Holding | None:
    """A session that names its program by its application_name, holding none of that
    program's keys (pg_repack's second connection): spoken of in that program's terms."""
    session = entry.session
    known = software_of_session(session.application_name if session is not None else None)
    behaviour = known.behaviour if known is not None else None
    if known is None or behaviour is None:
        return None
    return Holding(entry, known, behaviour)


def holding_of(entries: list[LockEntry], snapshot: Snapshot) -> Holding | None:
    """The program lock a backend's ``entries`` are best spoken of by: one others wait for
    first, else the first that a catalogue entry speaks for; else the program its session
    names."""
    ranked = sorted(entries, key=lambda e: not e.blocks)
    for entry in ranked:
        found = holding(entry, snapshot)
        if found is not None:
            return found
    return named_session(ranked[0]) if ranked else None
