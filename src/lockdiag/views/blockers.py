"""`lockdiag blockers`: wait-for trees, one per root blocker, worst first."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, NamedTuple

from lockdiag.core.findings import figures, queue_evidence, queue_step
from lockdiag.core.graph import Blockers, Node, Queue, Root, Tree, oldest_wait
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
    it keeps (the bars of the tree go on through it); ``sessions``: how many sessions the row
    stands for (a leaf shown elsewhere none, a fold those it folds)."""

    prefix: str
    text: str
    indent: str
    sessions: int = 1

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


# Trees fold below this depth: a row's bars take three columns a level, so deeper rows would
# start past a screen's width. The fold row counts the sessions below it; no incident seen
# in practice comes near (the JSON tree goes deeper, to JSON_DEPTH, and its edges are all).
TEXT_DEPTH = 20
# orjson refuses nesting deeper than 254 (2 a tree level, 4 above the tree in a document)
JSON_DEPTH = 100


def tree_rows(tree: Tree, report: Blockers) -> list[TreeRow]:
    """A root's tree as rows in reading order, folded below TEXT_DEPTH, leaves shown
    elsewhere side by side on one row (an explicit stack: a chain thousands deep is no
    deeper for Python)."""
    rows = [TreeRow("", _root_text(tree, report), "│  " if tree.children else "   ")]
    todo = _pending(tree, "")
    while todo:
        item, prefix, last = todo.pop()
        glyphs = prefix + ("└─ " if last else "├─ ")
        below = prefix + ("   " if last else "│  ")
        if isinstance(item, list):
            rows.append(TreeRow(glyphs, _elsewhere_text(item, tree.pid), below + "   ", 0))
            continue
        node = item
        expanded = not node.cycle and node.shown_under is None
        text = _waiter_text(node, report, tree.pid)
        rows.append(
            TreeRow(glyphs, text, below + ("│  " if node.children else "   "), int(expanded))
        )
        if not node.children:
            continue
        if len(below) // 3 >= TEXT_DEPTH and expands(node):  # they would start past it
            folded = sessions_below(node)
            line = (
                f"… {folded} more session(s) below pid {node.pid}, deeper than {TEXT_DEPTH} "
                "levels (--format json has every edge)"
            )
            rows.append(TreeRow(below + "└─ ", line, below + "   ", folded))
            continue
        todo += _pending(node, below)
    return rows


Pending = list[tuple[Tree | list[Tree], str, bool]]  # a row to come: what, its prefix, last
LISTED = 8  # pids a row of leaves shown elsewhere names, before a count of the rest


def _pending(node: Tree, prefix: str) -> Pending:
    """The rows of a node's children, last first (a stack pops them in order)."""
    items = _items(node.children)
    last = len(items) - 1
    return [(item, prefix, i == last) for i, item in reversed(list(enumerate(items)))]


def _items(children: list[Tree]) -> list[Tree | list[Tree]]:
    """Children, each a row, except that two or more leaves in a row shown in the same
    place (sessions that wait for several of the same holders) share one."""
    items: list[Tree | list[Tree]] = []
    for child in children:
        run = items[-1] if items and child.shown_under is not None else None
        if isinstance(run, list) and run[0].shown_under == child.shown_under:
            run.append(child)
        elif isinstance(run, Tree) and run.shown_under == child.shown_under:
            items[-1] = [run, child]
        else:
            items.append(child)
    return items


def _elsewhere_text(leaves: list[Tree], root: int) -> str:
    """``pids 12, 13, 14  ↑ already shown above``: leaves shown in one place."""
    return f"pids {_listed(leaves)}  {_elsewhere(leaves[0], root)}"


def _listed(leaves: list[Tree]) -> str:
    """``12, 13, 14``, at most LISTED of them, then how many more."""
    pids = ", ".join(str(leaf.pid) for leaf in leaves[:LISTED])
    return pids + (f" and {len(leaves) - LISTED} more" if len(leaves) > LISTED else "")


