"""Every documented rule of the analysis pinned at its edge, on snapshots built by hand: each
threshold of `check`, each namespace limit of the registry, each filter and each flag of
`list`, just below, at and just above the edge. Results are compared whole (flags, findings'
kinds and severities, the pids kept), never as text; ages come from the snapshot's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lockdiag.core.analysis import DEFAULT_POLICY, Filters, Flag, Policy
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, Kind, Threshold
from lockdiag.core.model import LockRow, PoolLink, Session
from lockdiag.registry import Registry, Unregistered
from lockdiag.views.columns import ListRow
from lockdiag.views.listing import by_urgency, fold

from helpers.registry import parsed_registry
from helpers.snapshots import active, advisory, idle, idle_in_transaction, session, snapshot

REGISTRY: Registry = parsed_registry(
    """\
[namespaces.plain]
id = 7

[namespaces.leader]
id = 1
expect = "session"

[namespaces.xact]
id = 4102
expect = "xact"

[namespaces.quick]
id = 5
max_hold = "1m"
max_wait = "10s"

[namespaces.patient]
id = 6
max_hold = "1h"
max_wait = "10m"
"""
)
PLAIN, LEADER, XACT, QUICK, PATIENT, UNREGISTERED = 7, 1, 4102, 5, 6, 77
MS = 0.001  # "just below" and "just above" an edge: a millisecond off it

Found = set[tuple[Kind, str, int | None]]


def flags(
    sessions: list[Session], locks: list[LockRow], policy: Policy = DEFAULT_POLICY
) -> set[Flag]:
    """The flags of the first lock."""
    return set(Diagnosis(snapshot(sessions, locks), REGISTRY, policy).advisory[0].flags)


def found(sessions: list[Session], locks: list[LockRow], policy: CheckPolicy) -> Found:
    diagnosis = Diagnosis(snapshot(sessions, locks), REGISTRY, policy.analysis_policy())
    return {(f.kind, f.severity, f.pid) for f in diagnosis.findings(policy).findings}


def held_by_a_waited_holder(waited: float, namespace: int = PLAIN) -> list[LockRow]:
    """pid 10 holds the lock, pid 11 has waited ``waited`` seconds for it."""
    return [
        advisory(10, 1, namespace=namespace),
        advisory(11, 1, granted=False, blocked_by=(10,), namespace=namespace, waited=waited),
    ]


# -- check's thresholds: at the level is at the level (>=), for warning and critical ------------


def at_levels(name: str, warning: float, critical: float) -> list[object]:
    """Just below, at and just above each level of a WARN,CRIT threshold, and the severity."""
    cases = [(warning - MS, None), (warning, "warning"), (warning + MS, "warning"),
             (critical - MS, "warning"), (critical, "critical"),
             (critical + MS, "critical")]  # fmt: skip
    return [pytest.param(value, severity, id=f"{name}={warning:g}s,{critical:g}s, {value:.3f}s")
            for value, severity in cases]  # fmt: skip


@pytest.mark.parametrize(("held", "severity"), at_levels("session-age", 300, 3600))
def test_session_age(held: float, severity: str | None) -> None:
    policy = CheckPolicy(session_age=Threshold(300, 3600))
    expected = {(Kind.SESSION_LOCK, severity, 10)} if severity else set()
    assert found([idle(10, held)], [advisory(10, 1, namespace=PLAIN)], policy) == expected


@pytest.mark.parametrize(("waited", "severity"), at_levels("wait-age", 30, 300))
def test_wait_age(waited: float, severity: str | None) -> None:
    policy = CheckPolicy(wait_age=Threshold(30, 300))
    expected = {(Kind.LONG_WAIT, severity, 11)} if severity else set()
    assert found([active(10), active(11)], held_by_a_waited_holder(waited), policy) == expected


@pytest.mark.parametrize(("idle_for", "severity"), at_levels("idle-age", 60, 600))
def test_idle_age(idle_for: float, severity: str | None) -> None:
    policy = CheckPolicy(idle_age=Threshold(60, 600))
    sessions = [idle_in_transaction(10, idle_for), active(11)]
    expected = {(Kind.STUCK_OWNER, severity, 10)} if severity else set()
    assert found(sessions, held_by_a_waited_holder(0.0), policy) == expected


def crowd(behind: int, waited: float) -> tuple[list[Session], list[LockRow]]:
    """An active holder, pid 10, and ``behind`` sessions that have each waited ``waited``."""
    waiters = range(11, 11 + behind)
    locks = [advisory(10, 1, namespace=PLAIN)] + [
        advisory(pid, 1, granted=False, blocked_by=(10,), namespace=PLAIN, waited=waited)
        for pid in waiters
    ]
    return [active(10), *map(active, waiters)], locks


@pytest.mark.parametrize(
    ("behind", "waited", "severity"),
    [
        pytest.param(5, 30.0, None, id="max-blocked=5,20, 5 behind: not more than 5"),
        pytest.param(6, 30.0, "warning", id="max-blocked=5,20, 6 behind"),
        pytest.param(20, 30.0, "warning", id="max-blocked=5,20, 20 behind: not more than 20"),
        pytest.param(21, 30.0, "critical", id="max-blocked=5,20, 21 behind"),
        pytest.param(6, 30.0 - MS, None, id="max-blocked=5, 6 behind, waited 29.999s"),
        pytest.param(6, 30.0 + MS, "warning", id="max-blocked=5, 6 behind, waited 30.001s"),
    ],
)  # fmt: skip
def test_max_blocked(behind: int, waited: float, severity: str | None) -> None:
    """More than N sessions behind one root, each having waited --wait-age's warning level."""
    policy = CheckPolicy(wait_age=Threshold(30, 3000), max_blocked=Threshold(5, 20))
    crowded = {
        (f.severity, f.pid, f.value)
        for f in Diagnosis(snapshot(*crowd(behind, waited)), REGISTRY).findings(policy).findings
        if f.kind is Kind.BLOCKED_MANY
    }
    assert crowded == ({(severity, 10, float(behind))} if severity else set())


