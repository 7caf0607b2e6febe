"""The rules' edges that mutation testing found unpinned (scripts/mutation.sh rules): which lock
names a finding, which cause carries the waits, the order of findings, causes and list's rows,
what a fold counts, the census behind the metrics, the exclusion rule, a waiter with no wait
start and a cycle in the wait-for graph. On snapshots built by hand, without a server; results
are compared as data (pids, keys, kinds, orders), never as wording."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from lockdiag.core.analysis import DEFAULT_POLICY, older_than_transaction
from lockdiag.core.diagnosis import Diagnosis, Span
from lockdiag.core.findings import CheckPolicy, Finding, Kind, Threshold
from lockdiag.core.graph import Edge, behind, oldest_wait, tree_pids
from lockdiag.core.model import HIDDEN_QUERY, LockRow, PoolLink, Session, Space, describe_lock
from lockdiag.core.observe import KeyStats
from lockdiag.core.ownership import Ownership, may_release
from lockdiag.registry import Registry
from lockdiag.views.columns import ListRow
from lockdiag.views.listing import _folds, by_urgency, fold
from lockdiag.views.sample import fold as sample_fold

from helpers.registry import parsed_registry
from helpers.snapshots import (
    STARTED,
    active,
    advisory,
    idle,
    idle_in_transaction,
    session,
    snapshot,
)

REGISTRY: Registry = parsed_registry(
    """\
[namespaces.plain]
id = 7

[namespaces.xact]
id = 4102
expect = "xact"

[namespaces.xact2]
id = 4103
expect = "xact"

[namespaces.quick]
id = 5
max_hold = "1m"
max_wait = "10s"

[namespaces.slow]
id = 100
max_hold = "1m"
"""
)
PLAIN, XACT, XACT2, QUICK, SLOW, UNREGISTERED = 7, 4102, 4103, 5, 100, 77


def waiter(pid: int, key: int, holder: int, waited: float, namespace: int = PLAIN) -> LockRow:
    return advisory(pid, key, False, (holder,), namespace=namespace, waited=waited)


def diagnose(
    sessions: list[Session], locks: list[LockRow], pool: dict[int, PoolLink] | None = None
) -> Diagnosis:
    return Diagnosis(snapshot(sessions, locks, pool), REGISTRY)


def pooled(client: str | None, mode: str = "transaction", via: str = "console") -> PoolLink:
    return PoolLink("127.0.0.1:6432", "app/worker", mode, "idle", client, None, via)  # type: ignore[arg-type]


DEFAULTS = CheckPolicy()


def findings(diagnosis: Diagnosis, policy: CheckPolicy = DEFAULTS) -> list[Finding]:
    return diagnosis.findings(policy).findings


def key(finding: Finding) -> int | None:
    """The key of the lock that names a finding."""
    assert finding.entry is not None
    return finding.entry.lock.objid


# -- which lock names a backend's finding: the one others wait for most ------------------------


def test_a_backend_is_named_by_the_lock_most_sessions_wait_for() -> None:
    """An outlived client holds keys 1, 2 and 3; two sessions wait for key 2, one for key 3:
    its finding is about key 2, not the first in pg_locks' order."""
    locks = [
        *(advisory(10, n, namespace=PLAIN) for n in (1, 2, 3)),
        waiter(11, 2, 10, 1.0),
        waiter(12, 2, 10, 1.0),
        waiter(13, 3, 10, 1.0),
    ]
    shot = diagnose([idle(10, 1.0), active(11), active(12), active(13)], locks, {10: pooled(None)})
    [leaked] = [f for f in findings(shot) if f.kind is Kind.OUTLIVED_CLIENT]
    assert (leaked.pid, key(leaked)) == (10, 2)


# -- which cause carries the waits: the first of CAUSES' order, not of the detectors' ----------


def test_the_cause_that_carries_the_waits_is_chosen_by_kind() -> None:
    """pid 10 holds an unregistered key and an expect = "xact" key that pid 11 has waited 40s
    for: the broken declaration carries the wait, whatever order the detectors ran in."""
    locks = [
        advisory(10, 1, namespace=XACT),
        advisory(10, 9, namespace=UNREGISTERED),
        waiter(11, 1, 10, 40.0, XACT),
    ]
    found = findings(diagnose([idle(10, 100.0), active(11)], locks))
    carried = {f.kind: [(c.kind, c.pid) for c in f.caused] for f in found}
    assert carried[Kind.EXPECT_VIOLATED] == [(Kind.LONG_WAIT, 11)]
    assert carried[Kind.UNREGISTERED] == []
    assert carried[Kind.LONG_WAIT] == []
    assert [f.root for f in found if f.kind is Kind.LONG_WAIT] == [10]


