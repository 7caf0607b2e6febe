"""`lockdiag terminate PID`: what ending one session would release, or why lockdiag refuses.

Pure: the preview is read from a Diagnosis, and so are the checks around a cancel (whether the
session still runs a query to cancel; what a new read after the cancel shows released). The
action itself (one pg_cancel_backend or pg_terminate_backend on the one pid asked for) is
:mod:`lockdiag.pg.actions`'. lockdiag never releases locks in bulk: ``pg_advisory_unlock_all()``
on a shared connection is the anti-pattern it warns about.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockdiag.core.analysis import LockEntry
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import software_step
from lockdiag.core.graph import behind
from lockdiag.core.holding import Holding, holding_of
from lockdiag.core.model import IDLE_STATES, LockRow, PoolLink, Session, Snapshot
from lockdiag.errors import InputError

RUNNING = frozenset({"active", "fastpath function call"})  # states in which a query runs


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
    pool: PoolLink | None = None  # when it is a pooler's server connection
    program: Holding | None = None  # a well-known program's lock among them, and how it holds it
    advice: str = ""  # check's next step for that lock, in the program's terms

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
    if session.backend_start is None or session.backend_type is None:
        # the action signals the pid only if it is still the session shown (its
        # backend_start): unseen, a later session given the same pid would pass that check
        raise Refused(
            f"pid {pid}'s session is hidden from {snapshot.server.current_user} (no start time, "
            "no backend type): lockdiag cannot tell it from a later session given the same pid, "
            "nor whether it is a client backend; nothing done",
            hint=f"GRANT pg_read_all_stats (or pg_monitor) TO {snapshot.server.current_user}, "
            "or run lockdiag as the session's own role",
        )
    if session.backend_type != "client backend":
        raise Refused(f"pid {pid} is not a client backend: it is the {session.backend_type}")
    if session.leader_pid is not None and session.leader_pid != pid:
        raise Refused(
            f"pid {pid} is a parallel worker of pid {session.leader_pid}: act on the leader"
        )
    mine = [e for e in diagnosis.entries if e.lock.pid == pid]
    holds = [e for e in mine if e.lock.granted]
    waits = next((e for e in mine if not e.lock.granted), None)
    blocked = behind(diagnosis.graph, pid)
    releases = sorted(holds, key=lambda e: (not e.blocks, e.lock.locktype != "advisory"))
    pool = next((e.pool for e in mine if e.pool is not None), None)
    program = holding_of(holds, snapshot)
    advice = software_step(program, snapshot) if program is not None else ""
    return Preview(pid, session, holds, waits, blocked, releases, pool, program, advice)


FORCE = "--force"


def keeps_working(plan: Preview, cancel: bool) -> str | None:
    """Why lockdiag will not end this session unasked (--yes), or None: it holds the lock of a
    program whose catalogue entry says ending that lock's session does not stop its work (it
    runs on another connection), so the lock would go while the work goes on and a second
    instance may start beside it. A prompt shows the preview first; --yes needs FORCE too.
    A cancel releases no session lock, so it is not refused here."""
    program = plan.program
    if cancel or program is None or not program.keeps_working:
        return None
    known = program.known
    where = ""
    if program.sibling is not None and program.software.sibling is not None:
        where = f" (its {program.software.sibling.work} runs on pid {program.sibling.pid})"
    ending = program.software.ending or "does not stop its work"
    return (
        f"pid {plan.pid} holds {known.software}'s {known.meaning}{where}: ending it {ending}; "
        f"nothing done. Run it without --yes to see the preview and confirm, or add {FORCE} "
        "if that is what you mean"
    )


END_ATTACHED_CLIENT = "--end-attached-client"


def attached_client(plan: Preview, cancel: bool) -> str | None:
    """Why lockdiag will not end (or cancel) a pooled server connection on its own, or None:
    the console shows a client attached to it now. Its transaction is that client's work,
    whatever lock the connection kept from an earlier one; ending it needs the option that
    says so (END_ATTACHED_CLIENT)."""
    pool = plan.pool
    if pool is None or pool.via != "console" or not pool.client:
        return None
    action = "cancelling its query" if cancel else "ending it"
    return (
        f"pid {plan.pid} is a pooled server connection of {pool.pooler} and client "
        f"{pool.client} is attached to it now: {action} would end that client's transaction, "
        f"not only the lock's lost owner; nothing done. Run it again once that client's "
        f"transaction ends, or add {END_ATTACHED_CLIENT} to end that client's work too"
    )


def client_since_preview(plan: Preview, now: PoolLink | None) -> str | None:
    """Why ending a pooled server connection must not go ahead now, or None: a client attached
    to it since the preview (or another client than the one shown). Between transactions a
    pool hands a server connection to whichever client asks next; ending it now would end
    that client's work, not the lock's lost owner."""
    shown = plan.pool
    if shown is None or shown.via != "console":
        return None
    client = now.client if now is not None else None
    if client == shown.client:
        return None
    if client is None:
        return None  # the client shown left: nobody else's work is on it now
    was = f"client {shown.client} was attached" if shown.client else "no client was attached"
    return (
        f"pid {plan.pid} is a pooled server connection of {shown.pooler} and client {client} "
        f"is attached to it now ({was} in the preview): ending it would end that client's "
        f"work; nothing done. Run lockdiag terminate {plan.pid} again to see it as it is now"
    )


def nothing_to_cancel(session: Session, now: bool = False) -> str | None:
    """Why a cancel would do nothing to ``session`` (no query runs: pg_cancel_backend still
    returns true, and nothing is released), or None. A hidden state is not refused: the
    check after the cancel says what it could see. ``now``: at the act step, after the
    preview."""
    pid, state = session.pid, session.state
    if state not in IDLE_STATES:
        return None
    was = f"pid {pid} is now {state} (it ran a query in the preview)" if now else ""
    if state == "idle":
        return (
            f"{was or f'pid {pid} is idle'}: it runs no query to cancel, and cancelling releases "
            "none of its session-level locks; nothing done (without --cancel, ending the "
            "session releases them)"
        )
    return (
        f"nothing to cancel: {was or f'pid {pid} is {state}'}; cancelling releases nothing — "
        "its locks stay until the transaction ends; nothing done (without --cancel, ending "
        "the session releases them)"
    )


@dataclass(frozen=True)
class AfterCancel:
    """What a new read shows after a cancel request, against the preview."""

    state: str | None  # its state now; None when hidden or when it is gone
    gone: bool  # the backend ended (or its pid is now another session's): every lock released
    stopped: bool  # the query shown no longer runs (cancelled, or it ended meanwhile)
    released: list[LockEntry]  # previewed granted locks no longer held
    still_held: list[LockEntry]  # previewed granted locks still held
    still_waits: bool  # it still waits for the lock it waited for in the preview

    @property
    def aborted(self) -> bool:
        return self.state == "idle in transaction (aborted)"


def after_cancel(plan: Preview, now: Snapshot) -> AfterCancel:
    """Compare a read taken after the cancel with the preview: which of the locks shown are
    gone, and whether the query stopped (its state left active, or its query or transaction
    is another one). A hidden state shows no evidence: never counted as stopped."""
    session = now.session(plan.pid)
    if session is None or session.backend_start != plan.session.backend_start:
        return AfterCancel(None, True, True, list(plan.releases), [], False)
    held = {_identity(lock) for lock in now.locks if lock.pid == plan.pid}
    released = [e for e in plan.releases if _identity(e.lock) not in held]
    still_held = [e for e in plan.releases if _identity(e.lock) in held]
    still_waits = plan.waits is not None and _identity(plan.waits.lock) in held
    before = plan.session
    stopped = not session.hidden and (
        session.state not in RUNNING
        or session.query_start != before.query_start
        or session.xact_start != before.xact_start
    )
    return AfterCancel(session.state, False, stopped, released, still_held, still_waits)


def _identity(lock: LockRow) -> tuple[object, ...]:
    """A lock as pg_locks names it, for this pid: its object, mode and whether granted."""
    # pg_locks' columns in its order, packed as pg/actions' _LOCK_FIELDS names them
    # fmt: off
    return (
        lock.locktype, lock.database, lock.relation, lock.page, lock.tuple, lock.virtualxid,
        lock.transactionid, lock.classid, lock.objid, lock.objsubid, lock.mode, lock.granted,
    )
    # fmt: on
