"""`lockdiag terminate PID`: what ending one session would release, or why lockdiag refuses.

Pure: the preview is read from a Diagnosis. The action itself (one pg_cancel_backend or
pg_terminate_backend on the one pid asked for) is :mod:`lockdiag.pg.actions`'. lockdiag never
releases locks in bulk: ``pg_advisory_unlock_all()`` on a shared connection is the
anti-pattern it warns about.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockdiag.core.analysis import LockEntry
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.graph import behind
from lockdiag.core.model import LockRow, Session
from lockdiag.errors import InputError


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

    @property
    def decisive(self) -> list[LockRow]:
        """The locks the decision rests on, which the action checks are still there: those
        others wait for, else every lock it holds; for a waiter, the lock it waits for."""
        blocking = [e.lock for e in self.holds if e.blocks]
        held = blocking or [e.lock for e in self.holds]
        return held + ([self.waits.lock] if self.waits is not None and not held else [])


def preview(diagnosis: Diagnosis, pid: int) -> Preview:
    """What ending ``pid`` would release, or Refused when lockdiag must not act on it."""
    snapshot = diagnosis.snapshot
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
    mine = [e for e in diagnosis.entries if e.lock.pid == pid]
    holds = [e for e in mine if e.lock.granted]
    waits = next((e for e in mine if not e.lock.granted), None)
    blocked = behind(diagnosis.graph, pid)
    releases = sorted(holds, key=lambda e: (not e.blocks, e.lock.locktype != "advisory"))
    return Preview(pid, session, holds, waits, blocked, releases)