def test_a_lock_queue_finding_has_no_root() -> None:
    """Only waits learn the root blocker of their chain: a queue's head is a waiter too, yet its
    finding is about the sessions behind it and carries nothing."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 40.0),
        advisory(12, 1, False, (11,), namespace=PLAIN, waited=35.0),
    ]
    found = findings(diagnose([active(10), active(11), active(12)], locks))
    assert {(f.kind, f.pid, f.root) for f in found} >= {
        (Kind.LOCK_QUEUE, 11, None),
        (Kind.LONG_WAIT, 11, 10),
    }


# -- the order of findings: the worst severity, then the waits caused, then the kind, the value -


def test_findings_are_ordered_by_severity_before_kind() -> None:
    """A critical session lock (pid 10, held 1h) before a warning wait, although a wait's kind
    comes first among findings of one severity."""
    locks = [advisory(10, 1, namespace=PLAIN), advisory(20, 2, namespace=PLAIN)]
    locks.append(waiter(21, 2, 20, 40.0))
    found = findings(diagnose([idle(10, 3600.0), active(20), active(21)], locks))
    assert [(f.kind, f.severity) for f in found] == [
        (Kind.SESSION_LOCK, "critical"),
        (Kind.LONG_WAIT, "warning"),
    ]


def test_findings_that_cause_waits_come_first_then_the_longest() -> None:
    """Of warnings: the stuck owner that a session waits for first; then, of two session locks,
    the one held longer."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        advisory(11, 2, namespace=PLAIN),
        advisory(20, 3, namespace=PLAIN),
        waiter(21, 3, 20, 40.0),
    ]
    sessions = [idle(10, 400.0), idle(11, 500.0), idle_in_transaction(20, 100.0), active(21)]
    found = findings(diagnose(sessions, locks))
    assert [(f.kind, f.pid, len(f.caused)) for f in found] == [
        (Kind.STUCK_OWNER, 20, 1),
        (Kind.SESSION_LOCK, 11, 0),
        (Kind.SESSION_LOCK, 10, 0),
        (Kind.LONG_WAIT, 21, 0),
    ]


# -- check hands on what it was given: the server that names relations, the notes --------------


def relation_wait(pid: int, holder: int, waited: float) -> LockRow:
    """A wait for relation 16384 of database 5, as pg_locks shows it."""
    return LockRow(
        "relation", 5, 16384, None, None, None, None, None, None, None, f"{pid}/0", pid,
        "AccessExclusiveLock", False, STARTED - timedelta(seconds=waited), (holder,),
    )  # fmt: skip


def test_locks_on_a_relation_are_named_by_the_snapshot_s_server() -> None:
    """An idle transaction holds relation 16384 that six sessions wait for: every finding is
    about the relation as describe_lock names it from the snapshot's server."""
    held = relation_wait(10, 0, 0.0)._replace(granted=True, waitstart=None, blocked_by=None)
    waits = [relation_wait(pid, 10, 40.0) for pid in range(11, 17)]
    sessions = [idle_in_transaction(10, 100.0), *(active(pid) for pid in range(11, 17))]
    shot = snapshot(sessions, [held, *waits])
    found = findings(Diagnosis(shot, REGISTRY, DEFAULT_POLICY))
    named = describe_lock(held, shot.server)
    assert {(f.kind, f.lock) for f in found} == {
        (Kind.STUCK_OWNER, named), (Kind.LONG_WAIT, named), (Kind.BLOCKED_MANY, named),
    }  # fmt: skip


def test_a_queue_on_a_relation_is_named_by_the_snapshot_s_server() -> None:
    """12 queues behind 11's request for relation 16384, which 10 holds."""
    held = relation_wait(10, 0, 0.0)._replace(
        granted=True, waitstart=None, blocked_by=None, mode="AccessShareLock"
    )
    queued = relation_wait(12, 11, 40.0)._replace(mode="AccessShareLock")
    shot = snapshot(
        [active(pid) for pid in (10, 11, 12)], [held, relation_wait(11, 10, 50.0), queued]
    )
    [queue] = [f for f in findings(Diagnosis(shot, REGISTRY)) if f.kind is Kind.LOCK_QUEUE]
    assert (queue.pid, queue.lock, queue.value) == (11, describe_lock(held, shot.server), 1.0)


def test_a_check_report_keeps_the_diagnosis_notes() -> None:
    hidden = session(10, "idle", -timedelta(seconds=1))
    hidden = replace(hidden, state=None, backend_type=None, query=HIDDEN_QUERY)
    diagnosis = diagnose([hidden], [advisory(10, 1, namespace=PLAIN)])
    assert diagnosis.notes  # the hidden session is said
    assert diagnosis.findings(CheckPolicy()).notes == diagnosis.notes


