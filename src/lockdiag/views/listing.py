"""`lockdiag list`: every lock of one server or of a fleet, as a table, lines or JSON items."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, filterfalse, repeat
from operator import attrgetter
from typing import Any

from lockdiag.core.analysis import LockEntry
from lockdiag.core.diagnosis import ListReport, Span
from lockdiag.core.expansion import Run, has_runs, in_order
from lockdiag.core.findings import figures, locks_in
from lockdiag.core.graph import Root, tree_pids
from lockdiag.core.model import ServerInfo, Space
from lockdiag.render import VERDICT, Block, Output, SharedRows, Text, clean, plan_screen
from lockdiag.views.columns import (
    LIST_COLUMNS,
    LIST_DATABASE,
    LIST_LOCK,
    LIST_POOL,
    LIST_TARGET,
    Column,
    ListRow,
    application,
    cells_of,
    folded_flags,
    state,
    status,
    table,
)
from lockdiag.views.common import (
    JSON_VERSION,
    EntryEncoder,
    Labels,
    age,
    busy_bounds,
    busy_note,
    notes_block,
    pid_text,
    relation,
    server_data,
    unknown_ages,
)


def list_output(report: ListReport) -> Output:
    return fleet_list_output([(None, report)], [])


def fleet_list_output(
    parts: Sequence[tuple[str | None, ListReport]], failures: list[tuple[str, str]]
) -> Output:
    """One table for one server or many; with many, every row carries its target."""
    fleet = len(parts) + len(failures) > 1 or any(target for target, _ in parts)

    def blocks(terminal: bool = False, columns: int = 0, lines: int = 0) -> list[Block]:
        return _blocks(parts, failures, fleet, terminal, columns, lines)

    def data() -> dict[str, Any]:
        if not fleet:
            report = parts[0][1]
            return {
                "version": JSON_VERSION,
                "server": server_data(report.snapshot),
                "total": report.total,
                "notes": report.notes,
            }
        read = [
            {
                "target": target,
                "ok": True,
                "error": None,
                "server": server_data(report.snapshot),
                "total": report.total,
                "notes": report.notes,
            }
            for target, report in parts
        ]
        failed = [{"target": target, "ok": False, "error": error} for target, error in failures]
        return {"version": JSON_VERSION, "targets": read + failed}

    def items() -> Iterable[bytes]:
        for target, report in parts:
            encoder = EntryEncoder({"target": target} if fleet else None)
            if not has_runs(report.entries, report.snapshot):
                yield from map(encoder.encode, report.entries)
                continue
            encode, encode_run = encoder.encode, encoder.encode_run
            for piece in in_order(report.entries, report.snapshot):
                yield encode_run(piece) if isinstance(piece, Run) else encode(piece)

    return Output(
        blocks, data, ("locks", items), screen=lambda columns, lines: blocks(True, columns, lines)
    )


def _blocks(
    parts: Sequence[tuple[str | None, ListReport]],
    failures: list[tuple[str, str]],
    fleet: bool,
    terminal: bool,
    screen_columns: int = 0,
    screen_lines: int = 0,
) -> list[Block]:
    """The lock table and its summary; on a terminal, most urgent first and folded, and on a
    screen of ``screen_lines`` lines cut to what fits, the summary saying how many it shows."""
    # a screenful: ordered by urgency, folded; the root blockers' rows are kept first
    rows, heads = _by_urgency(parts) if terminal else ([], set())
    # every row, in a stable order, otherwise: most locks need no ListRow at all
    triples: Iterable[tuple[str | None, ServerInfo, LockEntry | Run]] = (
        ((r.target, r.server, r.entry) for r in rows) if terminal else _pieces(parts)
    )
    entries = [e for _, report in parts for e in report.entries]
    columns = _columns(parts, entries, fleet)
    label = columns.index(LIST_LOCK)
    # a fold counts the locks of the whole lock table, when only a part was analysed
    spans = {target: report.spans for target, report in parts}
    folded, sizes = _folds(rows, spans) if terminal else ({}, {})
    # a lock nobody waits for is its label and its backend's row (see SharedRows)
    cells = SharedRows(label)
    add = cells.items.append
    lines: list[ListRow] = []  # the row behind each line of cells (for one-line rows)
    important: list[int] = []  # rows a capped terminal view keeps first: roots, then the rest
    waiting: dict[str | None, int] = dict.fromkeys((t for t, _ in parts), 0)
    # most locks are held by few backends and wait for nothing: every cell but the lock's
    # label is then the backend's, made once per backend, database, mode and flags
    by_backend: dict[tuple[object, ...], list[str]] = {}
    labels = Labels()  # the text around a key's number made once per key space
    label_of = labels.of

    def backend_row(target: str | None, e: LockEntry, server: ServerInfo) -> list[str]:
        lock = e.lock
        shared = (id(e.session), lock.pid, lock.database, lock.mode, e.flags, target)
        cached = by_backend.get(shared)
        if cached is None:
            cached = by_backend[shared] = cells_of(columns, ListRow(target, e, server))
        return cached

    for index, (target, server, piece) in enumerate(triples):
        if isinstance(piece, Run):  # a dump's run of a span's locks (core.expansion)
            cells.add_cells(labels.run(piece, server), backend_row(target, piece.entry, server))
            important.extend([URGENT if piece.entry.flags else 0] * len(piece.objids))
            continue
        e, lock = piece, piece.lock
        if lock.granted and not e.blocks:
            fold_label = folded.get(index) if folded else None
            if fold_label == "":
                continue  # folded into the first row of its group
            add((fold_label or label_of(e, server), backend_row(target, e, server)))
            if terminal:
                lines.append(ListRow(target, e, server))
            important.append(URGENT if e.flags else 0)
            continue
        row = ListRow(target, e, server)
        whole = cells_of(columns, row)
        add((whole[label], whole))
        lines.append(row)
        important.append(ROOT if e.blocks and (target, lock.pid) in heads else URGENT)
        waiting[target] += not lock.granted

    view = _Rows(cells, lines, important)  # on a screen, cut to the rows that fit

    def compact(index: int) -> str:
        return compact_line(view.lines[index], view.cells[index][label], fleet)

    shown_flags = sorted(set(chain.from_iterable(map(_FLAGS, entries))))
    empty = _empty(parts)

    def assemble(shown: dict[str | None, int] | None) -> list[Block]:
        return [
            table(
                columns,
                view.cells,
                important=view.important,
                empty=empty,
                compact=compact,
                # on a terminal the table explains the flags of the rows it shows, only those
                legend={flag.value: flag.meaning for flag in shown_flags},
            ),
            Text(
                [
                    _summary(report, waiting[target], target, _get(shown, target))
                    for target, report in parts
                ],
                rank=VERDICT,
            ),
            Text(other_waits(parts), "warning", VERDICT),
            Text(_figures(lines), "note"),  # every row's, whatever the screen shows
            Text(unknown_ages(entries), "note"),
            Text(_busy(parts), "note"),
            Text([f"{t}: FAILED: {clean(error)}" for t, error in failures], "error", VERDICT),
            Text([] if terminal else [f"{f}: {f.meaning}" for f in shown_flags], "note"),
            *notes_block([n for _, report in parts for n in report.notes]),
        ]

    if not screen_lines:  # not a screen: every row
        return assemble(_every(parts, view.lines, sizes, terminal))
    # a narrowed table always says how many locks its rows stand for: never all of them
    return _screenful(view, assemble, sizes, screen_columns, screen_lines, _narrowed(parts))


def _columns(
    parts: Sequence[tuple[str | None, ListReport]], entries: list[LockEntry], fleet: bool
) -> list[Column[ListRow]]:
    """The table's columns, with those only some tables have: POOL, DATABASE, TARGET (each
    found by a loop in C)."""
    columns = list(LIST_COLUMNS)
    if any(map(_POOL, entries)):
        columns.insert(columns.index(LIST_COLUMNS[7]), LIST_POOL)
    databases = {(t, d) for t, report in parts for d in set(map(_DATABASE, report.entries))}
    if len(databases) > 1:
        columns.insert(1, LIST_DATABASE)
    if fleet:
        columns.insert(0, LIST_TARGET)
    return columns


def _by_urgency(
    parts: Sequence[tuple[str | None, ListReport]],
) -> tuple[list[ListRow], set[tuple[str | None, int]]]:
    """Every row in the incident's order, and the root blockers (target, pid)."""
    roots = {target: report.roots() for target, report in parts}
    rows = by_urgency([ListRow(t, e, s) for t, s, e in _triples(parts)], roots)
    return rows, {(t, root.pid) for t, found in roots.items() for root in found}