def _root_text(tree: Tree, report: Blockers) -> str:
    node = report.nodes.get(tree.pid)
    server = report.snapshot.server
    line = _node_text(node, tree.pid, report)
    if node and node.holds:
        held = ", ".join(dict.fromkeys(lock_label(e, server) for e in node.holds))
        line += f" holds {held}"
        bound = max((e.held_at_least or 0.0) for e in node.holds)
        if any(e.held_at_least is not None for e in node.holds):
            both = figures(bound, oldest_wait(report, node.holds))
            line += f" ({both or f'≥ {format_duration(bound)}'})"
    return line


def _waiter_text(tree: Tree, report: Blockers, root: int) -> str:
    node = report.nodes.get(tree.pid)
    line = _node_text(node, tree.pid, report)
    if tree.cycle or tree.shown_under is not None:
        return f"{line}  {_elsewhere(tree, root)}"
    if node is not None and node.waits is not None and tree.edge is not None:
        waited = node.waits.waited
        line += f" waits {format_duration(waited)}" if waited is not None else " waits"
        line += f" for {lock_label(node.waits, report.snapshot.server)} ({node.waits.lock.mode})"
        if tree.edge.kind == "queued":
            line += f", queued behind waiter {tree.edge.blocker} (not a holder)"
    return line


def _elsewhere(tree: Tree, root: int) -> str:
    """Where a leaf's session is expanded: above it, on its own path (a loop of waits) or
    not, or in the chain of another root blocker."""
    if tree.cycle:
        return "↺ cycle: already shown above"
    if tree.shown_under == root:
        return "↑ already shown above"
    return f"↑ shown under root blocker pid {tree.shown_under}"


def expands(tree: Tree) -> bool:
    """Whether a waiter of the node is expanded under it: a fold only ever hides those (a
    row of leaves shown elsewhere goes one level deeper and no further; folded, it was
    '… 0 more session(s)' and hid where they are)."""
    return any(not child.cycle and child.shown_under is None for child in tree.children)


def sessions_below(tree: Tree) -> int:
    """The sessions a tree expands below its top (its leaves shown elsewhere left out)."""
    count, todo = 0, list(tree.children)
    while todo:
        node = todo.pop()
        if not node.cycle and node.shown_under is None:
            count += 1
            todo += node.children
    return count


def tree_lines(tree: Tree, report: Blockers) -> list[str]:
    return [row.line for row in tree_rows(tree, report)]


def _tree_data(tree: Tree) -> dict[str, Any]:
    """The tree as nested objects, folded below JSON_DEPTH (``folded``: the sessions below a
    node left out; ``edges`` has them all)."""
    top = _node_json(tree)
    todo = [(tree, top, 0)]
    while todo:
        node, data, depth = todo.pop()
        if depth >= JSON_DEPTH and expands(node):
            data["folded"] = sessions_below(node)
            continue
        for child in node.children:
            below = _node_json(child)
            data["children"].append(below)
            todo.append((child, below, depth + 1))
    return top