def test_a_lock_queue_is_judged_by_the_wait_age_policy() -> None:
    """The queue behind pid 11 has waited 35s: a warning at --wait-age 30s, nothing at 60s."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 1.0),
        advisory(12, 1, False, (11,), namespace=PLAIN, waited=35.0),
    ]
    shot = diagnose([active(10), active(11), active(12)], locks)
    for level, expected in ((30.0, {(Kind.LOCK_QUEUE, "warning", 11)}), (60.0, set())):
        policy = CheckPolicy(wait_age=Threshold(level, 3000))
        assert {
            (f.kind, f.severity, f.pid) for f in findings(shot, policy) if f.kind is Kind.LOCK_QUEUE
        } == expected


# -- the census behind the metrics: advisory locks by database, namespace and state ------------


def test_the_census_counts_locks_by_namespace_and_state() -> None:
    locks = [
        advisory(10, 1, namespace=PLAIN),
        advisory(10, 2, namespace=PLAIN),
        waiter(11, 1, 10, 1.0),
        advisory(12, 3, namespace=UNREGISTERED),
        advisory(13, 5, namespace=PLAIN),
    ]
    sessions = [idle(10, 400.0), active(11), idle(12, 0.5), idle_in_transaction(13, 900.0)]
    census = diagnose(sessions, locks).findings(CheckPolicy()).census
    assert census.advisory == {
        ("app", "plain", "held"): 3,
        ("app", "plain", "waiting"): 1,
        ("app", "unregistered", "held"): 1,
    }
    # the longest certain session lock: pid 13's transaction may hold its lock, not a session
    assert census.oldest_session_lock == 400.0
    assert [e.lock.pid for e in census.waiters] == [11]


def test_the_oldest_session_lock_below_a_second() -> None:
    census = (
        diagnose([idle(12, 0.5)], [advisory(12, 3, namespace=PLAIN)]).findings(CheckPolicy()).census
    )
    assert census.oldest_session_lock == 0.5


# -- the exclusion rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "advisory_lock", "allowed"),
    [
        ("unknown", True, False),  # an idle holder of advisory locks: never ended on idleness
        ("unknown", False, True),
        ("declared", True, True),
        ("proven", True, True),
        ("proven", False, True),
    ],
)
def test_may_release(level: str, advisory_lock: bool, allowed: bool) -> None:
    owner = Ownership(level, "evidence")  # type: ignore[arg-type]
    assert may_release(owner, advisory_lock) is allowed


# -- the wait-for graph: who is behind whom, a waiter with no wait start, a cycle --------------


def chain() -> Diagnosis:
    """10 holds key 1; 11 waits for it (20s) holding key 2; 12 waits for key 2 (5s); 13 waits
    for key 1 with no wait start (pg_locks.waitstart not set yet)."""
    no_start = waiter(13, 1, 10, 0.0)._replace(waitstart=None)
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 20.0),
        advisory(11, 2, namespace=PLAIN),
        waiter(12, 2, 11, 5.0),
        no_start,
    ]
    return diagnose([active(pid) for pid in (10, 11, 12, 13)], locks)


def test_behind_is_every_session_held_up_nearest_first() -> None:
    graph = chain().graph
    assert behind(graph, 10) == [11, 13, 12]
    assert behind(graph, 11) == [12]
    assert behind(graph, 12) == []


def test_the_oldest_wait_for_a_holder_s_locks() -> None:
    diagnosis = chain()
    graph, entries = diagnosis.graph, diagnosis.advisory
    holds = {e.lock.pid: e for e in entries if e.lock.granted}
    assert oldest_wait(graph, [holds[10]]) == 20.0
    assert oldest_wait(graph, [holds[11]]) == 5.0
    assert oldest_wait(graph, [holds[10], holds[11]]) == 20.0


def test_a_waiter_with_no_wait_start_has_no_wait_and_the_root_keeps_the_known_ones() -> None:
    [root] = chain().graph.roots
    assert (root.tree.pid, root.direct, root.total, root.longest_wait) == (10, 2, 3, 20.0)
    alone = diagnose(
        [active(10), active(13)],
        [advisory(10, 1, namespace=PLAIN), waiter(13, 1, 10, 0.0)._replace(waitstart=None)],
    )
    [root] = alone.graph.roots
    assert (root.total, root.longest_wait) == (1, None)
    assert oldest_wait(alone.graph, alone.advisory[:1]) is None


def test_a_wait_that_began_after_the_snapshot_s_now_has_waited_no_time() -> None:
    """now() is when the snapshot's statement began and pg_locks is copied after it: a wait that
    began in between has its waitstart after now. It has waited 0 s, never less (the exporter
    once served a negative lockdiag_wait_seconds_sum)."""
    late = diagnose(
        [active(10), active(11)],
        [advisory(10, 1, namespace=PLAIN), waiter(11, 1, 10, -0.002)],
    )
    [wait] = [e for e in late.advisory if not e.lock.granted]
    assert wait.waited == 0.0
    [root] = late.graph.roots
    assert root.longest_wait == 0.0


def test_a_cycle_below_a_root_ends_its_tree() -> None:
    """10 and 12 share key 1 that 11 waits for; 12 waits for 11's key 2: 11 and 12 wait for
    each other, below 10."""
    locks = [
        advisory(10, 1, namespace=PLAIN)._replace(mode="ShareLock"),
        advisory(12, 1, namespace=PLAIN)._replace(mode="ShareLock"),
        advisory(11, 2, namespace=PLAIN),
        advisory(11, 1, False, (10, 12), namespace=PLAIN, waited=9.0),
        waiter(12, 2, 11, 8.0),
    ]
    graph = diagnose([active(pid) for pid in (10, 11, 12)], locks).graph
    [root] = graph.roots
    assert tree_pids(root.tree) == [10, 11, 12, 11]
    [eleven] = root.tree.children
    [twelve] = eleven.children
    [again] = twelve.children
    assert (eleven.edge, twelve.edge) == (Edge(11, 10, "holds"), Edge(12, 11, "holds"))
    assert (eleven.cycle, twelve.cycle, again.cycle, again.edge) == (
        False, False, True, Edge(11, 12, "holds"),
    )  # fmt: skip
    assert (root.total, root.longest_wait) == (2, 9.0)
    assert graph.cycles == [[11, 12]]


# -- what the evidence proves of the owner: its level, whatever the words -----------------------


@pytest.mark.parametrize(
    ("namespaces", "link", "expected"),
    [
        pytest.param((PLAIN,), pooled(None),
                     {(Kind.OUTLIVED_CLIENT, "proven"), (Kind.SESSION_LOCK, "proven")},
                     id="a pooled connection with no client: proven"),
        pytest.param((PLAIN,), pooled("10.0.0.1:5000"),
                     {(Kind.OUTLIVED_CLIENT, "proven"), (Kind.SESSION_LOCK, "proven")},
                     id="lent to another client by transaction pooling: proven"),
        pytest.param((PLAIN,), pooled("10.0.0.1:5000", "session"), {(Kind.SESSION_LOCK, "unknown")},
                     id="session pooling, its client attached: unknown"),
        pytest.param((PLAIN,), pooled(None, via="address"), {(Kind.SESSION_LOCK, "unknown")},
                     id="a pooler's address only, no console: unknown"),
        pytest.param((PLAIN,), None, {(Kind.SESSION_LOCK, "unknown")}, id="idle: unknown"),
        pytest.param((UNREGISTERED, SLOW), None,
                     {(Kind.SESSION_LOCK, "declared"), (Kind.MAX_HOLD, None),
                      (Kind.UNREGISTERED, None)},
                     id="past a max_hold, after a key of no namespace: declared"),
        pytest.param((XACT,), None,
                     {(Kind.SESSION_LOCK, "declared"), (Kind.EXPECT_VIOLATED, None)},
                     id='expect = "xact" broken: declared'),
    ],
)  # fmt: skip
def test_the_owner_s_evidence_level(
    namespaces: tuple[int, ...], link: PoolLink | None, expected: set[tuple[Kind, str | None]]
) -> None:
    locks = [advisory(10, 1, namespace=n) for n in namespaces]
    shot = diagnose([idle(10, 400.0)], locks, {10: link} if link else None)
    found = findings(shot)
    assert {(f.kind, f.owner.level if f.owner else None) for f in found} == expected
    assert all(f.owner.evidence for f in found if f.owner is not None)


# -- the order of causes: impact, then whether it ends by itself, the longest wait, the age -----


def test_causes_that_will_not_end_by_themselves_come_first() -> None:
    """Four roots, each blocking one session: the idle one (it will not end by itself) first,
    then those whose state is not known (no session row, a hidden one; the longer wait first),
    then the active one, whose wait is the longest."""
    hidden = replace(active(20), state=None, backend_type=None, query=HIDDEN_QUERY)
    sessions = [active(10), hidden, idle(30, 5.0), active(11), active(21), active(31), active(41)]
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 50.0),
        advisory(20, 2, namespace=PLAIN),
        waiter(21, 2, 20, 40.0),
        advisory(30, 3, namespace=PLAIN),
        waiter(31, 3, 30, 10.0),
        advisory(40, 4, namespace=PLAIN),
        waiter(41, 4, 40, 45.0),
    ]
    causes = diagnose(sessions, locks).incident(CheckPolicy()).causes
    assert [c.pid for c in causes] == [30, 40, 20, 10]


def test_of_equal_causes_the_older_first() -> None:
    found = diagnose([idle(10, 400.0), idle(11, 500.0)], [
        advisory(10, 1, namespace=PLAIN), advisory(11, 2, namespace=PLAIN)
    ]).incident(CheckPolicy()).causes  # fmt: skip
    assert [(c.pid, c.age) for c in found] == [(11, 500.0), (10, 400.0)]


# -- list's order and folds -----------------------------------------------------------------------


def listed(diagnosis: Diagnosis) -> list[ListRow]:
    shot = diagnosis.snapshot
    return [ListRow(None, e, shot.server) for e in diagnosis.listing().entries]


def test_list_orders_a_chain_then_a_deadlock_then_flags_then_the_rest() -> None:
    """Root 10's chain (its lock with two waiters before its lock with one), then 20 and 21,
    who wait for each other (no root accounts for them), then 30's flagged lock, then 40's."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 9.0),
        advisory(10, 2, namespace=PLAIN),
        waiter(12, 2, 10, 8.0),
        waiter(13, 2, 10, 7.0),
        advisory(40, 9, namespace=PLAIN),
        advisory(30, 1, namespace=UNREGISTERED),
        advisory(20, 5, namespace=SLOW),
        waiter(21, 5, 20, 6.0, SLOW),
        advisory(21, 6, namespace=SLOW),
        waiter(20, 6, 21, 5.0, SLOW),
    ]
    sessions = [*(active(pid) for pid in (10, 11, 12, 13, 20, 21, 40)), idle(30, 1.0)]
    diagnosis = diagnose(sessions, locks)
    ordered = by_urgency(listed(diagnosis), {None: diagnosis.listing().roots()})
    assert [(row.entry.lock.pid, row.entry.lock.objid) for row in ordered] == [
        (10, 2), (10, 1), (11, 1), (12, 2), (13, 2),
        (20, 5), (21, 5), (21, 6), (20, 6),
        (30, 1),
        (40, 9),
    ]  # fmt: skip


