"""`lockdiag terminate`: the preview of what ending (or cancelling) one session releases."""

from __future__ import annotations

from typing import Any

from lockdiag.core.analysis import LockEntry
from lockdiag.core.model import IDLE_STATES, PoolLink, Snapshot
from lockdiag.core.termination import END_ATTACHED_CLIENT, FORCE, AfterCancel, Preview
from lockdiag.durations import format_duration
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.views.common import entry_data, lock_label, pool_attached

# -- terminate ---------------------------------------------------------------------------------


def terminate_preview_output(preview: Preview, snapshot: Snapshot, cancel: bool) -> Output:
    server = snapshot.server
    session = preview.session

    def blocks() -> list[Block]:
        who = f"pid {preview.pid}"
        if session.application_name:
            who += f" ({clean(session.application_name)})"
        since = ""
        if session.state_change is not None:
            since = f" for {format_duration((server.now - session.state_change).total_seconds())}"
        details = [
            f"{who}: user {clean(session.user)}, database {clean(session.database)}, "
            f"client {clean(session.client) or 'local socket'}, "
            f"state {clean(session.state) or 'hidden'}{since}",
            f"query: {clean(session.query)}",
        ]
        if preview.pool is not None:
            details.append(pool_line(preview.pool))
        if preview.waits is not None:
            details.append(f"waits for {lock_label(preview.waits, server)}")
        if preview.blocked:
            details.append(
                f"holds up {len(preview.blocked)} session(s): "
                + ", ".join(map(str, preview.blocked[:20]))
                + (" ..." if len(preview.blocked) > 20 else "")
            )
        rows = [
            [
                lock_label(e, server),
                e.lock.mode.removesuffix("Lock"),
                e.lifetime or "",
                ",".join(map(str, e.blocks)),
            ]
            for e in preview.releases
        ]
        if not cancel:
            action = "ending the session releases every lock below"
        elif session.state in IDLE_STATES:
            action = "it runs no query: cancelling releases nothing below"
        else:
            action = (
                "cancelling its query releases its transaction-level locks only; session-level "
                "locks stay held"
            )
        out: list[Block] = [
            Text(details),
            Table(["LOCK", "MODE", "LIFETIME", "BLOCKS"], rows, title=action, empty="no locks"),
        ]
        if preview.program is not None and not cancel:
            out.append(program_warning(preview))
        if preview.waits is not None and not preview.blocked:
            out.append(Text(waiter_warning(preview, snapshot), "warning"))
        if preview.pool is not None and (warning := pool_warning(preview.pool)):
            out.append(Text([warning], "warning"))
        return out

    def data() -> dict[str, Any]:
        return {
            "pid": preview.pid,
            "action": "cancel" if cancel else "terminate",
            "application_name": session.application_name,
            "user": session.user,
            "client_addr": session.client_addr,
            "state": session.state,
            "query": session.query,
            "holds": [entry_data(e) for e in preview.holds],
            "waits": entry_data(preview.waits) if preview.waits else None,
            "blocked": preview.blocked,
            "program": program_data(preview),
        }

    return Output(blocks, data)


def program_warning(preview: Preview) -> Text:
    """The well-known program whose lock it holds, and what check says of that lock: where its
    work runs, what ending the session does to it (a warning where the work goes on)."""
    program = preview.program
    assert program is not None
    known = program.known
    lines = [f"{clean(known.label)}: {clean(preview.advice)}"]
    if program.keeps_working:
        lines.append(f"(--yes refuses to end it unless {FORCE} is given too)")
    return Text(lines, "warning" if program.keeps_working else "note")


def program_data(preview: Preview) -> dict[str, Any] | None:
    program = preview.program
    if program is None:
        return None
    return {
        "software": program.known.software,
        "meaning": program.known.meaning,
        "advice": preview.advice,
        "keeps_working": program.keeps_working,
        "sibling": program.sibling.pid if program.sibling is not None else None,
    }


