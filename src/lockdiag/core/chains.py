"""Reachability in a wait-for graph, linear in sessions + edges, with no recursion.

A DAG of waits where each waiter shares its blockers (three sessions a layer, each waiting
for the three above) has as many paths as 3^depth: anything that follows paths is
exponential there, and anything recursive fails past Python's recursion limit on a straight
chain a thousand deep. What is here follows each edge once, with explicit stacks:

- :func:`components`: the strongly connected components (Tarjan's algorithm, iterative), a
  component emitted only after every component it reaches;
- :class:`Reach`: what each start reaches, computed once per component over that order as
  a Python int bitset (the union of its children's; deeper components get the lower bits,
  so an int is no wider than what lies under it), and each set freed once every component
  above it has read it: O(sessions + edges) unions of at most sessions/64 machine words;
- :func:`loops`: loops of waits that cover every session of each component that loops.

The graph is a mapping from a node to those it leads to; nodes are pids.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

Follows = Mapping[int, Sequence[int]]
_NONE: Sequence[int] = ()


def components(follows: Follows, starts: Iterable[int]) -> list[list[int]]:
    """The strongly connected components of the nodes reachable from ``starts``, each
    emitted after every component it reaches (sinks first). Tarjan's algorithm with an
    explicit stack: each node and each edge is visited once."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    found: list[list[int]] = []
    for start in starts:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(follows.get(start, _NONE)))]
        while work:
            node, pending = work[-1]
            for nxt in pending:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(follows.get(nxt, _NONE))))
                    break
                if nxt in on_stack and index[nxt] < low[node]:
                    low[node] = index[nxt]
            else:  # every edge of ``node`` followed: it is done
                work.pop()
                if work and low[node] < low[work[-1][0]]:
                    low[work[-1][0]] = low[node]
                if low[node] == index[node]:
                    component: list[int] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(component)
    return found