def _figures(rows: list[ListRow]) -> list[str]:
    """Where a holder's AGE (a lower bound) is far below its oldest waiter's, what each
    figure means: said once, for the first such holder, with how many more there are. Only
    the rows of contested locks are read (the granted, uncontested ones have no ListRow)."""
    waited = {
        (r.target, r.entry.lock.pid): r.entry.waited for r in rows if r.entry.waited is not None
    }
    said: dict[tuple[str | None, int | None], str] = {}
    for row in rows:
        entry = row.entry
        oldest = max((w for p in entry.blocks if (w := waited.get((row.target, p)))), default=None)
        both = figures(entry.held_at_least, oldest) if entry.blocks else None
        if both is not None:
            target = f"{clean(row.target)}: " if row.target else ""
            said.setdefault((row.target, entry.lock.pid), f"{target}pid {entry.lock.pid}: {both}")
    if not said:
        return []
    first, *more = said.values()
    return [f"figures: {first}" + (f" ({len(more)} more holder(s) alike)" if more else "")]


def _busy(parts: Sequence[tuple[str | None, ListReport]]) -> list[str]:
    """Where an AGE comes from a session that keeps running statements (see busy_bounds): a
    backend's first lock, in the dump's order (a run by its first lock)."""
    found = [(t, b) for t, report in parts for b in busy_bounds(report.snapshot, _firsts(report))]
    return busy_note([b for _, b in found], "AGE", found[0][0] if found else None)


