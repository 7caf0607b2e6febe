"""The wait-for graph of every lock type: who waits for whom, root blockers, cycles.

Built from ``pg_blocking_pids()`` of the waiting pids only (see the snapshot query), never by
joining pg_locks with itself. Its answer mixes two kinds of blockers, told apart in analysis:
*hard* ones hold a conflicting lock; *soft* ones are waiters queued ahead with a conflicting
request ("queued behind"). Parallel workers are folded into their leader.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from lockdiag.core.analysis import LockEntry
from lockdiag.core.model import Session, Snapshot

EdgeKind = Literal["holds", "queued"]


@dataclass(frozen=True)
class Edge:
    waiter: int
    blocker: int
    kind: EdgeKind  # "holds": blocker holds a conflicting lock; "queued": blocker waits ahead


@dataclass
class Node:
    pid: int
    session: Session | None
    waits: LockEntry | None = None  # the lock this session waits for
    holds: list[LockEntry] = field(default_factory=list)  # its locks that others wait for
    workers: list[int] = field(default_factory=list)  # parallel workers folded into it


@dataclass
class Tree:
    pid: int
    edge: Edge | None  # how this node hangs under its parent (None for a root)
    children: list[Tree] = field(default_factory=list)
    cycle: bool = False  # the pid already appears above: shown once, not expanded


@dataclass(frozen=True)
class Root:
    tree: Tree
    direct: int
    total: int
    longest_wait: float | None


@dataclass(frozen=True)
class Blockers:
    snapshot: Snapshot
    nodes: dict[int, Node]
    edges: list[Edge]
    roots: list[Root]  # ordered by impact: sessions blocked in total, then longest wait
    cycles: list[list[int]]  # waits that loop back on themselves (a deadlock not yet broken)

    def queues(self) -> list[Queue]:
        """Waiters at the head of a lock queue, most sessions queued behind first."""
        return lock_queues(self)


@dataclass(frozen=True)
class Queue:
    """A waiter that others queue behind: it waits for a lock that ``holders`` hold, and the
    sessions in ``queued`` wait only because its request came first (pg_blocking_pids names
    it, not the holders: their own requests conflict with its request, not with what the
    holders hold). Once it stops waiting, they are granted at once."""

    waiter: int
    entry: LockEntry  # the lock it waits for
    holders: tuple[int, ...]  # who holds what it waits for
    queued: tuple[int, ...]  # sessions waiting behind it alone, in queue order
    longest_wait: float | None  # the longest of their waits


def blockers(snapshot: Snapshot, entries: list[LockEntry]) -> Blockers:
    """The graph of ``entries``: the snapshot analysed with every lock type (a Diagnosis's)."""
    leader = _leaders(snapshot)
    nodes: dict[int, Node] = {}

    def node(pid: int) -> Node:
        canonical = leader.get(pid, pid)
        found = nodes.get(canonical)
        if found is None:
            found = nodes[canonical] = Node(canonical, snapshot.session(canonical))
        if canonical != pid and pid not in found.workers:
            found.workers.append(pid)
        return found

    edges: list[Edge] = []
    seen: set[Edge] = set()
    for entry in entries:
        pid = entry.lock.pid
        if pid is None:
            continue
        if not entry.lock.granted:
            waiter = node(pid)
            waiter.waits = waiter.waits or entry
            kinds: list[tuple[EdgeKind, int]] = [("holds", b) for b in entry.waits_for]
            kinds += [("queued", b) for b in entry.queued_behind]
            for kind, blocker in kinds:
                edge = Edge(waiter.pid, node(blocker).pid, kind)
                if edge.waiter != edge.blocker and edge not in seen:
                    seen.add(edge)
                    edges.append(edge)
        elif entry.blocks:
            node(pid).holds.append(entry)

    for pid, leader_pid in leader.items():  # workers that hold locks but block on their own
        if leader_pid in nodes and pid not in nodes[leader_pid].workers:
            nodes[leader_pid].workers.append(pid)
    children = _children(edges)
    waiting = {e.waiter for e in edges}
    root_pids = [pid for pid in dict.fromkeys(e.blocker for e in edges) if pid not in waiting]
    roots = [_root(pid, children, nodes) for pid in root_pids]
    roots.sort(key=lambda r: (-r.total, -(r.longest_wait or 0.0), r.tree.pid))
    return Blockers(snapshot, nodes, edges, roots, _cycles(edges))


def _leaders(snapshot: Snapshot) -> dict[int, int]:
    return {
        pid: session.leader_pid
        for pid, session in snapshot.sessions.items()
        if session.leader_pid is not None and session.leader_pid != pid
    }


def _children(edges: list[Edge]) -> dict[int, list[Edge]]:
    """Under each blocker, the waiters it holds up. A waiter with no hard blocker at all hangs
    under the first waiter it is queued behind, marked as queued."""
    hard = {e.waiter for e in edges if e.kind == "holds"}
    children: dict[int, list[Edge]] = defaultdict(list)
    placed: set[int] = set()
    for edge in edges:
        if edge.kind == "holds":
            children[edge.blocker].append(edge)
        elif edge.waiter not in hard and edge.waiter not in placed:
            placed.add(edge.waiter)
            children[edge.blocker].append(edge)
    return children


def _root(pid: int, children: dict[int, list[Edge]], nodes: dict[int, Node]) -> Root:
    def grow(pid: int, edge: Edge | None, path: frozenset[int]) -> Tree:
        if pid in path:
            return Tree(pid, edge, cycle=True)
        below = path | {pid}
        return Tree(pid, edge, [grow(e.waiter, e, below) for e in children.get(pid, [])])

    tree = grow(pid, None, frozenset())
    below = set(tree_pids(tree)) - {pid}
    waits = []
    for waiter in below:
        entry = nodes[waiter].waits if waiter in nodes else None
        if entry is not None and entry.waited is not None:
            waits.append(entry.waited)
    return Root(tree, len(tree.children), len(below), max(waits) if waits else None)


def tree_pids(tree: Tree) -> list[int]:
    found = [tree.pid]
    for child in tree.children:
        found.extend(tree_pids(child))
    return found


def _cycles(edges: list[Edge]) -> list[list[int]]:
    """Loops of waits (depth-first: ``path`` is the walk in progress, ``done`` is finished).
    Every member waits, so none of them is a root."""
    follows: dict[int, list[int]] = defaultdict(list)
    for edge in edges:
        follows[edge.waiter].append(edge.blocker)
    cycles: list[list[int]] = []
    known: set[frozenset[int]] = set()
    done: set[int] = set()

    def walk(pid: int, path: list[int]) -> None:
        if pid in path:
            loop = path[path.index(pid) :]
            key = frozenset(loop)
            if key not in known:
                known.add(key)
                start = loop.index(min(loop))
                cycles.append(loop[start:] + loop[:start])
            return
        if pid in done:
            return
        for blocker in follows.get(pid, []):
            walk(blocker, [*path, pid])
        done.add(pid)

    for pid in sorted(follows):
        walk(pid, [])
    return cycles


def behind(graph: Blockers, pid: int) -> list[int]:
    """Every session held up by ``pid``, directly or through others, nearest first."""
    waiters: dict[int, list[int]] = defaultdict(list)
    for edge in graph.edges:
        waiters[edge.blocker].append(edge.waiter)
    found: dict[int, None] = {}
    queue = [pid]
    while queue:
        for waiter in waiters.get(queue.pop(0), []):
            if waiter != pid and waiter not in found:
                found[waiter] = None
                queue.append(waiter)
    return list(found)


def lock_queues(graph: Blockers) -> list[Queue]:
    """Every waiter at the head of a queue: one that holders keep waiting and that sessions
    wait behind alone (each of their edges points to it, as queued). A session queued behind
    two waiters is no one's: cancelling one of them would not free it."""
    edges: dict[int, list[Edge]] = defaultdict(list)
    for edge in graph.edges:
        edges[edge.waiter].append(edge)
    behind_only: dict[int, list[int]] = defaultdict(list)
    for waiter, out in edges.items():
        heads = {e.blocker for e in out}
        if len(heads) == 1 and all(e.kind == "queued" for e in out):
            behind_only[out[0].blocker].append(waiter)
    found: list[Queue] = []
    for head, queued in behind_only.items():
        node = graph.nodes.get(head)
        holders = tuple(e.blocker for e in edges.get(head, ()) if e.kind == "holds")
        if node is None or node.waits is None or not holders:
            continue
        waits = [w.waited for p in queued if (w := graph.nodes[p].waits) and w.waited is not None]
        found.append(Queue(head, node.waits, holders, tuple(queued), max(waits, default=None)))
    found.sort(key=lambda q: (-len(q.queued), -(q.longest_wait or 0.0), q.waiter))
    return found


def oldest_wait(graph: Blockers, holds: list[LockEntry]) -> float | None:
    """The longest wait of the sessions waiting for any of ``holds``: how long the lock has
    been unavailable to them (not how long its holder has held it)."""
    waits = [
        w.waited
        for entry in holds
        for pid in entry.blocks
        if (node := graph.nodes.get(pid)) and (w := node.waits) and w.waited is not None
    ]
    return max(waits, default=None)
