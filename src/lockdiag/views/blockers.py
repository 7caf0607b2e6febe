"""`lockdiag blockers`: wait-for trees, one per root blocker, worst first."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from lockdiag.core.findings import figures, queue_evidence, queue_step
from lockdiag.core.graph import Blockers, Node, Queue, Root, Tree, oldest_wait, tree_pids
from lockdiag.core.incident import Cause, Incident
from lockdiag.durations import format_duration
from lockdiag.render import VERDICT, Block, Output, Table, Text, clean, text_height
from lockdiag.views.common import (
    JSON_VERSION,
    entry_data,
    lock_label,
    server_data,
)

# -- blockers ----------------------------------------------------------------------------------


def _node_text(node: Node | None, pid: int, report: Blockers) -> str:
    server = report.snapshot.server
    if pid == 0:  # pg_blocking_pids() reports a prepared transaction as pid 0
        return "a prepared transaction (pid 0: COMMIT PREPARED or ROLLBACK PREPARED ends it)"
    if node is None or node.session is None:
        return f"pid {pid}"
    session = node.session
    parts = [f"pid {pid}"]
    if session.application_name:
        parts.append(clean(session.application_name))
    if session.hidden:
        parts.append("[state hidden]")
    elif session.state:
        since = ""
        if session.state_change is not None:
            since = f" {format_duration((server.now - session.state_change).total_seconds())}"
        parts.append(f"[{clean(session.state)}{since}]")
    if node.workers:
        parts.append(f"(+{len(node.workers)} parallel worker(s))")
    return " ".join(parts)


@dataclass(frozen=True)
class TreeRow:
    """One session of a chain: the tree's glyphs, its text, and the indent a wrapped line of
    it keeps (the bars of the tree go on through it)."""

    prefix: str
    text: str
    indent: str

    @property
    def line(self) -> str:
        return self.prefix + self.text

    def wrapped(self, columns: int) -> list[str]:
        """The row on a screen ``columns`` wide: cut between words, each line after the first
        under the tree's indent."""
        if not columns or len(self.line) <= columns:
            return [self.line]
        width = max(columns, len(self.indent) + 20)
        return textwrap.wrap(
            self.text,
            width,
            initial_indent=self.prefix,
            subsequent_indent=self.indent,
            break_on_hyphens=False,
            break_long_words=True,
        ) or [self.line]


def tree_rows(tree: Tree, report: Blockers, prefix: str = "", last: bool = True) -> list[TreeRow]:
    node = report.nodes.get(tree.pid)
    server = report.snapshot.server
    if tree.edge is None:
        line = _node_text(node, tree.pid, report)
        if node and node.holds:
            held = ", ".join(dict.fromkeys(lock_label(e, server) for e in node.holds))
            line += f" holds {held}"
            bound = max((e.held_at_least or 0.0) for e in node.holds)
            if any(e.held_at_least is not None for e in node.holds):
                both = figures(bound, oldest_wait(report, node.holds))
                line += f" ({both or f'≥ {format_duration(bound)}'})"
        glyphs, child_prefix = "", ""
    else:
        glyphs = prefix + ("└─ " if last else "├─ ")
        line = _node_text(node, tree.pid, report)
        if tree.cycle:
            line += "  ↺ cycle: already shown above"
        elif node is not None and node.waits is not None:
            waited = node.waits.waited
            line += f" waits {format_duration(waited)}" if waited is not None else " waits"
            line += f" for {lock_label(node.waits, server)} ({node.waits.lock.mode})"
            if tree.edge.kind == "queued":
                line += f", queued behind waiter {tree.edge.blocker} (not a holder)"
        child_prefix = prefix + ("   " if last else "│  ")
    rows = [TreeRow(glyphs, line, child_prefix + ("│  " if tree.children else "   "))]
    for index, child in enumerate(tree.children):
        rows += tree_rows(child, report, child_prefix, index == len(tree.children) - 1)
    return rows


def tree_lines(tree: Tree, report: Blockers, prefix: str = "", last: bool = True) -> list[str]:
    return [row.line for row in tree_rows(tree, report, prefix, last)]


def _tree_data(tree: Tree) -> dict[str, Any]:
    return {
        "pid": tree.pid,
        "edge": tree.edge.kind if tree.edge else None,
        "cycle": tree.cycle,
        "children": [_tree_data(c) for c in tree.children],
    }


def ordered_roots(incident: Incident) -> list[Cause]:
    """The root blockers, as causes, in the incident's one order."""
    return [cause for cause in incident.causes if cause.root is not None]