def pool_line(pool: PoolLink) -> str:
    if pool.via != "console":
        return f"a pooled server connection (from pooler address {clean(pool.pooler)})"
    mode = f", {pool.pool_mode} mode" if pool.pool_mode else ""
    attached = pool_attached(pool)
    return (
        f"pooled server connection of {clean(pool.pooler)} (pool {clean(pool.pool)}{mode}): "
        f"{attached}"
    )


def pool_warning(pool: PoolLink) -> str | None:
    """What ending a pooled server connection ends besides the lock: the work of whichever
    client the pool gave it to (between transactions it hands it to the next one asking)."""
    if pool.via != "console":
        return (
            "which client uses this server connection is unknown without --pgbouncer: the "
            "pool may have handed it to another client, whose work ending it would end"
        )
    if pool.client:
        return (
            f"client {pool.client} is using this server connection now: ending it ends that "
            "client's work, and that client may not be the one that took the lock (refused "
            f"without {END_ATTACHED_CLIENT})"
        )
    return None  # no client attached: the act step reads the console again before it signals


def waiter_warning(preview: Preview, snapshot: Snapshot) -> list[str]:
    """Pointed at a session that waits and holds nobody up: the cause is elsewhere."""
    assert preview.waits is not None
    blockers = preview.waits.waits_for or preview.waits.queued_behind
    lines = [f"pid {preview.pid} is a waiter, not a blocker: ending it frees nobody."]
    for pid in blockers:
        session = snapshot.session(pid)
        name = (
            f" ({clean(session.application_name)})" if session and session.application_name else ""
        )
        state = f", {clean(session.state)}" if session and session.state else ""
        lines.append(f"  it waits for pid {pid}{name}{state}: lockdiag terminate {pid}")
    return lines


# -- after the action --------------------------------------------------------------------------

LISTED = 10  # locks named at most in a report line


def cancel_report(preview: Preview, snapshot: Snapshot, check: AfterCancel, wait: float) -> str:
    """After a cancel request: what a new read shows it did, said as it is."""
    pid, server = preview.pid, snapshot.server

    def names(entries: list[LockEntry]) -> str:
        shown = ", ".join(lock_label(e, server) for e in entries[:LISTED])
        more = f" and {len(entries) - LISTED} more" if len(entries) > LISTED else ""
        return (shown + more) or "nothing"

    sent = f"cancel request sent to pid {pid}"
    if check.gone:
        return f"{sent}; the backend is gone now: every lock it held is released"
    locks = f"released: {names(check.released)}; still held: {names(check.still_held)}"
    if check.still_held:
        if check.aborted:
            locks += (
                " (session-level locks stay after a cancel; its transaction is aborted and "
                "keeps its other locks until the client rolls back)"
            )
        elif check.state in ("idle", None):
            locks += " (session-level locks stay after a cancel)"
        else:
            locks += (
                " (session-level locks stay after a cancel; transaction-level ones until its "
                "transaction ends)"
            )
    if preview.waits is not None:
        waits = lock_label(preview.waits, server)
        locks += f"; {'still waits' if check.still_waits else 'no longer waits'} for {waits}"
    if not check.stopped:
        why = (
            "its state is hidden from this role, so whether its query stopped cannot be seen"
            if check.state is None
            else f"after {wait:g}s it still runs the same query ({check.state})"
        )
        nothing = "" if check.released else "; nothing was released"
        return f"{sent}, but {why}{nothing}: {locks}"
    now = f"its query stopped; it is now {check.state}"
    if check.aborted:
        now += ", until the client rolls back"
    nothing = "" if check.released else "; nothing was released"
    return f"{sent}: {now}{nothing}: {locks}"


def terminate_outcome_output(
    shown: Output,
    done: bool,
    message: str,
    released: list[LockEntry] | None,
    still_held: list[LockEntry] | None,
) -> Output:
    """The preview's data and the outcome, for one JSON document at the end; ``released`` and
    ``still_held``: None when not read."""

    def data() -> dict[str, Any]:
        return {
            **shown.data(),
            "done": done,
            "message": message,
            "released": None if released is None else [entry_data(e) for e in released],
            "still_held": None if still_held is None else [entry_data(e) for e in still_held],
        }

    return Output(lambda: [Text([message])], data)