def test_max_blocked_counts_only_the_long_waits() -> None:
    sessions, locks = crowd(6, 30.0)
    locks[-1] = advisory(16, 1, granted=False, blocked_by=(10,), namespace=PLAIN, waited=29.0)
    policy = CheckPolicy(wait_age=Threshold(30, 3000), max_blocked=Threshold(5, 20))
    report = Diagnosis(snapshot(sessions, locks), REGISTRY).findings(policy)
    assert {f.kind for f in report.findings} == {Kind.LONG_WAIT}  # 5 long waits: not more than 5


# -- the registry's own limits: exceeded (longer than: >), for max_hold and max_wait ------------


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        pytest.param(60 - MS, set(), id="max_hold=1m, held 59.999s"),
        pytest.param(60.0, set(), id="max_hold=1m, held 60s: not longer"),
        pytest.param(60 + MS, {Flag.MAX_HOLD}, id="max_hold=1m, held 60.001s"),
    ],
)
def test_max_hold_flag(held: float, expected: set[Flag]) -> None:
    assert flags([idle(10, held)], [advisory(10, 1, namespace=QUICK)]) == expected


@pytest.mark.parametrize(
    ("namespace", "held", "expected"),
    [
        pytest.param(QUICK, 60 + MS, {(Kind.MAX_HOLD, "critical", 10)},
                     id="max_hold=1m below session-age=5m, held 60.001s: max-hold alone"),
        pytest.param(QUICK, 300.0, {(Kind.MAX_HOLD, "critical", 10),
                                    (Kind.SESSION_LOCK, "warning", 10)},
                     id="max_hold=1m, held 300s: max-hold and session-age both"),
        pytest.param(PATIENT, 300.0, {(Kind.SESSION_LOCK, "warning", 10)},
                     id="max_hold=1h above session-age=5m, held 300s: session-age still"),
        pytest.param(PATIENT, 3600.0, {(Kind.SESSION_LOCK, "critical", 10)},
                     id="max_hold=1h, held 3600s: not longer"),
        pytest.param(PATIENT, 3600 + MS, {(Kind.MAX_HOLD, "critical", 10),
                                          (Kind.SESSION_LOCK, "critical", 10)},
                     id="max_hold=1h, held 3600.001s"),
    ],
)  # fmt: skip
def test_max_hold_adds_to_session_age(namespace: int, held: float, expected: Found) -> None:
    """A namespace's max_hold is a critical limit of its own: --session-age still applies."""
    locks = [advisory(10, 1, namespace=namespace)]
    assert found([idle(10, held)], locks, CheckPolicy()) == expected