def root_heading(number: int, cause: Cause) -> str:
    """``root blocker 1: tenant_summary 73 (+1 more)  pid 4163 (billing-worker) · blocks 2
    directly, 2 in total, longest wait 7m28s``: named, as `check` names it, by the lock
    others wait for."""
    root = cause.root
    assert root is not None
    more = f" (+{cause.locks - 1} more)" if cause.locks > 1 else ""
    session = cause.session
    app = clean(session.application_name) if session and session.application_name else ""
    who = f"pid {cause.pid}" + (f" ({app})" if app else "")
    longest = format_duration(root.longest_wait) if root.longest_wait is not None else "not known"
    return (
        f"root blocker {number}: {clean(cause.label)}{more}  {who} · blocks {root.direct} "
        f"directly, {root.total} in total, longest wait {longest}"
    )


def _cycle_line(cycle: list[int]) -> str:
    chain = " → ".join(map(str, [*cycle, cycle[0]]))
    return (
        "cycle (a deadlock not yet broken; the server ends one of them after "
        f"deadlock_timeout): {chain}"
    )


def blockers_output(incident: Incident) -> Output:
    """The chains, worst root first, in the incident's order; for a ticket, one pipe table
    of every session in the chains instead of the trees."""
    report = incident.report.graph
    queues = report.queues()
    causes = ordered_roots(incident)
    roots = [cause.root for cause in causes if cause.root is not None]

    def nothing() -> list[Block]:
        waiting = sum(1 for n in report.nodes.values() if n.waits)
        said = "no session waits for a lock" + (f" ({waiting} waiting)" if waiting else "")
        return [Text([said], "verdict")]

    def headings() -> list[str]:
        return [root_heading(n, cause) for n, cause in enumerate(causes, start=1)]

    def blocks(columns: int = 0, lines: int = 0) -> list[Block]:
        """Every chain in full; on a screen of ``lines`` lines, every root's heading and as
        much of each chain as fits, worst first, the rest of a chain counted."""
        if not roots and not report.cycles:
            return nothing()
        chains = [
            chain_lines(heading, root, report, columns, queue_lines(root, report, queues))
            for heading, root in zip(headings(), roots, strict=True)
        ]
        cycles = [_cycle_line(cycle) for cycle in report.cycles]
        # every heading and every cycle stays; a fold note and the shell's prompt
        room = lines - 2 - text_height(cycles, columns) if lines else None
        fitted, folded = fit_chains(chains, room)
        out: list[Block] = []
        for heading, shown in fitted:
            out += [Text(heading, "verdict", VERDICT), Text(shown)]
        out += [Text([line], "error", VERDICT) for line in cycles]
        if folded:
            cut = "(chains cut to fit: --format plain | less shows all)"
            out.append(Text([cut], "note", VERDICT))
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "server": server_data(report.snapshot),
            "nodes": [_node_data(node) for node in report.nodes.values()],
            "edges": [
                {"waiter": e.waiter, "blocker": e.blocker, "kind": e.kind} for e in report.edges
            ],
            "roots": [
                {
                    "pid": r.tree.pid,
                    "direct": r.direct,
                    "total": r.total,
                    "longest_wait_seconds": r.longest_wait,
                    "tree": _tree_data(r.tree),
                }
                for r in roots
            ],
            "cycles": report.cycles,
            "queues": [
                {
                    "waiter": q.waiter,
                    "holders": list(q.holders),
                    "queued": list(q.queued),
                    "longest_wait_seconds": q.longest_wait,
                }
                for q in queues
            ],
        }

    def document() -> list[Block]:
        if not roots and not report.cycles:
            return nothing()
        return _markdown_blocks(report, roots, headings())

    return Output(blocks, data, screen=blocks, document=document)


Chain = tuple[list[str], list[list[str]]]  # a heading's screen lines, each tree row's


def chain_lines(
    heading: str, root: Root, graph: Blockers, columns: int, notes: tuple[str, ...] = ()
) -> Chain:
    """A root's heading (and ``notes`` under it, kept with it) and tree rows as screen lines
    ``columns`` wide (0: unwrapped), a wrapped row kept under the tree's indent."""
    rows = [row.wrapped(columns) for row in tree_rows(root.tree, graph)]
    top = [line for text in [heading, *notes] for line in TreeRow("", text, "  ").wrapped(columns)]
    return top, rows


def queue_lines(root: Root, graph: Blockers, queues: list[Queue]) -> tuple[str, ...]:
    """The lock queues in a root's chain, the quick way out first: sessions queued behind a
    waiter are freed by cancelling its wait, without touching the holder."""
    inside = set(tree_pids(root.tree))
    server = graph.snapshot.server
    return tuple(
        line
        for queue in queues
        if queue.waiter in inside
        for line in (
            f"  queue: {clean(queue_evidence(queue, server))}",
            f"  first: {clean(queue_step(queue, graph.snapshot))}",
        )
    )