def folding() -> list[ListRow]:
    """pid 10 holds keys 2, 3 and 4 that nobody waits for, key 7 that 16 waits for, and waits
    for key 6; 14 holds key 1 alone; 11 holds key 0, which 12 waits for."""
    locks = [
        advisory(11, 0, namespace=PLAIN),
        waiter(12, 0, 11, 1.0),
        advisory(14, 1, namespace=PLAIN),
        *(advisory(10, n, namespace=PLAIN) for n in (2, 3, 4)),
        advisory(15, 6, namespace=PLAIN),
        waiter(10, 6, 15, 1.0),
        advisory(10, 7, namespace=PLAIN),
        waiter(16, 7, 10, 1.0),
    ]
    sessions = [active(pid) for pid in (10, 11, 12, 14, 15, 16)]
    return listed(diagnose(sessions, locks))


def test_a_fold_takes_only_the_uncontested_granted_locks() -> None:
    rows = folding()
    at = {
        (r.entry.lock.pid, r.entry.lock.objid, r.entry.lock.granted): i for i, r in enumerate(rows)
    }
    assert fold(rows) == {
        at[10, 2, True]: "3 x plain 2..4",
        at[10, 3, True]: "",
        at[10, 4, True]: "",
    }


def test_a_fold_counts_the_whole_lock_table_where_it_was_narrowed() -> None:
    rows = folding()
    first = next(i for i, r in enumerate(rows) if r.entry.lock[11:13] == (10, "ExclusiveLock"))
    plain = REGISTRY.namespaces["plain"]
    space: Space = (10, 5, "ExclusiveLock", 2, PLAIN)
    spans: dict[str | None, Mapping[Space, Span] | None] = {
        None: {space: Span(plain, 500, 10000, 10499)}
    }
    assert fold(rows, spans)[first] == "500 x plain 10000..10499"
    assert _folds(rows, spans)[1] == {id(rows[first].entry): 500}
    other: dict[str | None, Mapping[Space, Span] | None] = {
        None: {space: Span(REGISTRY.namespaces["xact"], 500, 10000, 10499)}
    }
    assert fold(rows, other)[first] == "3 x plain 2..4"  # a span of another namespace: its rows