def _firsts(report: ListReport) -> Iterator[LockEntry]:
    """The entries in the dump's order, a run of a span's locks by its first lock."""
    for piece in in_order(report.entries, report.snapshot):
        yield next(piece.entries()) if isinstance(piece, Run) else piece


def _empty(parts: Sequence[tuple[str | None, ListReport]]) -> str:
    total = sum(report.total for _, report in parts)
    scope = "advisory lock" if parts and parts[0][1].snapshot.scope == "advisory" else "lock"
    return f"no {scope}s" if not total else f"none of the {total} {scope}(s) matches the filters"


@dataclass
class _Rows:
    cells: Sequence[list[str]]
    lines: list[ListRow]  # the row behind each line of cells
    important: list[int]


def _screenful(
    view: _Rows,
    assemble: Callable[[dict[str | None, int] | None], list[Block]],
    sizes: dict[int, int],
    columns: int,
    lines: int,
    counted: bool = False,
) -> list[Block]:
    """A screenful: the rows that fit (:func:`plan_screen`), the root blockers first, then the
    most urgent, and one count of the locks shown (``sizes``: the locks behind a folded row),
    so the table is never cut again and no second "more rows" count can disagree with the
    summary; ``counted``: the count even when every row fits. The rows are chosen with the
    count of every row, as long as any count it can say."""
    every = _Rows(view.cells, view.lines, view.important)
    rows = len(every.cells)

    def on_screen(chosen: list[int]) -> list[Block]:
        view.cells = [every.cells[i] for i in chosen]
        view.lines = [every.lines[i] for i in chosen]
        view.important = [every.important[i] for i in chosen]
        return assemble(_shown(view.lines, sizes))

    every_row = on_screen(list(range(rows)))
    chosen = plan_screen(every_row, columns, lines - 1).rows[0]  # a prompt, a cut note
    if len(chosen) < rows:  # their count is in the summary, not on a "more rows" line
        chosen = plan_screen(every_row, columns, lines).rows[0]
    if len(chosen) == rows and not counted:
        view.cells, view.lines, view.important = every.cells, every.lines, every.important
        return assemble(None)
    return on_screen(chosen)


def _narrowed(parts: Sequence[tuple[str | None, ListReport]]) -> bool:
    """Whether only a part of some lock table was analysed."""
    return any(report.narrowed for _, report in parts)


