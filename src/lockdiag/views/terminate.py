"""`lockdiag terminate`: the preview of what ending (or cancelling) one session releases."""

from __future__ import annotations

from typing import Any

from lockdiag.core.model import Snapshot
from lockdiag.core.termination import Preview
from lockdiag.durations import format_duration
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.views.common import (
    entry_data,
    lock_label,
)

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
        action = (
            "cancelling its query releases its transaction-level locks only; session-level "
            "locks stay held"
            if cancel
            else "ending the session releases every lock below"
        )
        out: list[Block] = [
            Text(details),
            Table(["LOCK", "MODE", "LIFETIME", "BLOCKS"], rows, title=action, empty="no locks"),
        ]
        if preview.waits is not None and not preview.blocked:
            out.append(Text(waiter_warning(preview, snapshot), "warning"))
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
        }

    return Output(blocks, data)


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