def test_sample_folds_three_keys_of_one_holder_that_nobody_waited_for() -> None:
    def stats(
        label: str, namespace: str | None, resource: int | None, **seen: set[int]
    ) -> KeyStats:
        holders = seen.pop("holders", {10})
        return KeyStats(label, "app", namespace, holder_pids=holders, resource=resource, **seen)  # type: ignore[arg-type]

    ordered = [
        stats("a", "plain", 3),
        stats("b", "plain", None),
        stats("c", "plain", 9, waiter_pids={11}),
        stats("d", "plain", 1),
        stats("e", "plain", 5, holders={10, 12}),
        stats("f", "quiet", None),
        stats("g", "quiet", None),
        stats("h", "quiet", None),
        stats("i", None, 4),
        stats("j", "pair", 1),
        stats("k", "pair", 2),
    ]
    rows = sample_fold(ordered)
    assert [(label, [s.label for s in group]) for label, group in rows] == [
        ("3 x plain 1..3", ["a", "b", "d"]),
        ("c", ["c"]),
        ("e", ["e"]),
        ("3 x quiet", ["f", "g", "h"]),
        ("i", ["i"]),
        ("j", ["j"]),
        ("k", ["k"]),
    ]


# -- what each finding says is text for a person: never None, never a Python repr -------------