def _every(
    parts: Sequence[tuple[str | None, ListReport]],
    lines: list[ListRow],
    sizes: dict[int, int],
    folded: bool,
) -> dict[str | None, int] | None:
    """The locks behind every row of a table that is not a screen, for each target (None,
    every lock, unless narrowed): one a row, unless ``folded`` (a terminal's table, whose
    ``lines`` are its rows)."""
    if not _narrowed(parts):
        return None
    if not folded:
        return {target: len(report.entries) for target, report in parts}
    return {**dict.fromkeys((t for t, _ in parts), 0), **_shown(lines, sizes)}


def _shown(lines: list[ListRow], sizes: dict[int, int]) -> dict[str | None, int]:
    """The locks behind each target's rows: a folded row stands for its group."""
    shown: dict[str | None, int] = {}
    for row in lines:
        shown[row.target] = shown.get(row.target, 0) + sizes.get(id(row.entry), 1)
    return shown


def _get(shown: dict[str | None, int] | None, target: str | None) -> int | None:
    return shown.get(target, 0) if shown is not None else None


def _triples(
    parts: Sequence[tuple[str | None, ListReport]],
) -> Iterator[tuple[str | None, ServerInfo, LockEntry]]:
    """Every lock of every part, with its target and server (the triples made in C)."""
    for target, report in parts:
        yield from zip(repeat(target), repeat(report.snapshot.server), report.entries)


def _pieces(
    parts: Sequence[tuple[str | None, ListReport]],
) -> Iterator[tuple[str | None, ServerInfo, LockEntry | Run]]:
    """:func:`_triples` with a dump's spans given back as runs of their locks, each where the
    full read puts it (core.expansion)."""
    for target, report in parts:
        pieces = in_order(report.entries, report.snapshot)
        yield from zip(repeat(target), repeat(report.snapshot.server), pieces)


_POOL, _DATABASE, _FLAGS = attrgetter("pool"), attrgetter("lock.database"), attrgetter("flags")
_PID, _GRANTED = attrgetter("lock.pid"), attrgetter("lock.granted")
ROOT, URGENT = 2, 1  # a screen keeps the root blockers' rows, then waits and flagged locks
FOLD_AT = 3  # locks of one session and namespace that nobody waits for, folded on a terminal


def by_urgency(rows: list[ListRow], roots: dict[str | None, list[Root]]) -> list[ListRow]:
    """The incident's order: each root blocker (worst first) with its chain — the root's
    contended locks (most waiters first), then each session of its tree in order, its waits
    and the locks others wait for in turn — then other waits, then flagged locks, then the
    rest; stable within each."""
    place: dict[tuple[str | None, int], tuple[int, int]] = {}
    for target, found in roots.items():
        for rank, root in enumerate(found):
            for position, pid in enumerate(tree_pids(root.tree)):
                place.setdefault((target, pid), (rank, position))

    def urgency(row: ListRow) -> tuple[int, int, int, int]:
        entry = row.entry
        if entry.blocks or not entry.lock.granted:
            found = place.get((row.target, entry.lock.pid or 0))
            if found is not None:
                return (0, *found, -len(entry.blocks))
            return (1, 0, 0, 0)
        return (2, 0, 0, 0) if entry.flags else (3, 0, 0, 0)

    return sorted(rows, key=urgency)


_Spans = Mapping[str | None, Mapping[Space, Span] | None]  # by target; None: not narrowed


def fold(rows: list[ListRow], spans: _Spans | None = None) -> dict[int, str]:
    """For a terminal: groups of FOLD_AT or more uncontested locks of one session, namespace,
    mode and flags become one row. The first row of a group gets its label
    ("300 x tenant_summary 1000..1299"); the others an empty string (left out). ``spans``:
    each target's census of its whole lock table, when only a part of it was analysed."""
    return _folds(rows, spans)[0]