def test_max_hold_bounds_an_idle_transaction_too() -> None:
    """The lower bound of an idle transaction's lock counts: it is no certain session lock,
    so only max-hold fires."""
    sessions = [idle_in_transaction(10, 60 + MS)]
    assert flags(sessions, [advisory(10, 1, namespace=QUICK)]) == {Flag.MAX_HOLD}
    assert found(sessions, [advisory(10, 1, namespace=QUICK)], CheckPolicy()) == {
        (Kind.MAX_HOLD, "critical", 10)
    }


@pytest.mark.parametrize(
    ("namespace", "waited", "expected"),
    [
        pytest.param(QUICK, 10 - MS, set(), id="max_wait=10s below wait-age=30s, waited 9.999s"),
        pytest.param(QUICK, 10.0, set(), id="max_wait=10s, waited 10s: not longer"),
        pytest.param(QUICK, 10 + MS, {(Kind.MAX_WAIT, "critical", 11)},
                     id="max_wait=10s, waited 10.001s"),
        pytest.param(QUICK, 300.0, {(Kind.MAX_WAIT, "critical", 11)},
                     id="max_wait=10s, waited 300s: max-wait, no long-wait"),
        pytest.param(PATIENT, 30.0, set(),
                     id="max_wait=10m above wait-age=30s, waited 30s: no long-wait"),
        pytest.param(PATIENT, 600 - MS, set(),
                     id="max_wait=10m above wait-age=5m critical, waited 599.999s"),
        pytest.param(PATIENT, 600.0, set(), id="max_wait=10m, waited 600s: not longer"),
        pytest.param(PATIENT, 600 + MS, {(Kind.MAX_WAIT, "critical", 11)},
                     id="max_wait=10m, waited 600.001s"),
        pytest.param(PLAIN, 30.0, {(Kind.LONG_WAIT, "warning", 11)},
                     id="no max_wait, waited 30s: wait-age"),
    ],
)  # fmt: skip
def test_max_wait_replaces_wait_age(namespace: int, waited: float, expected: Found) -> None:
    """A namespace's max_wait is its waiters' only limit, below or above --wait-age."""
    sessions, locks = [active(10), active(11)], held_by_a_waited_holder(waited, namespace)
    assert found(sessions, locks, CheckPolicy()) == expected


# -- list's flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "namespace", "expected"),
    [
        pytest.param(300 - MS, PLAIN, set(), id="session-age=5m, held 299.999s"),
        pytest.param(300.0, PLAIN, {Flag.LONG_SESSION_LOCK}, id="session-age=5m, held 300s"),
        pytest.param(300 + MS, PLAIN, {Flag.LONG_SESSION_LOCK}, id="session-age=5m, held 300.001s"),
        pytest.param(86400.0, LEADER, set(), id='expect="session", held 1d: never flagged'),
        pytest.param(1.0, XACT, {Flag.EXPECT_XACT}, id='expect="xact", a certain session lock'),
        pytest.param(300.0, XACT, {Flag.EXPECT_XACT, Flag.LONG_SESSION_LOCK},
                     id='expect="xact", held 300s'),
        pytest.param(1.0, UNREGISTERED, {Flag.UNREGISTERED}, id="a key of no namespace"),
        pytest.param(300.0, UNREGISTERED, {Flag.UNREGISTERED, Flag.LONG_SESSION_LOCK},
                     id="a key of no namespace, held 300s"),
    ],
)  # fmt: skip
def test_flags_of_a_certain_session_lock(held: float, namespace: int, expected: set[Flag]) -> None:
    locks = [advisory(10, 1, namespace=namespace)]
    assert flags([idle(10, held)], locks, Policy(session_age=300)) == expected