def everything() -> Diagnosis:
    """Most kinds at once: outlived clients (one with a client attached), session locks, a
    stuck owner, a crowd, broken declarations, waits past --wait-age and past max_wait, and
    a lock queue."""
    locks = [
        *(advisory(10, n, namespace=PLAIN) for n in (1, 2)),
        advisory(11, 3, namespace=PLAIN),
        waiter(12, 3, 11, 1.0),
        *(advisory(13, n, namespace=PLAIN) for n in (4, 5)),
        advisory(14, 1, namespace=XACT),
        advisory(14, 2, namespace=XACT),
        *(advisory(15, n, namespace=QUICK) for n in (1, 2)),
        waiter(16, 1, 15, 20.0, QUICK),
        advisory(17, 6, namespace=PLAIN),
        waiter(18, 6, 17, 40.0),
        advisory(19, 6, False, (18,), namespace=PLAIN, waited=35.0),
        advisory(20, 1, namespace=SLOW),
        *(waiter(pid, 1, 20, 40.0, SLOW) for pid in range(21, 28)),
    ]
    sessions = [
        idle(10, 400.0), idle(11, 4000.0), active(12), idle(13, 700.0), idle(14, 400.0),
        idle_in_transaction(15, 100.0), active(16), active(17), active(18), active(19),
        active(20), *(active(pid) for pid in range(21, 28)),
    ]  # fmt: skip
    pool = {10: pooled(None), 11: pooled("10.0.0.1:5000")}
    return diagnose(sessions, locks, pool)


def test_every_finding_s_words_are_text() -> None:
    found = findings(everything())
    kinds = {f.kind for f in found}
    assert kinds >= {Kind.OUTLIVED_CLIENT, Kind.SESSION_LOCK, Kind.STUCK_OWNER, Kind.BLOCKED_MANY,
                     Kind.EXPECT_VIOLATED, Kind.MAX_HOLD, Kind.MAX_WAIT, Kind.LONG_WAIT,
                     Kind.LOCK_QUEUE}  # fmt: skip
    for finding in found:
        for words in (finding.lock, finding.evidence, finding.next_step):
            assert isinstance(words, str) and words, finding
            assert "None" not in words, finding
    held = {Kind.OUTLIVED_CLIENT, Kind.SESSION_LOCK, Kind.STUCK_OWNER}
    assert all(f.owner is not None for f in found if f.kind in held)


def test_each_finding_counts_its_locks() -> None:
    counted = {(f.kind, f.pid): (f.locks, f.value) for f in findings(everything())}
    assert counted[Kind.OUTLIVED_CLIENT, 10] == (2, 400.0)
    assert counted[Kind.SESSION_LOCK, 13] == (2, 700.0)
    assert counted[Kind.EXPECT_VIOLATED, 14] == (2, 400.0)
    assert counted[Kind.MAX_WAIT, 16] == (1, 20.0)
    assert counted[Kind.BLOCKED_MANY, 20] == (1, 7.0)
    assert counted[Kind.LOCK_QUEUE, 18] == (1, 1.0)


# -- the detectors' loops: one finding per backend, none skipped after one that does not fire --


def test_a_backend_breaking_two_declarations_is_a_finding_for_each() -> None:
    locks = [advisory(10, 1, namespace=XACT), advisory(10, 2, namespace=XACT2)]
    found = findings(diagnose([idle(10, 1.0)], locks))
    assert sorted((f.kind, f.pid, f.entry.lock.classid) for f in found if f.entry) == [
        (Kind.EXPECT_VIOLATED, 10, XACT),
        (Kind.EXPECT_VIOLATED, 10, XACT2),
    ]


