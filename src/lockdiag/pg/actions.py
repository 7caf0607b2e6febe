"""The only server-changing calls: cancel the query of, or end, exactly one backend.

Reached only through `lockdiag terminate`, after a preview and a confirmation. Between the two a
person may take minutes: the backend may have ended and its pid been reused by an unrelated
session, or it may have released its lock. The action is one statement that signals the pid
only if it is still the previewed session holding what the preview showed, and otherwise says
what changed. Nothing here releases a lock in any other way.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple

from lockdiag.core.model import LockRow, PoolLink
from lockdiag.core.termination import Preview, client_since_preview, nothing_to_cancel
from lockdiag.errors import ServerError
from lockdiag.pg.deadline import NoAnswer
from lockdiag.pg.pgbouncer import link_now
from lockdiag.pg.session import DiagnosticSession

# pg_locks' columns in its order, packed as core/termination's _identity reads them
# fmt: off
_LOCK_FIELDS = (
    "locktype", "database", "relation", "page", "tuple", "virtualxid", "transactionid",
    "classid", "objid", "objsubid", "mode", "granted",
)
# fmt: on


# the rows of the actions' queries (tests/test_query_rows.py checks each query's columns
# against these names)
class Signal(NamedTuple):
    """signal_backend.sql: whether the pid still exists, since when, how many of the locks
    shown it no longer holds, its state, and whether the signal was sent (NULL: not sent)."""

    alive: bool
    backend_start: datetime | None
    missing: int
    state: str | None
    signalled: bool | None


class Alive(NamedTuple):
    """backend_alive.sql: how many backends have the pid (0 or 1)."""

    alive: int


NOT_FOUND = Signal(False, None, 0, None, None)


@dataclass(frozen=True)
class Outcome:
    done: bool
    message: str


def act(session: DiagnosticSession, plan: Preview, cancel: bool, wait: float) -> Outcome:
    """Cancel the query of, or end, the previewed backend, if it is still that session in the
    state the preview showed; say what happened. Ending it, wait up to ``wait`` seconds for the
    backend to exit; once the signal is sent, what follows is reported as seen, never as an
    error (a stopped backend acts on the signal only when it runs again)."""
    pid = plan.pid
    if plan.pool is not None and plan.pool.via == "console":
        moved = client_since_preview(plan, _link_now(session, plan, plan.pool))
        if moved is not None:
            return Outcome(False, moved)
    try:
        row = session.fetch(
            "signal_backend",
            {
                "pid": pid,
                "backend_start": plan.session.backend_start,
                "locks": json.dumps([_lock(lock) for lock in plan.decisive]),
                "cancel": cancel,
            },
        )
    except NoAnswer as error:  # the statement may have run: say that nobody knows
        raise NoAnswer(
            f"{error}; whether pid {pid} was {'cancelled' if cancel else 'ended'} is unknown",
            hint=f"look before trying again: lockdiag list, or lockdiag terminate {pid} (it "
            "previews first); " + (error.hint or ""),
        ) from None
    alive, backend_start, missing, state, signalled = Signal._make(row) if row else NOT_FOUND
    if not alive:
        return Outcome(False, f"pid {pid} is gone: nothing to {'cancel' if cancel else 'end'}")
    if backend_start != plan.session.backend_start:
        return Outcome(
            False,
            f"pid {pid} is now another session (started {_when(backend_start)}; the one shown "
            f"started {_when(plan.session.backend_start)}): nothing done",
        )
    if missing:
        return Outcome(
            False,
            f"pid {pid} no longer holds (or waits for) {missing} of the lock(s) shown: nothing "
            f"done; run lockdiag terminate {pid} again to see it as it is now",
        )
    if cancel:
        now_idle = nothing_to_cancel(replace(plan.session, state=state), now=True)
        if now_idle is not None:  # the query ended after the preview: nothing was sent
            return Outcome(False, now_idle)
        if signalled:
            return Outcome(
                True,
                f"cancel request sent to pid {pid}: its current query stops, "
                "its session and session-level locks stay",
            )
        return Outcome(False, f"pid {pid} is gone: nothing to cancel")
    if not signalled:  # it exited between the check and the signal
        return Outcome(False, f"pid {pid} is gone: nothing to end")
    started = time.monotonic()
    try:
        exited = _exits_within(session, pid, wait)
    except ServerError as error:
        waited = time.monotonic() - started
        return Outcome(
            False,
            f"signal sent to pid {pid}; whether the backend has exited is unknown: lockdiag "
            f"could not look after {waited:.1f}s ({error})",
        )
    if exited:
        return Outcome(True, f"pid {pid} ended; its locks are released")
    return Outcome(False, f"signal sent to pid {pid}; the backend had not exited within {wait:g}s")


POLL = 0.05  # seconds between two looks at a signalled backend


def _exits_within(session: DiagnosticSession, pid: int, wait: float) -> bool:
    """Whether the signalled backend is seen gone within ``wait`` seconds: a backend acts on
    the signal at its next check for interrupts, not at once."""
    ends = time.monotonic() + wait
    while True:
        row = session.fetch("backend_alive", {"pid": pid})
        if not (Alive._make(row).alive if row else 0):
            return True
        if time.monotonic() >= ends:
            return False
        time.sleep(min(POLL, max(0.0, ends - time.monotonic())))


def _link_now(session: DiagnosticSession, plan: Preview, shown: PoolLink) -> PoolLink | None:
    """The pooled connection's link read again from its console, just before the signal: the
    pool may have handed it to a client since the preview."""
    consoles = session.poolers.pgbouncer if session.poolers is not None else ()
    try:
        return link_now(consoles, shown, plan.session, session.timeout)
    except ServerError as error:
        raise ServerError(
            f"{error}; nothing done: whether a client attached to pid {plan.pid} since the "
            "preview is unknown",
            hint=error.hint,
        ) from None


def _lock(lock: LockRow) -> dict[str, object]:
    return {name: getattr(lock, name) for name in _LOCK_FIELDS}


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment is not None else "at an unknown time"
