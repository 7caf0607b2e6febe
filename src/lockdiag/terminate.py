"""`lockdiag terminate PID`: the last resort, previewed, refused where unsafe, one pid only.

This is the only module that changes server state, and only through pg_cancel_backend or
pg_terminate_backend on the one pid asked for. It never releases locks in bulk:
``pg_advisory_unlock_all()`` on a shared connection is the anti-pattern lockdiag warns about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockdiag.analysis import LockEntry, analyse
from lockdiag.errors import InputError
from lockdiag.graph import behind, blockers
from lockdiag.registry import Registry
from lockdiag.snapshot import Session, Snapshot

if TYPE_CHECKING:
    import psycopg


class Refused(InputError):
    """lockdiag will not act on that pid; nothing was done."""


@dataclass(frozen=True)
class Preview:
    pid: int
    session: Session
    holds: list[LockEntry]  # every lock it holds
    waits: LockEntry | None  # the lock it waits for, if any
    blocked: list[int]  # sessions held up behind it, directly or not, nearest first
    releases: list[LockEntry]  # what ending it releases (locks others wait for come first)


def preview(snapshot: Snapshot, registry: Registry, pid: int) -> Preview:
    """What ending ``pid`` would release, or Refused when lockdiag must not act on it."""
    if pid == snapshot.server.backend_pid:
        raise Refused(f"pid {pid} is lockdiag's own session")
    session = snapshot.session(pid)
    if session is None or not any(lock.pid == pid for lock in snapshot.locks):
        raise Refused(
            f"pid {pid} holds and waits for no lock (or does not exist): lockdiag terminate "
            "only acts on sessions that take part in locking"
        )
    if session.backend_type not in (None, "client backend"):
        raise Refused(f"pid {pid} is a {session.backend_type}, not a client backend")
    if session.leader_pid is not None and session.leader_pid != pid:
        raise Refused(
            f"pid {pid} is a parallel worker of pid {session.leader_pid}: act on the leader"
        )
    entries = analyse(snapshot, registry, advisory_only=False)
    mine = [e for e in entries if e.lock.pid == pid]
    holds = [e for e in mine if e.lock.granted]
    waits = next((e for e in mine if not e.lock.granted), None)
    blocked = behind(blockers(snapshot, registry, entries=entries), pid)
    releases = sorted(holds, key=lambda e: (not e.blocks, e.lock.locktype != "advisory"))
    return Preview(pid, session, holds, waits, blocked, releases)


@dataclass(frozen=True)
class Outcome:
    done: bool
    message: str


def act(connection: psycopg.Connection[Any], pid: int, cancel: bool, wait: float) -> Outcome:
    """Cancel the query of, or end, exactly one backend; say what happened."""
    if cancel:
        (sent,) = connection.execute("SELECT pg_catalog.pg_cancel_backend(%s)", (pid,)).fetchone()  # type: ignore[misc]
        if sent:
            return Outcome(True, f"cancel request sent to pid {pid}: its current query stops, "
                           "its session and session-level locks stay")  # fmt: skip
        return Outcome(False, f"pid {pid} is gone: nothing to cancel")
    milliseconds = max(1, int(wait * 1000))
    row = connection.execute(
        "SELECT pg_catalog.pg_terminate_backend(%s, %s)", (pid, milliseconds)
    ).fetchone()
    if row and row[0]:
        return Outcome(True, f"pid {pid} ended; its locks are released")
    still_there = connection.execute(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    if still_there and still_there[0]:
        return Outcome(False, f"pid {pid} was signalled but had not exited after {wait:g}s")
    return Outcome(False, f"pid {pid} is gone: nothing to end")