def _folds(
    rows: list[ListRow], spans: _Spans | None = None
) -> tuple[dict[int, str], dict[int, int]]:
    """:func:`fold`'s labels, and the locks behind the first row of each group (by the id
    of its entry)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for index, row in enumerate(rows):
        entry = row.entry
        decoded = entry.decoded
        if entry.blocks or not entry.lock.granted or decoded is None or decoded.namespace is None:
            continue
        lock = entry.lock
        key = (row.target, lock.pid, lock.database, decoded.namespace.name, lock.mode, entry.flags)
        groups.setdefault(key, []).append(index)
    labels: dict[int, str] = {}
    sizes: dict[int, int] = {}
    for members in groups.values():
        first = rows[members[0]]
        count, span = _extent([rows[i].entry for i in members], (spans or {}).get(first.target))
        if count < FOLD_AT:
            continue
        namespace = first.entry.decoded.namespace  # type: ignore[union-attr]
        assert namespace is not None
        labels[members[0]] = f"{count} x {namespace.name} {span}".rstrip()
        labels.update(dict.fromkeys(members[1:], ""))
        sizes[id(first.entry)] = count
    return labels, sizes


def _extent(members: list[LockEntry], spans: Mapping[Space, Span] | None) -> tuple[int, str]:
    """How many locks a group stands for and their span ("1000..1299"): from the census of
    the whole lock table when there is one for the group's space, else from its rows."""
    lock, decoded = members[0].lock, members[0].decoded
    span = (spans or {}).get((lock.pid, lock.database, lock.mode, lock.objsubid, lock.classid))
    if span is not None and decoded is not None and span.namespace == decoded.namespace:
        return span.locks, f"{span.first}..{span.last}"
    count = sum(e.lock.keys for e in members)  # an aggregated read's span: its every key
    if count < FOLD_AT:
        return count, ""  # not folded: no span needed
    resources = sorted(
        r
        for e in members
        if e.decoded
        for r in (e.decoded.resource, e.decoded.last_resource)
        if r is not None
    )
    return count, f"{resources[0]}..{resources[-1]}" if resources else ""


def compact_line(row: ListRow, label: str, fleet: bool) -> str:
    """One lock on one line, for a screen too narrow for the table: the verdict first and
    whole (pid, status, age, the lock's whole name, whom it blocks or waits for, the
    session's state: a root's line says what it does to others before anything else), then
    its flags folded (the one that matters most, and how many more: the legend below names
    them, --format plain lists them all), then who and how, cut at the edge."""
    entry = row.entry
    essentials = f"{pid_text(entry.lock)}  {status(entry)} {age(entry)}  {label}"
    parts = (
        relation(entry),
        state(entry),
        folded_flags(entry),
        application(entry),
        entry.lifetime or "",
    )
    text = f"{essentials}  {' · '.join(part for part in parts if part)}"
    return f"{clean(row.target)}: {text}" if fleet else text


def _summary(
    report: ListReport, waiting: int, target: str | None = None, on_screen: int | None = None
) -> str:
    server = report.snapshot.server
    if report.narrowed:  # the whole lock table; the screen's count says what is shown
        shown = str(report.total)
    else:
        listed = locks_in(report.entries)  # a dump's spans count their every lock
        shown = f"{listed} of {report.total}" if listed != report.total else str(listed)
    where = f"{target}: " if target else ""
    screen = (
        f"; {on_screen} shown here, the most urgent first (--format plain or json gives all)"
        if on_screen is not None
        else ""
    )
    return (
        f"{where}{shown} lock(s), {waiting} waiting{screen}; {report.snapshot.source}, "
        f"PostgreSQL {server.version}, at {server.now:%Y-%m-%d %H:%M:%S %Z}"
    )


def other_waits(parts: Sequence[tuple[str | None, ListReport]]) -> list[str]:
    """For a list of advisory locks: how many sessions wait for a lock of another type (a
    table's, a transaction's), which it does not show, and where to see them. A session
    waiting for a heavyweight lock shows wait_event_type 'Lock' and the lock's type as its
    wait_event (monitoring-stats.html, "Wait Event Types")."""
    said: list[str] = []
    for target, report in parts:
        listed = set(map(_PID, filterfalse(_GRANTED, report.entries)))  # the waiters, in C
        types = [
            clean(session.wait_event)
            for pid, session in report.snapshot.sessions.items()
            if session.wait_event_type == "Lock"
            and session.wait_event != "advisory"
            and pid not in listed
        ]
        if types:
            where = f"{clean(target)}: " if target else ""
            kinds = ", ".join(f"{kind} {types.count(kind)}" for kind in sorted(set(types)))
            said.append(
                f"{where}{len(types)} session(s) wait for other lock types ({kinds}), not "
                "listed here: lockdiag list --all lists them, lockdiag blockers shows what "
                "holds them up"
            )
    return said