def test_a_stuck_owner_is_one_finding_and_does_not_hide_the_next() -> None:
    """10 has been idle in its transaction only 10s (two locks waited for); 20 for 100s."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 1.0),
        advisory(10, 2, namespace=PLAIN),
        waiter(12, 2, 10, 1.0),
        advisory(20, 3, namespace=PLAIN),
        waiter(21, 3, 20, 1.0),
        advisory(20, 4, namespace=PLAIN),
        waiter(22, 4, 20, 1.0),
        advisory(30, 5, namespace=PLAIN),
        waiter(31, 5, 30, 1.0),
    ]
    idle_for = {10: 10.0, 20: 100.0, 30: 700.0}
    sessions = [idle_in_transaction(pid, seconds) for pid, seconds in idle_for.items()]
    sessions += [active(pid) for pid in (11, 12, 21, 22, 31)]
    found = [(f.kind, f.severity, f.pid) for f in findings(diagnose(sessions, locks))]
    assert sorted(found) == [
        (Kind.STUCK_OWNER, "critical", 30),
        (Kind.STUCK_OWNER, "warning", 20),
    ]


def test_a_stuck_owner_holding_an_advisory_lock_gets_no_timeout_and_no_terminate() -> None:
    """Idle in transaction may be a coordination library's design when it holds an advisory
    lock: neither a timeout nor terminate is advised; a holder of a relation lock only may
    be given the timeout."""
    advisory_holder = diagnose(
        [idle_in_transaction(10, 100.0), active(11)],
        [advisory(10, 1, namespace=PLAIN), waiter(11, 1, 10, 1.0)],
    )
    [step] = [f.next_step for f in findings(advisory_holder) if f.kind is Kind.STUCK_OWNER]
    assert "lockdiag terminate" not in step and "timeout is safe" not in step
    held = relation_wait(10, 0, 0.0)._replace(granted=True, waitstart=None, blocked_by=None)
    relation_holder = Diagnosis(
        snapshot([idle_in_transaction(10, 100.0), active(11)], [held, relation_wait(11, 10, 1.0)]),
        REGISTRY,
    )
    [step] = [f.next_step for f in findings(relation_holder) if f.kind is Kind.STUCK_OWNER]
    assert "idle_in_transaction_session_timeout is safe" in step


def test_waits_past_one_not_judged_are_still_judged() -> None:
    """A wait with no wait start, and one within its namespace's max_wait, come first in
    pg_locks' order: the long wait after them is still found."""
    locks = [
        advisory(10, 1, namespace=QUICK),
        waiter(11, 1, 10, 5.0, QUICK),
        advisory(12, 1, namespace=PLAIN),
        waiter(13, 1, 12, 0.0)._replace(waitstart=None),
        advisory(12, 2, namespace=PLAIN),
        waiter(14, 2, 12, 40.0),
    ]
    sessions = [active(pid) for pid in (10, 11, 12, 13, 14)]
    found = {(f.kind, f.pid) for f in findings(diagnose(sessions, locks))}
    assert found == {(Kind.LONG_WAIT, 14)}


def test_a_waiter_with_no_wait_start_is_no_long_wait_of_a_crowd() -> None:
    """Six sessions behind pid 10 with no wait start: not six long waits, even at a
    --wait-age below a second."""
    locks = [advisory(10, 1, namespace=PLAIN)] + [
        waiter(pid, 1, 10, 0.0)._replace(waitstart=None) for pid in range(11, 17)
    ]
    policy = CheckPolicy(wait_age=Threshold(0.5, 3000), max_blocked=Threshold(5, 20))
    shot = diagnose([active(pid) for pid in range(10, 17)], locks)
    assert [f.kind for f in findings(shot, policy)] == []


# -- what a transaction's start proves --------------------------------------------------------


@pytest.mark.parametrize(
    ("began", "xact_start", "expected"),
    [
        pytest.param(-20, -10, True, id="waited before the transaction began"),
        pytest.param(-10, -10, False, id="waited since the transaction began"),
        pytest.param(-5, -10, False, id="waited after the transaction began"),
        pytest.param(-20, 0, False, id="a transaction that began at the read"),
        pytest.param(None, -10, False, id="no wait start"),
        pytest.param(-20, None, False, id="no transaction"),
    ],
)
def test_a_lock_older_than_its_transaction(
    began: int | None, xact_start: int | None, expected: bool
) -> None:

    def at(seconds: int | None) -> datetime | None:
        return None if seconds is None else STARTED + timedelta(seconds=seconds)

    holder = replace(idle_in_transaction(10, 1.0), xact_start=at(xact_start))
    assert older_than_transaction(holder, at(began), STARTED) is expected
    assert older_than_transaction(None, at(began), STARTED) is False