@pytest.mark.parametrize(
    ("holder", "expected"),
    [
        pytest.param(session(10, "idle", -timedelta(hours=1), in_transaction=True), set(),
                     id="idle with a transaction open: lifetime unknown"),
        pytest.param(session(10, "active", -timedelta(hours=1)), set(), id="active"),
        pytest.param(session(10, "idle", timedelta(milliseconds=1)), set(),
                     id="idle only since the snapshot started"),
    ],
)  # fmt: skip
def test_no_session_flag_without_certainty(holder: Session, expected: set[Flag]) -> None:
    assert flags([holder], [advisory(10, 1, namespace=XACT)], Policy(session_age=0)) == expected


@pytest.mark.parametrize(
    ("holder", "waiter", "expected"),
    [
        pytest.param(idle_in_transaction(10, 1.0), True, {Flag.STUCK_OWNER},
                     id="idle in transaction, one waiting"),
        pytest.param(session(10, "idle in transaction (aborted)", -timedelta(seconds=1),
                             in_transaction=True), True, {Flag.STUCK_OWNER},
                     id="idle in transaction (aborted), one waiting"),
        pytest.param(idle_in_transaction(10, 1.0), False, set(),
                     id="idle in transaction, nobody waiting"),
        pytest.param(active(10), True, set(), id="active, one waiting"),
        pytest.param(idle(10, 1.0), True, set(), id="idle outside a transaction, one waiting"),
    ],
)  # fmt: skip
def test_stuck_owner_flag(holder: Session, waiter: bool, expected: set[Flag]) -> None:
    locks = held_by_a_waited_holder(0.0)[: 2 if waiter else 1]
    assert flags([holder, active(11)], locks) == expected


def test_a_waiter_has_no_lifetime_flags() -> None:
    entries = Diagnosis(snapshot([active(10), idle(11, 9999)], held_by_a_waited_holder(1.0,
                        UNREGISTERED)), REGISTRY, Policy(session_age=0)).advisory  # fmt: skip
    assert [(e.lock.pid, set(e.flags)) for e in entries] == [
        (10, {Flag.UNREGISTERED}),
        (11, {Flag.UNREGISTERED}),
    ]


def pooled(via: str, client: str | None, mode: str = "transaction") -> PoolLink:
    return PoolLink("127.0.0.1:6432", "app/worker", mode, "idle", client, None, via)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        pytest.param(pooled("console", None), {Flag.OUTLIVED_CLIENT}, id="console, no client"),
        # transaction pooling lends the connection: the session lock outlived the transaction
        # that took it, whichever client borrows the connection now
        pytest.param(
            pooled("console", "10.0.0.1:5000"),
            {Flag.OUTLIVED_CLIENT},
            id="console, a client attached, transaction pooling",
        ),
        # session pooling: the attached client owns the connection, and may hold the lock
        pytest.param(
            pooled("console", "10.0.0.1:5000", "session"),
            set(),
            id="console, a client attached, session pooling",
        ),
        pytest.param(pooled("address", None), {Flag.POOLED_SESSION_LOCK}, id="address only"),
    ],
)
def test_pool_flags(link: PoolLink, expected: set[Flag]) -> None:
    shot = snapshot([idle(10, 1.0)], [advisory(10, 1, namespace=PLAIN)], pool={10: link})
    assert set(Diagnosis(shot, REGISTRY).advisory[0].flags) == expected


