"""`lockdiag blockers`: wait-for trees, one per root blocker, worst first."""

from __future__ import annotations

from typing import Any

from lockdiag.core.graph import Blockers, Node, Tree
from lockdiag.durations import format_duration
from lockdiag.render import Block, Output, Text, clean
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


def tree_lines(tree: Tree, report: Blockers, prefix: str = "", last: bool = True) -> list[str]:
    node = report.nodes.get(tree.pid)
    server = report.snapshot.server
    if tree.edge is None:
        line = _node_text(node, tree.pid, report)
        if node and node.holds:
            held = ", ".join(dict.fromkeys(lock_label(e, server) for e in node.holds))
            line += f" holds {held}"
            bound = max((e.held_at_least or 0.0) for e in node.holds)
            if any(e.held_at_least is not None for e in node.holds):
                line += f" (≥ {format_duration(bound)})"
        lines = [line]
        child_prefix = ""
    else:
        branch = "└─ " if last else "├─ "
        line = prefix + branch + _node_text(node, tree.pid, report)
        if tree.cycle:
            line += "  ↺ cycle: already shown above"
        elif node is not None and node.waits is not None:
            waited = node.waits.waited
            line += f" waits {format_duration(waited)}" if waited is not None else " waits"
            line += f" for {lock_label(node.waits, server)} ({node.waits.lock.mode})"
            if tree.edge.kind == "queued":
                line += f", queued behind waiter {tree.edge.blocker} (not a holder)"
        lines = [line]
        child_prefix = prefix + ("   " if last else "│  ")
    for index, child in enumerate(tree.children):
        lines += tree_lines(child, report, child_prefix, index == len(tree.children) - 1)
    return lines


def _tree_data(tree: Tree) -> dict[str, Any]:
    return {
        "pid": tree.pid,
        "edge": tree.edge.kind if tree.edge else None,
        "cycle": tree.cycle,
        "children": [_tree_data(c) for c in tree.children],
    }


def blockers_output(report: Blockers) -> Output:
    def blocks() -> list[Block]:
        if not report.roots and not report.cycles:
            waiting = sum(1 for n in report.nodes.values() if n.waits)
            return [Text([f"no session waits for a lock ({waiting} waiting)" if waiting else
                          "no session waits for a lock"], "verdict")]  # fmt: skip
        out: list[Block] = []
        for number, root in enumerate(report.roots, start=1):
            longest = format_duration(root.longest_wait) if root.longest_wait is not None else "?"
            out.append(
                Text(
                    [
                        f"root blocker {number}: blocks {root.direct} directly, {root.total} in "
                        f"total, longest wait {longest}"
                    ],
                    "verdict",
                )
            )
            out.append(Text(tree_lines(root.tree, report)))
        for cycle in report.cycles:
            chain = " → ".join(map(str, [*cycle, cycle[0]]))
            out.append(
                Text(
                    [
                        f"cycle (a deadlock not yet broken; the server ends one of them after "
                        f"deadlock_timeout): {chain}"
                    ],
                    "error",
                )
            )
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
                for r in report.roots
            ],
            "cycles": report.cycles,
        }

    return Output(blocks, data)


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
