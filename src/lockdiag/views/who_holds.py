"""`lockdiag who-holds`: the holders and the queue of one key, with a verdict in words."""

from __future__ import annotations

from typing import Any

from lockdiag.core.analysis import LockEntry
from lockdiag.core.diagnosis import WhoHolds
from lockdiag.core.model import Snapshot
from lockdiag.durations import format_duration
from lockdiag.render import Block, Output, Text, clean
from lockdiag.views.columns import (
    HOLDER_COLUMNS,
    WAITER_COLUMNS,
    HolderRow,
    WaiterRow,
    cells_of,
    holder_line,
    table,
    waiter_line,
)
from lockdiag.views.common import JSON_VERSION, entry_data, known_data, notes_block, server_data
from lockdiag.views.keys import key_data, lock_sql


def verdict(report: WhoHolds) -> str:
    """The answer in one sentence: who holds the key, how, and how many wait."""
    label = f"{report.decoded.label} {report.key}"
    if not report.holders:
        if report.waiters:
            return f"nobody holds {label} right now, but {len(report.waiters)} session(s) wait"
        return f"nobody holds {label}"
    text = f"{label} is held by " + "; ".join(_holder_summary(h) for h in report.holders)
    if report.waiters:
        longest = max((w.waited or 0.0) for w in report.waiters)
        text += f"; {len(report.waiters)} waiting (longest {format_duration(longest)})"
    return text


def _holder_summary(entry: LockEntry) -> str:
    session = entry.session
    who = f"pid {entry.lock.pid}" if entry.lock.pid is not None else "a prepared transaction"
    if session is None:
        return who
    if session.application_name:
        who += f" ({session.application_name})"
    if session.hidden:
        return f"{who}, state hidden (no pg_read_all_stats), lifetime unknown"
    state = session.state or "state unknown"
    if entry.held_at_least is not None:
        state += f" {format_duration(entry.held_at_least)}"
    pool = entry.pool
    if entry.lifetime == "session" and pool is not None and pool.via == "console":
        attached = f"client {pool.client} attached" if pool.client else "no client attached"
        return (
            f"{who}, {state}, session lock on pooled server connection of {pool.pooler} pool "
            f"{pool.pool} ({attached})"
            + (": the lock outlived the client that took it" if not pool.client else "")
        )
    if entry.lifetime == "session":
        return f"{who}, {state}, session lock: outlived its work"
    return f"{who}, {state}, lifetime unknown (transaction or session lock)"


def who_holds_output(report: WhoHolds, snapshot: Snapshot) -> Output:
    now = snapshot.server.now
    key = report.key

    def blocks() -> list[Block]:
        holding = [HolderRow(e, now) for e in report.holders]
        queue = [WaiterRow(position, e) for position, e in enumerate(report.waiters, start=1)]
        holders = [cells_of(HOLDER_COLUMNS, row) for row in holding]
        waiters = [cells_of(WAITER_COLUMNS, row) for row in queue]
        return [
            Text([clean(verdict(report))], "verdict"),
            Text(
                [
                    f"key: pg_locks {key}, {key.form} {key.describe()}; "
                    f"SQL: {lock_sql(report.decoded)}"
                ]
            ),
            table(
                HOLDER_COLUMNS,
                holders,
                title="Holders",
                empty="nobody holds it",
                compact=lambda i: holder_line(holding[i]),
            ),
            table(
                WAITER_COLUMNS,
                waiters,
                title="Waiters (in queue order, by wait start)",
                empty="nobody waits",
                compact=lambda i: waiter_line(queue[i]),
            ),
            *notes_block(report.notes),
        ]

    def data() -> dict[str, Any]:
        decoded = report.decoded
        return {
            "version": JSON_VERSION,
            "server": server_data(snapshot),
            "namespace": decoded.namespace.name if decoded.namespace else None,
            "resource": decoded.resource,
            "known": known_data(decoded.known) if decoded.known else None,
            "key": key_data(key, report.decoded),
            "held": report.held,
            "verdict": verdict(report),
            "holders": [entry_data(e) for e in report.holders],
            "waiters": [entry_data(e) for e in report.waiters],
            "notes": report.notes,
        }

    return Output(blocks, data)