def _node_json(tree: Tree) -> dict[str, Any]:
    return {
        "pid": tree.pid,
        "edge": tree.edge.kind if tree.edge else None,
        "cycle": tree.cycle,
        "shown_under": tree.shown_under,
        "folded": 0,
        "children": [],
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
                    "pid": r.pid,
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


class Chain(NamedTuple):
    """A root's heading as screen lines, each tree row's screen lines, and the sessions each
    row stands for."""

    heading: list[str]
    rows: list[list[str]]
    sessions: list[int]


def chain_lines(
    heading: str, root: Root, graph: Blockers, columns: int, notes: tuple[str, ...] = ()
) -> Chain:
    """A root's heading (and ``notes`` under it, kept with it) and tree rows as screen lines
    ``columns`` wide (0: unwrapped), a wrapped row kept under the tree's indent."""
    rows = tree_rows(root.tree, graph)
    top = [line for text in [heading, *notes] for line in TreeRow("", text, "  ").wrapped(columns)]
    return Chain(top, [row.wrapped(columns) for row in rows], [row.sessions for row in rows])


def queue_lines(root: Root, graph: Blockers, queues: list[Queue]) -> tuple[str, ...]:
    """The lock queues in a root's chain, the quick way out first: sessions queued behind a
    waiter are freed by cancelling its wait, without touching the holder."""
    server = graph.snapshot.server
    return tuple(
        line
        for queue in queues
        if queue.waiter == root.pid or graph.holds_up(root.pid, queue.waiter)
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
        return [(heading, [line for row in rows for line in row]) for heading, rows, _ in chains], 0
    room -= sum(len(chain.heading) for chain in chains)
    least = [len(chain.rows[0]) + (len(chain.rows) > 1) for chain in chains]
    bare = sum(least) > room
    spare = room  # too few lines: what the headings leave, for counts while they fit
    room -= sum(least)
    fitted: list[tuple[list[str], list[str]]] = []
    cut = 0
    for (heading, rows, sessions), reserved in zip(chains, least, strict=True):
        room += reserved
        if bare:
            counted = len(rows) > 1 and spare > 0
            more = [more_sessions(sum(sessions[1:]), len(rows) - 1)] if counted else []
            fitted.append((heading, more))
            spare -= counted
            cut += len(rows) > 1
            continue
        shown: list[str] = []
        for index, row in enumerate(rows):
            left = len(rows) - index
            if index and len(row) + (left > 1) > room:  # the row, and a count of the rest
                shown.append(more_sessions(sum(sessions[index:]), left))
                room -= 1
                cut += 1
                break
            shown += row
            room -= len(row)
        fitted.append((heading, shown))
    return fitted, cut


def more_sessions(count: int, rows: int) -> str:
    """The count of a chain's rows left out: the sessions they stand for, or the rows when
    they are only leaves shown elsewhere."""
    if not count:
        return f"… {rows} more row(s) in this chain, of sessions shown above"
    return f"… {count} more session(s) in this chain"


MARKDOWN_HEADERS = ["root", "position", "pid", "application", "state", "lock", "blocked by", "wait"]


def _markdown_blocks(report: Blockers, roots: list[Root], headings: list[str]) -> list[Block]:
    """Every session of every chain as a row of one table: its root, its place in the tree
    ("root", then 1, 1.2 ...), the lock it holds (a root) or waits for, whom it waits for;
    folded and with leaves shown elsewhere side by side, as the text tree."""
    rows: list[list[str]] = []
    for number, root in enumerate(roots, start=1):
        todo: list[tuple[Tree | list[Tree], str, int]] = [(root.tree, "root", 0)]
        while todo:  # depth first, in reading order
            item, position, depth = todo.pop()
            if isinstance(item, list):
                edge = item[0].edge
                by = f"pid {edge.blocker}" if edge is not None else ""
                elsewhere = _elsewhere(item[0], root.pid)
                rows.append([str(number), position, _listed(item), "", "", elsewhere, by, ""])
                continue
            rows.append(_markdown_row(report, item, number, position, root.pid))
            if depth >= TEXT_DEPTH and expands(item):
                folded = f"… {sessions_below(item)} more session(s) deeper than {TEXT_DEPTH} levels"
                rows.append([str(number), f"{position}.…", "", "", "", folded, "", ""])
                continue
            below = []
            for index, child in enumerate(_items(item.children), start=1):
                place = str(index) if position == "root" else f"{position}.{index}"
                below.append((child, place, depth + 1))
            todo += reversed(below)
    out: list[Block] = [Text([heading], "verdict") for heading in headings]
    out.append(Table(MARKDOWN_HEADERS, rows))
    out += [Text([_cycle_line(cycle)], "error") for cycle in report.cycles]
    return out


def _markdown_row(report: Blockers, tree: Tree, number: int, position: str, root: int) -> list[str]:
    server = report.snapshot.server
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
        if tree.cycle or tree.shown_under is not None:
            lock, wait = _elsewhere(tree, root), ""
    return [str(number), position, str(tree.pid), app, _state(report, tree.pid), lock, by, wait]


def _state(report: Blockers, pid: int) -> str:
    node = report.nodes.get(pid)
    session = node.session if node else None
    if session is None:
        return ""
    if session.hidden:
        return "[state hidden]"
    since = ""
    if session.state and session.state_change is not None:
        now = report.snapshot.server.now
        since = f" {format_duration((now - session.state_change).total_seconds())}"
    return f"{clean(session.state)}{since}" if session.state else ""


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