class Reach:
    """What each of ``starts`` reaches (itself left out), and the largest ``value`` there.

    Every node reachable from a start gets one bit; :meth:`below` is a start's set as an int.
    Only the starts' sets are kept."""

    def __init__(self, follows: Follows, starts: Sequence[int], value: Mapping[int, float]) -> None:
        order = components(follows, starts)
        self.bit: dict[int, int] = {}  # a component's members get consecutive bits
        part: dict[int, int] = {}  # node -> its component's place in ``order``
        lowest: list[int] = []  # each component's first bit
        for place, members in enumerate(order):
            lowest.append(len(self.bit))
            for node in members:
                part[node] = place
                self.bit[node] = len(self.bit)
        # how many edges from other components still have to read each component's set
        readers = [0] * len(order)
        for node, place in part.items():
            for nxt in follows.get(node, _NONE):
                if part[nxt] != place:
                    readers[part[nxt]] += 1
        sets: dict[int, int] = {}  # component -> every node it reaches, its own included
        highest: dict[int, float | None] = {}  # component -> the largest value in that set
        self.sets: dict[int, int] = {}
        self.largest: dict[int, float | None] = {}
        wanted = set(starts)
        for place, members in enumerate(order):
            under, top = 0, None  # what its edges out of it lead to
            for node in members:
                for nxt in follows.get(node, _NONE):
                    other = part[nxt]
                    if other == place:
                        continue
                    under |= sets[other]
                    top = _larger(top, highest[other])
                    readers[other] -= 1
                    if not readers[other]:  # nothing above still needs it
                        del sets[other], highest[other]
            whole = under | ((1 << len(members)) - 1) << lowest[place]
            largest = _larger(top, *(value.get(node) for node in members))
            for node in members:
                if node in wanted:  # what it reaches, itself left out
                    self.sets[node] = (under if len(members) == 1 else whole) & ~(
                        1 << self.bit[node]
                    )
                    others = [value.get(m) for m in members if m != node]
                    self.largest[node] = _larger(top, *others)
            if readers[place]:
                sets[place], highest[place] = whole, largest

    def below(self, start: int) -> int:
        return self.sets.get(start, 0)

    def count(self, start: int, among: int | None = None) -> int:
        """How many nodes ``start`` reaches (of those of the :meth:`mask` ``among``)."""
        found = self.below(start)
        return (found if among is None else found & among).bit_count()

    def reaches(self, start: int, node: int) -> bool:
        bit = self.bit.get(node)
        return bit is not None and bool(self.below(start) >> bit & 1)

    def mask(self, nodes: Iterable[int]) -> int:
        """The bits of ``nodes`` (those reachable from a start): O(nodes + bits / 8)."""
        bits = bytearray(len(self.bit) // 8 + 1)
        for node in nodes:
            bit = self.bit.get(node)
            if bit is not None:
                bits[bit >> 3] |= 1 << (bit & 7)
        return int.from_bytes(bits, "little")


def _larger(*values: float | None) -> float | None:
    return max((v for v in values if v is not None), default=None)


def first_reached(follows: Follows, starts: Sequence[int]) -> dict[int, int]:
    """Each node reachable from ``starts``, to the first start (in their order) that reaches
    it. A breadth-first walk from each start in turn, stopped at what an earlier one
    claimed (all that reaches is the earlier one's too): each edge followed once."""
    claimed: dict[int, int] = {}
    starting = set(starts)
    for start in starts:
        todo = deque([start])
        while todo:
            for nxt in follows.get(todo.popleft(), _NONE):
                if nxt not in claimed and nxt not in starting:
                    claimed[nxt] = start
                    todo.append(nxt)
    return claimed


def loops(follows: Follows) -> list[list[int]]:
    """Loops of ``follows`` that together pass through every node of every component that
    loops, each once, starting at its smallest node, in order.

    In each component, with ``first`` its smallest node, one breadth-first walk out of it
    and one into it give, for each node ``v`` no loop has passed through yet, a shortest
    path first → v and v → first; from the last node of the first path that lies on the
    second one, the two paths close a loop through ``v`` that repeats no node."""
    found: list[list[int]] = []
    for members in components(follows, sorted(follows)):
        if len(members) < 2:
            continue  # no edge leads from a node to itself (the graph drops them)
        inside = set(members)
        first = min(members)
        back: dict[int, list[int]] = {}
        for node in members:
            for nxt in follows.get(node, _NONE):
                if nxt in inside:
                    back.setdefault(nxt, []).append(node)
        came = _walk(first, follows, inside)  # node -> the node before it on first → node
        goes = _walk(first, back, inside)  # node -> the node after it on node → first
        covered: set[int] = set()
        for node in sorted(members):
            if node in covered:
                continue
            if node == first:  # back to it from the nearest node that leads to it
                last = min(back[first], key=lambda n: _depth(n, came))
                there = _path(last, came)
                loop = [*reversed(there)]
            else:
                there = _path(node, came)  # node ... first: first → node, backwards
                home = _path(node, goes)  # node → first
                on_home = set(home)
                join = next(n for n in there[1:] if n in on_home)  # first at the latest
                loop = [*reversed(there[: there.index(join) + 1]), *home[1 : home.index(join)]]
            covered.update(loop)
            start = loop.index(min(loop))
            found.append(loop[start:] + loop[:start])
    return sorted(found)


def _path(node: int, step: dict[int, int]) -> list[int]:
    """From ``node`` to the start of a walk, one ``step`` at a time."""
    path = [node]
    while step[path[-1]] != path[-1]:
        path.append(step[path[-1]])
    return path


def _depth(node: int, step: dict[int, int]) -> int:
    return len(_path(node, step))


def _walk(start: int, follows: Follows, inside: set[int]) -> dict[int, int]:
    """Breadth-first from ``start`` inside ``inside``: each node to the one it was reached
    from."""
    parent: dict[int, int] = {start: start}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for nxt in follows.get(node, _NONE):
            if nxt in inside and nxt not in parent:
                parent[nxt] = node
                todo.append(nxt)
    return parent