@pytest.mark.parametrize(
    ("waiting", "severity"),
    [pytest.param(False, "warning", id="nobody waiting: warning"),
     pytest.param(True, "critical", id="one waiting: critical")],
)  # fmt: skip
def test_outlived_client_finding(waiting: bool, severity: str) -> None:
    locks = held_by_a_waited_holder(0.0)[: 2 if waiting else 1]
    shot = snapshot([idle(10, 1.0), active(11)], locks, pool={10: pooled("console", None)})
    report = Diagnosis(shot, REGISTRY).findings(CheckPolicy())
    assert {(f.kind, f.severity, f.pid) for f in report.findings} == {
        (Kind.OUTLIVED_CLIENT, severity, 10)
    }


@pytest.mark.parametrize(
    ("unregistered", "expected"),
    [pytest.param("report", {(Kind.UNREGISTERED, "info", 10)}, id="reported, not paging"),
     pytest.param("warn", {(Kind.UNREGISTERED, "warning", 10)}, id="--unregistered warn"),
     pytest.param("ignore", set(), id="--unregistered ignore")],
)  # fmt: skip
def test_unregistered_finding(unregistered: Unregistered, expected: Found) -> None:
    policy = CheckPolicy(unregistered=unregistered)
    assert found([idle(10, 1.0)], [advisory(10, 1, namespace=UNREGISTERED)], policy) == expected


def test_expect_violated_finding() -> None:
    assert found([idle(10, 1.0)], [advisory(10, 1, namespace=XACT)], CheckPolicy()) == {
        (Kind.EXPECT_VIOLATED, "warning", 10)
    }


# -- list's filters -------------------------------------------------------------------------------


def scene() -> list[tuple[Session, LockRow]]:
    """Five backends: 10 and 11 in tenant namespaces, 12 waits for 10, 13 unregistered, 14
    active."""
    return [
        (idle(10, 300.0, "billing-worker"), advisory(10, 1, namespace=XACT)),
        (idle(11, 300 - MS, "Billing-worker"), advisory(11, 2, namespace=XACT)),
        (active(12, "billing"), advisory(12, 1, False, (10,), namespace=XACT, waited=300.0)),
        (idle(13, 300 + MS, "report"), advisory(13, 3, namespace=UNREGISTERED)),
        (active(14, "billing-worker-2"), advisory(14, 4, namespace=PLAIN)),
    ]


def kept(filters: Filters) -> set[int | None]:
    pairs = scene()
    shot = snapshot([s for s, _ in pairs], [lock for _, lock in pairs])
    return {e.lock.pid for e in Diagnosis(shot, REGISTRY).listing(filters).entries}


@pytest.mark.parametrize(
    ("filters", "pids"),
    [
        pytest.param(Filters(), {10, 12, 11, 13, 14}, id="no filter"),
        pytest.param(Filters(namespace=REGISTRY.namespaces["xact"]), {10, 12, 11},
                     id="--namespace xact"),
        pytest.param(Filters(namespace=REGISTRY.namespaces["plain"]), {14}, id="--namespace plain"),
        pytest.param(Filters(pids=frozenset({11, 13})), {11, 13}, id="--pid 11 --pid 13"),
        pytest.param(Filters(pids=frozenset({99})), set(), id="--pid 99: none"),
        pytest.param(Filters(app="billing-*"), {10, 14}, id="--app billing-*: case-sensitive"),
        pytest.param(Filters(app="billing"), {12}, id="--app billing: the whole name"),
        pytest.param(Filters(app="*"), {10, 12, 11, 13, 14}, id="--app *"),
        pytest.param(Filters(waiting=True), {10, 12}, id="--waiting: the waiter and its holder"),
        pytest.param(Filters(min_age=300.0), {10, 12, 13},
                     id="--min-age 5m: held 300s, waited 300s, held 300.001s; not 299.999s"),
        pytest.param(Filters(min_age=300 + MS), {13}, id="--min-age 300.001s"),
        pytest.param(Filters(min_age=0.0), {10, 12, 11, 13},
                     id="--min-age 0s: not an active holder (no age)"),
        pytest.param(Filters(app="billing*", waiting=True), {10, 12}, id="--app and --waiting"),
        pytest.param(Filters(pids=frozenset({10, 11}), min_age=300.0), {10},
                     id="--pid and --min-age"),
    ],
)  # fmt: skip
def test_filters(filters: Filters, pids: set[int]) -> None:
    assert kept(filters) == pids


