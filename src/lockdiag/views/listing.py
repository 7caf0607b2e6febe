"""`lockdiag list`: every lock of one server or of a fleet, as a table, lines or JSON items."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lockdiag.core.diagnosis import ListReport
from lockdiag.render import Block, Output, Text, clean
from lockdiag.views.columns import (
    LIST_COLUMNS,
    LIST_DATABASE,
    LIST_LOCK,
    LIST_POOL,
    LIST_TARGET,
    ListRow,
    cells_of,
    table,
)
from lockdiag.views.common import (
    JSON_VERSION,
    entry_data,
    notes_block,
    server_data,
    session_data,
)


def list_output(report: ListReport) -> Output:
    return fleet_list_output([(None, report)], [])


def fleet_list_output(
    parts: Sequence[tuple[str | None, ListReport]], failures: list[tuple[str, str]]
) -> Output:
    """One table for one server or many; with many, every row carries its target."""
    fleet = len(parts) + len(failures) > 1 or any(target for target, _ in parts)
    entries = [(target, report, e) for target, report in parts for e in report.entries]

    def blocks() -> list[Block]:
        rows = [ListRow(target, e, report.snapshot.server) for target, report, e in entries]
        columns = list(LIST_COLUMNS)
        # columns only some tables have: POOL, DATABASE, TARGET
        if any(row.entry.pool is not None for row in rows):
            columns.insert(columns.index(LIST_COLUMNS[7]), LIST_POOL)
        if len({(row.target, row.entry.lock.database) for row in rows}) > 1:
            columns.insert(1, LIST_DATABASE)
        if fleet:
            columns.insert(0, LIST_TARGET)
        label = columns.index(LIST_LOCK)
        cells: list[list[str]] = []
        important: list[bool] = []  # rows a capped terminal view keeps first
        waiting: dict[str | None, int] = dict.fromkeys((t for t, _ in parts), 0)
        # most locks are held by few backends and wait for nothing: every cell but the lock's
        # label is then the backend's, made once per backend, database, mode and flags
        by_backend: dict[tuple[object, ...], list[str]] = {}
        for row in rows:
            e = row.entry
            lock = e.lock
            if lock.granted and not e.blocks:
                shared = (id(e.session), lock.pid, lock.database, lock.mode, e.flags, row.target)
                cached = by_backend.get(shared)
                if cached is None:
                    cached = by_backend[shared] = cells_of(columns, row)
                    cells.append(cached)
                else:
                    line = list(cached)
                    line[label] = LIST_LOCK.cell(row)
                    cells.append(line)
                important.append(bool(e.flags))
                continue
            cells.append(cells_of(columns, row))
            important.append(True)
            waiting[row.target] += not lock.granted
        shown_flags = sorted({f for row in rows for f in row.entry.flags})
        scope = parts[0][1].snapshot.scope if parts else "advisory"
        return [
            table(
                columns,
                cells,
                important=important,
                empty="no advisory locks" if scope == "advisory" else "no locks",
            ),
            Text([_summary(report, waiting[target], target) for target, report in parts]),
            Text([f"{t}: FAILED: {clean(error)}" for t, error in failures], "error"),
            Text([f"{f}: {f.meaning}" for f in shown_flags], "note"),
            *notes_block([n for _, report in parts for n in report.notes]),
        ]

    def data() -> dict[str, Any]:
        if not fleet:
            report = parts[0][1]
            return {
                "version": JSON_VERSION,
                "server": server_data(report.snapshot),
                "total": report.total,
                "notes": report.notes,
            }
        return {
            "version": JSON_VERSION,
            "targets": [
                {"target": target, "ok": True, "error": None,
                 "server": server_data(report.snapshot), "total": report.total,
                 "notes": report.notes}
                for target, report in parts
            ] + [
                {"target": target, "ok": False, "error": error}
                for target, error in failures
            ],
        }  # fmt: skip

    def items() -> Iterable[dict[str, Any]]:
        sessions: dict[int, dict[str, Any]] = {}  # a session's fields, made once per session
        for target, _, entry in entries:
            session = sessions.get(id(entry.session))
            if session is None:
                session = sessions[id(entry.session)] = session_data(entry)
            item = entry_data(entry, session)
            if fleet:
                item["target"] = target
            yield item

    return Output(blocks, data, ("locks", items))


def _summary(report: ListReport, waiting: int, target: str | None = None) -> str:
    entries = report.entries
    server = report.snapshot.server
    shown = (
        f"{len(entries)} of {report.total}" if len(entries) != report.total else str(len(entries))
    )
    where = f"{target}: " if target else ""
    if report.narrowed:
        shown += " (waiters, their holders and long-idle holders first; --format plain for all)"
    return (
        f"{where}{shown} lock(s), {waiting} waiting; {report.snapshot.source}, "
        f"PostgreSQL {server.version}, at {server.now:%Y-%m-%d %H:%M:%S %Z}"
    )