# -- lock queues and the order of a lock's rows --------------------------------------------------


def test_lock_queues_longest_first_and_none_behind_two_heads() -> None:
    """Heads 21 (two queued behind it), 41 and 11 (one each, 41's waited longer); 33 is queued
    behind both 31 and 32: cancelling one would not free it, so neither heads a queue."""
    locks = [
        advisory(10, 1, namespace=PLAIN),
        waiter(11, 1, 10, 1.0),
        waiter(12, 1, 11, 35.0),
        advisory(20, 2, namespace=PLAIN),
        waiter(21, 2, 20, 1.0),
        waiter(22, 2, 21, 5.0),
        waiter(23, 2, 21, 6.0),
        advisory(30, 3, namespace=PLAIN),
        waiter(31, 3, 30, 1.0),
        waiter(32, 3, 30, 1.0),
        advisory(33, 3, False, (31, 32), namespace=PLAIN, waited=1.0),
        advisory(40, 4, namespace=PLAIN),
        waiter(41, 4, 40, 1.0),
        waiter(42, 4, 41, 50.0),
    ]
    pids = (10, 11, 12, 20, 21, 22, 23, 30, 31, 32, 33, 40, 41, 42)
    graph = diagnose([active(pid) for pid in pids], locks).graph
    assert [(q.waiter, q.holders, q.queued, q.longest_wait) for q in graph.queues()] == [
        (21, (20,), (23, 22), 6.0),  # in queue order: 23 has waited longer
        (41, (40,), (42,), 50.0),
        (11, (10,), (12,), 35.0),
    ]


def test_a_lock_s_holders_by_pid_then_its_waiters_by_wait_start() -> None:
    """Holders first (by pid), then waiters, the longest waiting first (by pid on a tie), one
    with no wait start last."""
    shared = [advisory(pid, 1, namespace=PLAIN)._replace(mode="ShareLock") for pid in (16, 15)]
    locks = [
        *shared,
        waiter(13, 1, 15, 5.0),
        waiter(11, 1, 15, 0.0)._replace(waitstart=None),
        waiter(14, 1, 15, 9.0),
        waiter(12, 1, 15, 9.0),
    ]
    entries = diagnose([active(pid) for pid in range(11, 17)], locks).advisory
    assert [e.lock.pid for e in entries] == [15, 16, 12, 14, 13, 11]


# -- pg_repack waiting for older transactions ----------------------------------------------------

REPACK_PREFIX, REPACK_TABLE = 16185446, 2147500068  # pg_repack's lock on the table of OID 16420


def repacking(query: str = "SELECT repack.repack_apply($1)") -> list[Session]:
    """pg_repack (pid 50, its second connection 51 in a transaction opened 100s ago) and the
    transactions around it: 60 (opened 200s ago), 64 (120s), 61 a vacuum, 62 opened after it,
    63 in another database."""

    def opened(pid: int, seconds: float, app: str = "shop", **more: str) -> Session:
        start = STARTED - timedelta(seconds=seconds)
        return replace(active(pid), application_name=app, xact_start=start, **more)  # type: ignore[arg-type]

    return [
        replace(opened(50, 60, "pg_repack"), query=query),
        opened(51, 100, "pg_repack"),
        opened(60, 200),
        opened(61, 150, query="VACUUM orders"),
        opened(62, 50),
        opened(63, 300, database="other"),
        opened(64, 120),
    ]


@pytest.mark.parametrize(
    ("sessions", "wait_age", "expected"),
    [
        pytest.param(repacking(), 100.0, [(50, "warning", 100.0, 60)], id="at it 100s"),
        pytest.param(repacking(), 100.001, [], id="below --wait-age"),
        pytest.param(repacking("SELECT 1"), 30.0, [], id="not polling"),
        pytest.param([s for s in repacking() if s.pid not in (60, 64)], 30.0, [],
                     id="no older transaction"),
    ],
)  # fmt: skip
def test_pg_repack_waiting_for_older_transactions(
    sessions: list[Session], wait_age: float, expected: list[tuple[int, str, float, int]]
) -> None:
    locks = [advisory(50, REPACK_TABLE, namespace=REPACK_PREFIX)]
    policy = CheckPolicy(wait_age=Threshold(wait_age, 3000))
    stalled = [f for f in findings(diagnose(sessions, locks), policy) if f.kind is Kind.STALLED]
    assert [(f.pid, f.severity, f.value) for f in stalled] == [e[:3] for e in expected]
    for finding, (*_, oldest) in zip(stalled, expected, strict=True):
        assert f"pid {oldest}'s transaction" in finding.next_step  # the oldest is named
        assert "at least 2 opened" in finding.evidence  # 60 and 64; not the vacuum, 62 or 63