def test_an_app_filter_drops_a_session_with_no_name() -> None:
    shot = snapshot([], [advisory(10, 1, namespace=PLAIN)])
    assert Diagnosis(shot, REGISTRY).listing(Filters(app="*")).entries == []


def test_the_waiting_filter_keeps_a_waiter_with_no_holder_in_the_snapshot() -> None:
    waiter = advisory(12, 1, False, (10,), namespace=PLAIN, waited=1.0)
    shot = snapshot([active(12)], [waiter])
    assert [
        e.lock.pid for e in Diagnosis(shot, REGISTRY).listing(Filters(waiting=True)).entries
    ] == [12]


# -- list's folds: three or more uncontested locks of one session and namespace -------------------


@pytest.mark.parametrize(
    ("locks", "labels"),
    [
        pytest.param(2, {}, id="2 locks: not folded"),
        pytest.param(3, {0: "3 x plain 1..3", 1: "", 2: ""}, id="3 locks: folded"),
    ],
)
def test_fold_at_three(locks: int, labels: dict[int, str]) -> None:
    shot = snapshot(
        [idle(10, 1.0)], [advisory(10, n, namespace=PLAIN) for n in range(1, locks + 1)]
    )
    report = Diagnosis(shot, REGISTRY).listing()
    rows = [ListRow(None, e, shot.server) for e in report.entries]
    assert fold(rows) == labels


# -- what each finding counts: one per backend (and namespace), its locks, its value -----------


def test_the_check_threshold_decides_whatever_the_analysis_flagged() -> None:
    """Entries analysed with --session-age 0 (as `list` may) are judged by check's own level."""
    sessions = [idle(10, 1.0), idle(11, 300.0)]
    locks = [advisory(10, 1, namespace=PLAIN), advisory(11, 2, namespace=PLAIN)]
    diagnosis = Diagnosis(snapshot(sessions, locks), REGISTRY, Policy(session_age=0))
    report = diagnosis.findings(CheckPolicy())
    assert {(f.kind, f.severity, f.pid) for f in report.findings} == {
        (Kind.SESSION_LOCK, "warning", 11)
    }


def test_a_backend_is_one_finding_per_kind_and_namespace() -> None:
    locks = [
        *(advisory(10, n, namespace=QUICK) for n in (1, 2, 3)),
        *(advisory(10, n, namespace=PATIENT) for n in (1, 2)),
        *(advisory(10, n, namespace=XACT) for n in (1, 2)),
    ]
    shot = snapshot([idle(10, 3700.0)], locks)
    report = Diagnosis(shot, REGISTRY).findings(CheckPolicy())
    assert {(f.kind, f.severity, f.pid, f.locks, f.value) for f in report.findings} == {
        (Kind.SESSION_LOCK, "critical", 10, 7, 3700.0),
        (Kind.MAX_HOLD, "critical", 10, 3, 3700.0),  # quick's max_hold, 1m
        (Kind.MAX_HOLD, "critical", 10, 2, 3700.0),  # patient's max_hold, 1h
        (Kind.EXPECT_VIOLATED, "warning", 10, 2, 3700.0),
    }