def fit_chains(
    chains: list[Chain], room: int | None
) -> tuple[list[tuple[list[str], list[str]]], int]:
    """Chains fitted to ``room`` screen lines (None: in full), worst first, as `blockers` and
    `watch` show them: every heading stays, then each chain's holder with a count of the rest
    (a later chain is never left out), then the rest of each chain while it fits; too few lines
    even for that, each heading (it names the holder) and a count. Returns each chain's heading
    and the lines shown under it, and how many chains were cut."""
    if room is None:
        return [(heading, [line for row in rows for line in row]) for heading, rows in chains], 0
    room -= sum(len(heading) for heading, _ in chains)
    least = [len(rows[0]) + (len(rows) > 1) for _, rows in chains]
    bare = sum(least) > room
    spare = room  # too few lines: what the headings leave, for counts while they fit
    room -= sum(least)
    fitted: list[tuple[list[str], list[str]]] = []
    cut = 0
    for (heading, rows), reserved in zip(chains, least, strict=True):
        room += reserved
        if bare:
            counted = len(rows) > 1 and spare > 0
            fitted.append((heading, [more_sessions(len(rows) - 1)] if counted else []))
            spare -= counted
            cut += len(rows) > 1
            continue
        shown: list[str] = []
        for index, row in enumerate(rows):
            left = len(rows) - index
            if index and len(row) + (left > 1) > room:  # the row, and a count of the rest
                shown.append(more_sessions(left))
                room -= 1
                cut += 1
                break
            shown += row
            room -= len(row)
        fitted.append((heading, shown))
    return fitted, cut


def more_sessions(count: int) -> str:
    return f"… {count} more session(s) in this chain"


MARKDOWN_HEADERS = ["root", "position", "pid", "application", "state", "lock", "blocked by", "wait"]


def _markdown_blocks(report: Blockers, roots: list[Root], headings: list[str]) -> list[Block]:
    """Every session of every chain as a row of one table: its root, its place in the tree
    ("root", then 1, 1.2 ...), the lock it holds (a root) or waits for, whom it waits for."""
    server = report.snapshot.server
    rows: list[list[str]] = []

    def state(pid: int) -> str:
        node = report.nodes.get(pid)
        session = node.session if node else None
        if session is None:
            return ""
        if session.hidden:
            return "[state hidden]"
        since = ""
        if session.state and session.state_change is not None:
            since = f" {format_duration((server.now - session.state_change).total_seconds())}"
        return f"{clean(session.state)}{since}" if session.state else ""

    def walk(tree: Tree, number: int, position: str) -> None:
        node = report.nodes.get(tree.pid)
        session = node.session if node else None
        app = clean(session.application_name) if session and session.application_name else ""
        if tree.edge is None:
            held = node.holds if node else []
            lock = ", ".join(dict.fromkeys(lock_label(e, server) for e in held))
            lock = f"holds {lock}" if lock else ""
            bound = [e.held_at_least for e in held if e.held_at_least is not None]
            wait = f"held ≥ {format_duration(max(bound))}" if bound else ""
            by = ""
        else:
            waits = node.waits if node else None
            lock = f"{lock_label(waits, server)} ({waits.lock.mode})" if waits else ""
            wait = format_duration(waits.waited) if waits and waits.waited is not None else ""
            by = f"pid {tree.edge.blocker}"
            if tree.edge.kind == "queued":
                by += " (queued behind a waiter)"
            if tree.cycle:
                lock, wait = "↺ cycle: already shown above", ""
        rows.append([str(number), position, str(tree.pid), app, state(tree.pid), lock, by, wait])
        for index, child in enumerate(tree.children, start=1):
            place = str(index) if position == "root" else f"{position}.{index}"
            walk(child, number, place)

    for number, root in enumerate(roots, start=1):
        walk(root.tree, number, "root")
    out: list[Block] = [Text([heading], "verdict") for heading in headings]
    out.append(Table(MARKDOWN_HEADERS, rows))
    out += [Text([_cycle_line(cycle)], "error") for cycle in report.cycles]
    return out


def _node_data(node: Node) -> dict[str, Any]:
    session = node.session
    return {
        "pid": node.pid,
        "application_name": session.application_name if session else None,
        "state": session.state if session else None,
        "user": session.user if session else None,
        "query": session.query if session else None,
        "parallel_workers": node.workers,
        "waits": entry_data(node.waits) if node.waits else None,
        "holds": [entry_data(e) for e in node.holds],
    }
