"""Wait-for chains computed over the graph (issue 44, item 2): each session expanded once,
exact counts, no recursion a deep chain can overflow, output bounded in depth.

Hand-made snapshots (tests/snapshots.py): a 3000-deep chain through every command that shows
chains, DAGs whose waiters share blockers, and a property over random wait-for graphs against
a brute-force reachability. Then the real incident of the issue: 14 layers of 3 sessions.
"""

from __future__ import annotations

import json
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from snapshots import advisory, session, snapshot

from lockdiag.cli import cli
from lockdiag.core.chains import loops
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, Kind, Threshold
from lockdiag.core.graph import Blockers, Tree, tree_pids
from lockdiag.core.model import LockRow, Session, Snapshot
from lockdiag.core.snapshot_file import save
from lockdiag.core.termination import preview
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import Target, take_snapshot
from lockdiag.exporter import Exporter
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Registry, parse_registry
from lockdiag.render import Table, plain
from lockdiag.views.blockers import JSON_DEPTH, TEXT_DEPTH, blockers_output
from lockdiag.views.columns import ListRow
from lockdiag.views.listing import by_urgency

from conftest import Sessions, Worker

_PARSED, _ = parse_registry("[namespaces.plain]\nid = 7\n")
assert _PARSED is not None
REGISTRY: Registry = _PARSED
PLAIN = 7
DEPTH = 3000  # Python's recursion limit is 1000


def active(pid: int) -> Session:
    return session(pid, "active", -timedelta(seconds=1))


def idle_in_transaction(pid: int, held: float) -> Session:
    return session(pid, "idle in transaction", -timedelta(seconds=held), in_transaction=True)


def held(pid: int, key: int) -> LockRow:
    return advisory(pid, key, namespace=PLAIN)


def waits(pid: int, key: int, blockers: tuple[int, ...], waited: float) -> LockRow:
    return advisory(pid, key, False, blockers, namespace=PLAIN, waited=waited)


def deep_chain(depth: int) -> Snapshot:
    """pid 10000 holds key 0, idle in transaction; each next pid holds its own key and waits
    for the one before it: a straight chain ``depth`` sessions deep."""
    pids = range(10_000, 10_000 + depth + 1)
    sessions = [idle_in_transaction(pids[0], 3600.0), *map(active, pids[1:])]
    locks = [held(pid, n) for n, pid in enumerate(pids)]
    locks += [waits(pid, n - 1, (pid - 1,), float(depth - n + 60)) for n, pid in enumerate(pids)][
        1:
    ]
    return snapshot(sessions, locks)