def test_an_outlived_client_counts_its_locks_and_their_age() -> None:
    locks = [advisory(10, 1, namespace=PLAIN), advisory(10, 2, namespace=PLAIN)]
    shot = snapshot([idle(10, 42.0)], locks, pool={10: pooled("console", None)})
    report = Diagnosis(shot, REGISTRY).findings(CheckPolicy())
    assert [(f.kind, f.severity, f.pid, f.locks, f.value) for f in report.findings] == [
        (Kind.OUTLIVED_CLIENT, "warning", 10, 2, 42.0)
    ]


def test_waits_and_stuck_owners_carry_their_durations() -> None:
    sessions = [idle_in_transaction(10, 700.0), active(11), active(12)]
    locks = [
        advisory(10, 1, namespace=PLAIN),
        advisory(11, 1, granted=False, blocked_by=(10,), namespace=PLAIN, waited=40.0),
        advisory(12, 1, granted=False, blocked_by=(10, 11), namespace=PLAIN, waited=20.0),
    ]
    report = Diagnosis(snapshot(sessions, locks), REGISTRY).findings(CheckPolicy())
    assert {(f.kind, f.severity, f.pid, f.value, f.root) for f in report.findings} == {
        (Kind.STUCK_OWNER, "critical", 10, 700.0, None),
        (Kind.LONG_WAIT, "warning", 11, 40.0, 10),
    }


def test_list_puts_the_worst_chain_first_then_other_waits_then_flags() -> None:
    """On a terminal: each root's chain (the root with most waiters first), then flagged
    locks, then the rest; pg_locks order within each."""
    sessions = [active(pid) for pid in (10, 11, 20, 21, 22, 40)] + [idle(30, 1.0)]
    locks = [
        advisory(10, 1, namespace=PLAIN),
        advisory(11, 1, granted=False, blocked_by=(10,), namespace=PLAIN, waited=90.0),
        advisory(20, 2, namespace=PLAIN),
        advisory(21, 2, granted=False, blocked_by=(20,), namespace=PLAIN, waited=50.0),
        advisory(22, 2, granted=False, blocked_by=(20,), namespace=PLAIN, waited=40.0),
        advisory(40, 4, namespace=PLAIN),
        advisory(30, 3, namespace=UNREGISTERED),
    ]
    shot = snapshot(sessions, locks)
    report = Diagnosis(shot, REGISTRY).listing()
    rows = [ListRow(None, e, shot.server) for e in report.entries]
    ordered = by_urgency(rows, {None: report.roots()})
    assert [row.entry.lock.pid for row in ordered] == [20, 21, 22, 10, 11, 30, 40]


def test_max_blocked_judges_each_root_apart() -> None:
    """A root with more, but short, waits (ranked first) does not hide a crowded one."""
    sessions, locks = crowd(6, 30.0)
    short = range(31, 38)
    quiet = [advisory(30, 0, namespace=PLAIN)] + [
        advisory(pid, 0, granted=False, blocked_by=(30,), namespace=PLAIN, waited=1.0)
        for pid in short
    ]
    policy = CheckPolicy(wait_age=Threshold(30, 3000), max_blocked=Threshold(5, 20))
    shot = snapshot([*sessions, active(30), *map(active, short)], quiet + locks)
    report = Diagnosis(shot, REGISTRY).findings(policy)
    assert {(f.severity, f.pid) for f in report.findings if f.kind is Kind.BLOCKED_MANY} == {
        ("warning", 10)
    }


def test_a_declared_leader_still_outlives_its_client_through_a_pooler() -> None:
    """expect = "session" (the declaration a healthy leader's next step gives) silences the
    session age only: a session lock of that namespace left on a pooler's server connection
    with no client attached is still outlived-client, and nothing else is flagged."""
    shot = snapshot(
        [idle(10, 86400.0)], [advisory(10, 1, namespace=LEADER)], pool={10: pooled("console", None)}
    )
    assert set(Diagnosis(shot, REGISTRY).advisory[0].flags) == {Flag.OUTLIVED_CLIENT}
