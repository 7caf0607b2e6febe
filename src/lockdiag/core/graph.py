"""The wait-for graph of every lock type: who waits for whom, root blockers, cycles.

Built from ``pg_blocking_pids()`` of the waiting pids only (see the snapshot query), never by
joining pg_locks with itself. Its answer mixes two kinds of blockers, told apart in analysis:
*hard* ones hold a conflicting lock; *soft* ones are waiters queued ahead with a conflicting
request ("queued behind"). Parallel workers are folded into their leader.

Waiters often share blockers (sessions holding one lock in share mode, each held up by the
same sessions above): chains are computed over the graph, never by following its paths
(there may be 3^depth of them). Each root's counts and who it holds up come from one pass
over the graph (:class:`lockdiag.core.chains.Reach`); its tree expands each session once
(:class:`Forest`). Nothing here recurses: a chain thousands deep is an ordinary input.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from lockdiag.core.analysis import LockEntry
from lockdiag.core.chains import Reach, first_reached, loops
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
    """A session in a root's chain, with the waiters it holds up. Each session is expanded
    (has its children) in one place only: the first it takes in reading order, under the
    first root blocker that holds it up. Elsewhere it is a leaf that says where it is."""

    pid: int
    edge: Edge | None  # how this node hangs under its parent (None for a root)
    children: list[Tree] = field(default_factory=list)
    cycle: bool = False  # the pid already appears above, on its own path: a loop of waits
    shown_under: int | None = None  # expanded elsewhere: in this root blocker's tree


@dataclass(frozen=True)
class Root:
    """A root blocker: it holds others up and waits for nobody. Its counts are exact (each
    session once, however many ways it is held up), whatever its tree leaves to others."""

    pid: int
    direct: int  # waiters hanging right under it
    total: int  # sessions it holds up, directly or through others
    longest_wait: float | None  # the longest of their waits
    forest: Forest = field(repr=False, compare=False)

    @property
    def tree(self) -> Tree:
        return self.forest.trees[self.pid]


class Forest:
    """The trees of some root blockers, in one order: a depth-first walk from each in turn
    (an explicit stack) expands every session it meets for the first time, so each is
    expanded once, under the first of them that holds it up, and every edge is one node:
    O(sessions + edges), built the first time a tree is asked for."""

    def __init__(self, order: Sequence[int], children: Mapping[int, Sequence[Edge]]) -> None:
        self.order, self._children = tuple(order), children

    @cached_property
    def trees(self) -> dict[int, Tree]:
        children = self._children
        expanded: dict[int, int] = {}  # pid -> the root whose tree expands it
        trees: dict[int, Tree] = {}
        for root in self.order:
            top = trees[root] = Tree(root, None)
            expanded[root] = root
            path = {root}  # the pids from the root down to the node being expanded
            stack = [(top, iter(children.get(root, ())))]
            while stack:
                tree, pending = stack[-1]
                edge = next(pending, None)
                if edge is None:
                    stack.pop()
                    path.discard(tree.pid)
                    continue
                pid = edge.waiter
                if pid in path:
                    tree.children.append(Tree(pid, edge, cycle=True))
                elif pid in expanded:
                    tree.children.append(Tree(pid, edge, shown_under=expanded[pid]))
                else:
                    child = Tree(pid, edge)
                    tree.children.append(child)
                    expanded[pid] = root
                    path.add(pid)
                    stack.append((child, iter(children.get(pid, ()))))
        return trees


@dataclass(frozen=True)
class Blockers:
    snapshot: Snapshot
    nodes: dict[int, Node]
    edges: list[Edge]
    roots: list[Root]  # ordered by impact: sessions blocked in total, then longest wait
    cycles: list[list[int]]  # waits that loop back on themselves (a deadlock not yet broken)
    children: dict[int, list[Edge]] = field(repr=False, compare=False)  # what trees follow
    reach: Reach = field(repr=False, compare=False)  # what each root holds up
    owner: dict[int, int] = field(repr=False, compare=False)  # pid -> its chain's root
    _ranked: dict[tuple[int, ...], list[Root]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def queues(self) -> list[Queue]:
        """Waiters at the head of a lock queue, most sessions queued behind first."""
        return lock_queues(self)

    def holds_up(self, root: int, pid: int) -> bool:
        """Whether root blocker ``root`` holds ``pid`` up, directly or through others."""
        return self.reach.reaches(root, pid)

    def chain_of(self, pid: int) -> int | None:
        """The root blocker whose chain ``pid`` is in: the first (worst) that holds it up."""
        return self.owner.get(pid)

    def selection(self, pids: Iterable[int]) -> int:
        """Some sessions, for :meth:`count_behind` (a bitset of the sessions in chains)."""
        return self.reach.mask(pids)

    def count_behind(self, root: int, among: int | None = None) -> int:
        """How many sessions root blocker ``root`` holds up (of a :meth:`selection`)."""
        return self.reach.count(root, among)

    def ranked(self, order: Sequence[int]) -> list[Root]:
        """The root blockers ``order`` names, in that order, each tree expanding what no
        root before it in that order expands (the graph's order: :attr:`roots`)."""
        key = tuple(order)
        if key == tuple(r.pid for r in self.roots):
            return self.roots
        found = self._ranked.get(key)
        if found is None:
            forest = Forest(key, self.children)
            known = {r.pid: r for r in self.roots}
            found = [replace(known[pid], forest=forest) for pid in key]
            self._ranked[key] = found
        return found


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
    follows = {blocker: [e.waiter for e in below] for blocker, below in children.items()}
    waited = {
        pid: node.waits.waited
        for pid, node in nodes.items()
        if node.waits is not None and node.waits.waited is not None
    }
    reach = Reach(follows, root_pids, waited)
    root_pids.sort(key=lambda pid: (-reach.count(pid), -(reach.largest[pid] or 0.0), pid))
    forest = Forest(root_pids, children)
    roots = [
        Root(pid, len(children.get(pid, ())), reach.count(pid), reach.largest[pid], forest)
        for pid in root_pids
    ]
    owner = first_reached(follows, root_pids)
    blocking: dict[int, list[int]] = defaultdict(list)  # every edge: cycles of queued ones too
    for edge in edges:
        blocking[edge.waiter].append(edge.blocker)
    return Blockers(snapshot, nodes, edges, roots, loops(blocking), children, reach, owner)


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


def tree_pids(tree: Tree) -> list[int]:
    """Every node of a tree in reading order, its leaves that point elsewhere included."""
    found: list[int] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node.pid)
        todo.extend(reversed(node.children))
    return found


def behind(graph: Blockers, pid: int) -> list[int]:
    """Every session held up by ``pid``, directly or through others, nearest first."""
    waiters: dict[int, list[int]] = defaultdict(list)
    for edge in graph.edges:
        waiters[edge.blocker].append(edge.waiter)
    found: dict[int, None] = {}
    queue = deque([pid])
    while queue:
        for waiter in waiters.get(queue.popleft(), []):
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
