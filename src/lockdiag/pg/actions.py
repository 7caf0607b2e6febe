"""The only server-changing calls: cancel the query of, or end, exactly one backend.

Reached only through `lockdiag terminate`, after a preview and a confirmation. Nothing here
releases a lock in any other way.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockdiag.pg.session import DiagnosticSession


@dataclass(frozen=True)
class Outcome:
    done: bool
    message: str


def act(session: DiagnosticSession, pid: int, cancel: bool, wait: float) -> Outcome:
    """Cancel the query of, or end, exactly one backend; say what happened."""
    if cancel:
        (sent,) = session.fetch("cancel_backend", {"pid": pid}) or (False,)
        if sent:
            return Outcome(True, f"cancel request sent to pid {pid}: its current query stops, "
                           "its session and session-level locks stay")  # fmt: skip
        return Outcome(False, f"pid {pid} is gone: nothing to cancel")
    milliseconds = max(1, int(wait * 1000))
    (ended,) = session.fetch("terminate_backend", {"pid": pid, "wait_ms": milliseconds}) or (False,)
    if ended:
        return Outcome(True, f"pid {pid} ended; its locks are released")
    (still_there,) = session.fetch("backend_alive", {"pid": pid}) or (0,)
    if still_there:
        return Outcome(False, f"pid {pid} was signalled but had not exited after {wait:g}s")
    return Outcome(False, f"pid {pid} is gone: nothing to end")