def run(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture
def deep_file(tmp_path: Path) -> str:
    path = tmp_path / "deep.json"
    save(deep_chain(DEPTH), path)
    return str(path)


# -- a 3000-deep chain: every command that shows chains ---------------------------------------


def test_check_counts_a_3000_deep_chain(deep_file: str) -> None:
    result = run("check", "--from", deep_file)
    assert result.exit_code == 2, result.output
    assert f"blocks {DEPTH} session(s) (1 directly)" in result.output, result.output


def test_blockers_folds_a_3000_deep_chain_and_says_how_many(deep_file: str) -> None:
    result = run("blockers", "--from", deep_file)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith(f"blocks 1 directly, {DEPTH} in total, longest wait 50m59s"), lines[0]
    rows = lines[1:]
    assert len(rows) == TEXT_DEPTH + 2, rows  # the root, TEXT_DEPTH levels, one fold row
    assert rows[0].startswith("pid 10000 w [idle in transaction")
    assert rows[TEXT_DEPTH].startswith("   " * (TEXT_DEPTH - 1) + f"└─ pid {10_000 + TEXT_DEPTH} ")
    assert rows[-1] == "   " * TEXT_DEPTH + (
        f"└─ … {DEPTH - TEXT_DEPTH} more session(s) below pid {10_000 + TEXT_DEPTH}, deeper "
        f"than {TEXT_DEPTH} levels (--format json has every edge)"
    )


def test_blockers_json_of_a_3000_deep_chain(deep_file: str) -> None:
    result = run("blockers", "--from", deep_file, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (root,) = document["roots"]
    assert (root["pid"], root["direct"], root["total"]) == (10_000, 1, DEPTH)
    assert len(document["edges"]) == DEPTH and len(document["nodes"]) == DEPTH + 1
    node, depth = root["tree"], 0
    while node["children"]:
        assert node["folded"] == 0 and node["shown_under"] is None
        (node,) = node["children"]
        depth += 1
    assert (depth, node["pid"]) == (JSON_DEPTH, 10_000 + JSON_DEPTH)
    assert node["folded"] == DEPTH - JSON_DEPTH


def test_watch_frame_of_a_3000_deep_chain(deep_file: str) -> None:
    result = run("watch", "--once", "--from", deep_file)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    heading = next(line for line in lines if line.startswith("root blocker 1:"))
    assert f"{DEPTH} in total" in heading, heading
    assert any(f"{DEPTH - TEXT_DEPTH} more session(s) below" in line for line in lines), lines
    assert max(map(len, lines)) < 200


def test_list_ranks_a_3000_deep_chain() -> None:
    shot = deep_chain(DEPTH)
    report = Diagnosis(shot, REGISTRY).listing()
    rows = [ListRow(None, e, shot.server) for e in report.entries]
    ordered = by_urgency(rows, {None: report.roots()})
    # the root's lock first, then each session of the chain in its order: its wait, its lock
    pids = [row.entry.lock.pid for row in ordered]
    assert pids[:5] == [10_000, 10_001, 10_001, 10_002, 10_002], pids[:5]
    assert pids[-1] == 10_000 + DEPTH


def test_terminate_preview_lists_a_3000_deep_chain() -> None:
    plan = preview(Diagnosis(deep_chain(DEPTH), REGISTRY), 10_000)
    assert plan.blocked == list(range(10_001, 10_001 + DEPTH))  # nearest first


# -- shared blockers: each waiter once, counts exact -------------------------------------------


def diamond(waited: float = 60.0) -> Snapshot:
    """10 holds key 1, idle in transaction; 11 and 12 wait for it, each holding key 2 shared;
    13 waits for key 2, behind both of them."""
    sessions = [idle_in_transaction(10, 600.0), active(11), active(12), active(13)]
    locks = [
        held(10, 1),
        waits(11, 1, (10,), waited),
        waits(12, 1, (10, 11), waited),
        held(11, 2)._replace(mode="ShareLock"),
        held(12, 2)._replace(mode="ShareLock"),
        waits(13, 2, (11, 12), waited),
    ]
    return snapshot(sessions, locks)


def expanded(tree: Tree) -> list[int]:
    """The pids a tree expands (its leaves that point elsewhere left out)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if not node.cycle and node.shown_under is None:
            found.append(node.pid)
            todo.extend(reversed(node.children))
    return found


def test_a_waiter_behind_two_blockers_is_expanded_once() -> None:
    graph = Diagnosis(diamond(), REGISTRY).graph
    (root,) = graph.roots
    assert (root.pid, root.direct, root.total) == (10, 2, 3)
    assert tree_pids(root.tree) == [10, 11, 13, 12, 13]
    assert expanded(root.tree) == [10, 11, 13, 12]
    (_, twelve) = root.tree.children
    (again,) = twelve.children
    assert (again.pid, again.shown_under, again.cycle, again.children) == (13, 10, False, [])
    text = plain(blockers_output(incident_of(diamond())).blocks())
    assert "└─ pid 13 w [active 1s]  ↑ already shown above" in text, text
    assert text.count("pid 13 ") == 2, text


def incident_of(shot: Snapshot, policy: CheckPolicy | None = None) -> Any:
    return Diagnosis(shot, REGISTRY).incident(policy or CheckPolicy())


def test_a_crowded_root_counts_each_session_behind_it_once() -> None:
    """13 is behind 10 through 11 and through 12: three sessions wait, not four."""
    quiet = CheckPolicy(max_blocked=Threshold(3, 20))
    report = Diagnosis(diamond(), REGISTRY).findings(quiet)
    assert not [f for f in report.findings if f.kind is Kind.BLOCKED_MANY]
    loud = CheckPolicy(max_blocked=Threshold(2, 20))
    (crowded,) = [
        f for f in Diagnosis(diamond(), REGISTRY).findings(loud).findings
        if f.kind is Kind.BLOCKED_MANY
    ]  # fmt: skip
    assert "blocks 3 session(s) that have waited 30s or more (3 behind it in all" in (
        crowded.evidence
    ), crowded.evidence


def test_a_wait_behind_two_roots_is_credited_to_the_worst_everywhere() -> None:
    """10 and 20 both hold key 1; 30 waits for it (10 minutes): its wait is 10's symptom in
    the incident and in check's findings alike (check credited it to the last root)."""
    shot = snapshot(
        [active(10), active(20), active(30)],
        [
            held(10, 1)._replace(mode="ShareLock"),
            held(20, 1)._replace(mode="ShareLock"),
            waits(30, 1, (10, 20), 600.0),
        ],
    )
    found = incident_of(shot)
    first = found.causes[0]
    assert first.pid == 10 and [f.pid for f in first.symptoms] == [30]
    (wait,) = [f for f in found.report.findings if f.kind is Kind.LONG_WAIT]
    assert wait.root == 10
    graph = found.report.graph
    assert (graph.chain_of(30), graph.holds_up(10, 30), graph.holds_up(20, 30)) == (10, True, True)
    second = found.causes[1]
    assert second.root is not None
    (leaf,) = second.root.tree.children
    assert (leaf.pid, leaf.shown_under) == (30, 10)


def test_leaves_shown_elsewhere_share_a_row() -> None:
    """5 sessions hold key 1 in share mode; 12 wait for it, behind all 5: the first root's
    tree has the 12, each other root one row naming them (8, then a count)."""
    holders, waiting = range(10, 15), range(20, 32)
    shot = snapshot(
        [*map(active, holders), *map(active, waiting)],
        [held(pid, 1)._replace(mode="ShareLock") for pid in holders]
        + [waits(pid, 1, tuple(holders), 60.0) for pid in waiting],
    )
    output = blockers_output(incident_of(shot))
    lines = plain(output.blocks()).splitlines()
    first = lines[1].split()[1]
    row = (
        f"└─ pids 20, 21, 22, 23, 24, 25, 26, 27 and 4 more  ↑ shown under root blocker pid {first}"
    )
    assert lines.count(row) == 4, lines
    assert len(lines) == 5 + 1 + 12 + 4 * 2, lines  # headings, the first tree, 4 of 2 rows
    assert output.document is not None
    (table,) = [b for b in output.document() if isinstance(b, Table)]
    shared = [r for r in table.rows if r[2] == "20, 21, 22, 23, 24, 25, 26, 27 and 4 more"]
    assert [r[5] for r in shared] == [f"↑ shown under root blocker pid {first}"] * 4


# -- folding: the text and the JSON trees stay bounded in depth ---------------------------------


def test_a_chain_just_deep_enough_is_not_folded() -> None:
    text = plain(blockers_output(incident_of(deep_chain(TEXT_DEPTH))).blocks())
    assert "more session(s) below" not in text and f"pid {10_000 + TEXT_DEPTH} " in text


def test_the_markdown_table_folds_as_the_text_does() -> None:
    output = blockers_output(incident_of(deep_chain(TEXT_DEPTH + 5)))
    assert output.document is not None
    blocks = output.document()
    (table,) = [b for b in blocks if isinstance(b, Table)]
    rows = table.rows
    assert len(rows) == TEXT_DEPTH + 2
    assert rows[-1][5] == f"… 5 more session(s) deeper than {TEXT_DEPTH} levels"
    assert rows[-2][1] == ".".join(["1"] * TEXT_DEPTH)


def layers(count: int) -> Snapshot:
    """Layer 0 (pids 100, 101) holds key 0 in share mode; each session of layer i holds key i
    in share mode and waits for key i - 1, behind both of layer i - 1: in the first root's
    tree the first of each layer has the layer below, the second a row of leaves shown above."""
    pids = [(100 + 2 * level, 101 + 2 * level) for level in range(count)]
    locks = [
        held(p, level)._replace(mode="ShareLock") for level, two in enumerate(pids) for p in two
    ]
    locks += [
        waits(p, level - 1, pids[level - 1], 60.0) for level in range(1, count) for p in pids[level]
    ]
    return snapshot([active(p) for two in pids for p in two], locks)


def test_a_fold_never_hides_only_leaves_shown_elsewhere() -> None:
    """At the fold's depth, a session whose waiters are all shown above keeps its row of
    them: folding it said '… 0 more session(s)' and hid where they are."""
    count = TEXT_DEPTH + 5
    lines = plain(blockers_output(incident_of(layers(count))).blocks()).splitlines()
    assert not [line for line in lines if "… 0 more" in line], lines
    deepest = [line for line in lines if "more session(s) below" in line]
    assert len(deepest) == 1 and f"… {2 * (count - 1 - TEXT_DEPTH)} more" in deepest[0], lines
    second = 101 + 2 * TEXT_DEPTH  # the second session TEXT_DEPTH levels down
    at = next(i for i, line in enumerate(lines) if f"pid {second} " in line)
    leaves = f"└─ pids {second + 1}, {second + 2}  ↑ already shown above"
    below = lines[at + 1]  # one level below it, its bars kept
    assert below.endswith(leaves) and len(below) == 3 * TEXT_DEPTH + len(leaves), below


def test_the_markdown_fold_keeps_a_row_of_leaves() -> None:
    count = TEXT_DEPTH + 5
    output = blockers_output(incident_of(layers(count)))
    assert output.document is not None
    (table,) = [b for b in output.document() if isinstance(b, Table)]
    folds = [r[5] for r in table.rows if r[5].startswith("…")]
    assert folds == [
        f"… {2 * (count - 1 - TEXT_DEPTH)} more session(s) deeper than {TEXT_DEPTH} levels"
    ], folds


def test_the_json_fold_keeps_a_row_of_leaves() -> None:
    count = JSON_DEPTH + 3
    document = blockers_output(incident_of(layers(count))).data()
    node = document["roots"][0]["tree"]
    for _ in range(JSON_DEPTH - 1):
        node = node["children"][0]
    first, second = node["children"]  # JSON_DEPTH levels down
    assert first["folded"] == 2 * (count - 1 - JSON_DEPTH) and first["children"] == []
    assert second["folded"] == 0
    assert [leaf["shown_under"] for leaf in second["children"]] == [100, 100]


# -- random wait-for graphs against brute force ------------------------------------------------


@st.composite
def wait_graphs(draw: st.DrawFn) -> Snapshot:
    """Up to 10 sessions over 3 keys: each holds some keys and waits for at most one other,
    pg_blocking_pids() naming some of its holders (hard) and of its other waiters (queued):
    shared blockers, loops and waiters only queued behind others all come up."""
    count = draw(st.integers(2, 10))
    pids = list(range(1, count + 1))
    holds = {pid: draw(st.sets(st.integers(0, 2), max_size=2)) for pid in pids}
    wants = {pid: draw(st.sampled_from([None, 0, 1, 2])) for pid in pids}
    locks = [
        held(pid, key)._replace(mode="ShareLock") for pid in pids for key in sorted(holds[pid])
    ]
    for pid in pids:
        key = wants[pid]
        if key is None or key in holds[pid]:
            continue
        others = [p for p in pids if p != pid and (key in holds[p] or wants[p] == key)]
        named = draw(
            st.lists(st.sampled_from(others), unique=True, min_size=1) if others else st.just([])
        )
        waited = draw(st.sampled_from([1.0, 5.0, 40.0, 400.0]))
        locks.append(waits(pid, key, tuple(named), waited))
    return snapshot([active(pid) for pid in pids], locks)


def brute_children(graph: Blockers) -> dict[int, list[int]]:
    """The edges trees follow: every hard one; a waiter with none hangs under the first
    waiter it is queued behind."""
    hard = {e.waiter for e in graph.edges if e.kind == "holds"}
    children: dict[int, list[int]] = {}
    placed: set[int] = set()
    for e in graph.edges:
        if e.kind == "holds" or (e.waiter not in hard and e.waiter not in placed):
            placed.add(e.waiter)
            children.setdefault(e.blocker, []).append(e.waiter)
    return children


def reach(start: int, follows: dict[int, list[int]]) -> set[int]:
    found, todo = set(), deque([start])
    while todo:
        for nxt in follows.get(todo.popleft(), []):
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


@settings(max_examples=300)
@given(wait_graphs(), st.randoms(use_true_random=False))
def test_chains_match_brute_force_reachability(shot: Snapshot, rng: Any) -> None:
    graph = Diagnosis(shot, REGISTRY).graph
    children = brute_children(graph)
    waiting = {e.waiter for e in graph.edges}
    roots = {e.blocker for e in graph.edges} - waiting
    assert {r.pid for r in graph.roots} == roots
    behind = {r: reach(r, children) - {r} for r in roots}
    for root in graph.roots:
        below = behind[root.pid]
        waited = [w.waited for p in below if (w := graph.nodes[p].waits) and w.waited is not None]
        assert root.total == len(below)
        assert root.direct == len(children.get(root.pid, []))
        assert root.longest_wait == max(waited, default=None)
        for pid in shot.sessions:
            assert graph.holds_up(root.pid, pid) == (pid in below)
        assert graph.count_behind(root.pid, graph.selection([*below, root.pid])) == len(below)
    keys = [(-r.total, -(r.longest_wait or 0.0), r.pid) for r in graph.roots]
    assert keys == sorted(keys)
    for pid in shot.sessions:
        first = next((r.pid for r in graph.roots if pid in behind[r.pid]), None)
        assert graph.chain_of(pid) == first
    order = [r.pid for r in graph.roots]
    rng.shuffle(order)
    for forest in (graph.roots, graph.ranked(order)):
        assert [r.pid for r in forest] in ([r.pid for r in graph.roots], order)
        every: list[int] = []
        shown_under: dict[int, int] = {}
        for root in forest:
            assert root.tree.pid == root.pid and root.tree.edge is None
            assert set(tree_pids(root.tree)) <= behind[root.pid] | {root.pid}
            check_tree(root.tree, children, shown_under, root.pid)
            every += expanded(root.tree)
        assert sorted(every) == sorted(set().union(*behind.values(), roots))  # each once
        for pid, under in shown_under.items():  # a leaf points to the root that expands it
            assert pid in expanded(next(r.tree for r in forest if r.pid == under))
    follows: dict[int, list[int]] = {}
    for e in graph.edges:
        follows.setdefault(e.waiter, []).append(e.blocker)
    looping = {p for p in shot.sessions if p in reach(p, follows)}
    assert set().union(*map(set, graph.cycles)) == looping
    for loop in graph.cycles:
        assert loop[0] == min(loop) and len(set(loop)) == len(loop) >= 2
        for waiter, blocker in zip(loop, [*loop[1:], loop[0]], strict=True):
            assert blocker in follows[waiter]


def check_tree(
    top: Tree, children: dict[int, list[int]], shown_under: dict[int, int], root: int
) -> None:
    """Each expanded node has its pid's children in order; a leaf is a loop back to a node
    above it or points to the root that expands it."""
    todo: list[tuple[Tree, tuple[int, ...]]] = [(top, ())]
    while todo:
        node, above = todo.pop()
        if node.cycle:
            assert node.pid in above and not node.children and node.shown_under is None
            continue
        if node.shown_under is not None:
            assert not node.children
            shown_under[node.pid] = node.shown_under
            continue
        assert [c.pid for c in node.children] == children.get(node.pid, [])
        for child in node.children:
            assert child.edge is not None and child.edge.blocker == node.pid
            todo.append((child, (*above, node.pid)))


def test_a_loop_that_meets_the_first_one_away_from_its_start() -> None:
    """2 waits for 1 and 3, each of which waits for 2: the loop through 3 joins the loop
    through 1 at 2, not at 1, and closes there (a mutant cut it one node late, 1 → 2 → 3 → 1,
    where 3 waits for no 1; the random graphs did not find it)."""
    assert loops({1: [2], 2: [3, 1], 3: [2]}) == [[1, 2], [2, 3]]
    assert loops({1: [2], 2: [3], 3: [4, 1], 4: [3]}) == [[1, 2, 3], [3, 4]]


# -- the real incident of issue 44: 14 layers of 3 sessions ------------------------------------

LAYERS = 14
NAMED = "[namespaces.tenant_summary]\nid = 4102\n"


def layered(sessions: Sessions) -> list[list[Worker]]:
    """Layer 0 holds pg_advisory_lock_shared(4102, 0), idle; each session of layer i holds
    (4102, i) shared, then waits for (4102, i - 1) exclusive: behind the three sessions of
    layer i - 1 (they hold it) and the sessions of its own layer that asked before it."""
    layers: list[list[Worker]] = []
    for level in range(LAYERS):
        layer = []
        for n in range(3):
            worker = sessions.open(f"layer{level}-{n}")
            worker.run(f"SELECT pg_advisory_lock_shared(4102, {level})")
            if level:
                worker.start(f"SELECT pg_advisory_lock(4102, {level - 1})")
                sessions.waiting(worker)
            layer.append(worker)
        layers.append(layer)
    return layers


def nodes_of(tree: Tree) -> list[Tree]:
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        todo += node.children
    return found


def test_the_layered_incident_on_a_real_server_is_linear(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """Each session of the 13 waiting layers has 3 blockers: 3^13 paths from each root,
    which the trees followed (1.4 GB and 15 s for check). Every tree edge is one node now,
    each session expanded once, and every count exact."""
    layers = layered(sessions)
    names, _ = parse_registry(NAMED)
    assert names is not None
    graph = Diagnosis(take_snapshot(cluster.dsn(), 5, "all"), names).graph
    top = [w.pid for w in layers[0]]
    assert sorted(r.pid for r in graph.roots) == sorted(top)
    waiting = 3 * (LAYERS - 1)
    assert {(r.direct, r.total) for r in graph.roots} == {(3, waiting)}
    hard = [e for e in graph.edges if e.kind == "holds"]
    assert len(hard) == 9 * (LAYERS - 1)  # each waiter, behind each of the 3 above
    assert len(graph.edges) - len(hard) == 3 * (LAYERS - 1)  # 2nd behind 1st, 3rd behind both
    trees = [nodes_of(root.tree) for root in graph.roots]
    assert sum(map(len, trees)) == len(graph.roots) + len(hard)  # a node a root or an edge
    assert len(trees[0]) == 1 + 3 + 3 * 3 * (LAYERS - 2)  # the worst root expands them all
    assert sorted(p for root in graph.roots for p in expanded(root.tree)) == sorted(
        w.pid for layer in layers for w in layer
    )
    assert [len(t) for t in trees[1:]] == [4, 4]  # its 3 waiters, shown under the first
    deepest = layers[-1][0].pid
    assert all(graph.holds_up(pid, deepest) for pid in top)
    assert graph.chain_of(deepest) == graph.roots[0].pid

    (tmp_path / "lockdiag.toml").write_text(NAMED)  # tests run in tmp_path
    dsn, timeout = cluster.dsn(), ["--timeout", "2s"]
    check = run("check", "--dsn", dsn, "--wait-age", "1ms,1h", *timeout)
    assert f"blocks {waiting} session(s) (3 directly)" in check.stdout, check.stdout
    text = run("blockers", "--dsn", dsn, *timeout)
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    # headings, roots, a row a waiter (expanded once), and a row for the 3 waiters under each
    # 2nd and 3rd session of a layer, shown above, and for those under the other 2 roots
    assert len(lines) == 3 + 3 + waiting + 2 * (LAYERS - 2) + 2, lines
    assert sum(line.endswith("  ↑ already shown above") for line in lines) == 2 * (LAYERS - 2)
    first = lines[1].split()[1]  # root blocker 1's pid, on its tree's first row
    others = [line for line in lines if "↑ shown under root blocker pid" in line]
    listed = ", ".join(str(w.pid) for w in layers[1])
    assert others == [f"└─ pids {listed}  ↑ shown under root blocker pid {first}"] * 2
    document = json.loads(run("blockers", "--dsn", dsn, "--format", "json", *timeout).stdout)
    assert [r["total"] for r in document["roots"]] == [waiting] * 3
    holder = run("who-holds", "--key", "4102,0", "--dsn", dsn, *timeout)
    assert holder.exit_code == 0 and "root blocker" in holder.stdout, holder.output
    watched = run("watch", "--once", "--dsn", dsn, *timeout)
    assert watched.exit_code == 0 and f"{waiting} in total" in watched.stdout, watched.output
    # a scrape: on the previous code the target was reported down (lockdiag_up 0) after its
    # 2 s deadline, its analysis still running behind it
    scraper = Exporter([Target.of(dsn, Timeout(2.0), names, name="layers")], CheckPolicy(), 1.0)
    try:
        body = scraper.exposition(["layers"]).decode()
    finally:
        scraper.close()
    assert 'lockdiag_up{target="layers"} 1.0' in body, body
    assert f'lockdiag_most_blocked_sessions{{target="layers"}} {waiting}.0' in body, body
    path = tmp_path / "layers.json"
    assert run("snapshot", "--dsn", dsn, "-o", str(path)).exit_code == 0
    again = run("blockers", "--from", str(path)).stdout.splitlines()  # the file says as much
    assert len(again) == len(lines) and again[0].split(" · ")[0] == lines[0].split(" · ")[0]
