"""check(): every detector over one analysed snapshot, causes before symptoms (by_cause)."""

from __future__ import annotations

from dataclasses import replace

from lockdiag.core.analysis import Flag, LockEntry
from lockdiag.core.findings.holders import outlived_clients, session_locks, stuck_owners
from lockdiag.core.findings.model import CheckReport, Finding, Kind, census
from lockdiag.core.findings.names import namespace_rules, unregistered_keys
from lockdiag.core.findings.stalled import stalled_repacks
from lockdiag.core.findings.waits import crowded_roots, lock_queues, long_waits
from lockdiag.core.graph import Blockers
from lockdiag.core.leaders import contention
from lockdiag.core.model import Snapshot
from lockdiag.core.policy import CheckPolicy

DEFAULTS = CheckPolicy()  # check's thresholds, where none are given


def check(
    snapshot: Snapshot,
    entries: list[LockEntry],
    graph: Blockers,
    notes: list[str],
    policy: CheckPolicy = DEFAULTS,
) -> CheckReport:
    """Findings of one analysed snapshot (a Diagnosis's; use Diagnosis.findings). Its entries
    are analysed with ``policy.analysis_policy()``: the session-lock detector reads the flag."""
    found = census(entries)
    flagged, software = found.flagged, found.software_locks
    standing = contention(snapshot, entries)
    findings = [
        *outlived_clients(flagged[Flag.OUTLIVED_CLIENT], software, snapshot),
        *session_locks(flagged[Flag.LONG_SESSION_LOCK], policy, software, snapshot, standing),
        *long_waits(found.waiters, policy, snapshot.server),
        *stuck_owners(flagged[Flag.STUCK_OWNER], policy, snapshot, software),
        *crowded_roots(graph, policy, snapshot.server),
        *unregistered_keys(flagged[Flag.UNREGISTERED], policy.unregistered),
        *namespace_rules(flagged[Flag.EXPECT_XACT], flagged[Flag.MAX_HOLD]),
        *lock_queues(graph, policy),
        *stalled_repacks(snapshot, found.software, policy),
    ]
    return CheckReport(snapshot, by_cause(findings, graph), entries, graph, found, notes, standing)


WAITS = frozenset({Kind.LONG_WAIT, Kind.MAX_WAIT})
# which finding about a root blocker says best why others wait (it carries their waits)
CAUSES = [
    Kind.STUCK_OWNER,
    Kind.OUTLIVED_CLIENT,
    Kind.SESSION_LOCK,
    Kind.MAX_HOLD,
    Kind.EXPECT_VIOLATED,
    Kind.BLOCKED_MANY,
    Kind.UNREGISTERED,
]


def by_cause(findings: list[Finding], graph: Blockers) -> list[Finding]:
    """Causes before symptoms. Each wait finding learns the root blocker of its chain (the
    worst that holds it up, as in the incident); the
    first finding about that root (its cause: a stuck owner, a leaked lock...) carries the
    waits it causes. Order: the worst severity a finding has or causes, then how many waits
    it causes, then the kind's place and the value."""
    findings = [
        replace(f, root=graph.chain_of(f.pid)) if f.kind in WAITS and f.pid is not None else f
        for f in findings
    ]
    caused: dict[int, list[Finding]] = {}
    for finding in findings:
        if finding.root is not None:
            caused.setdefault(finding.root, []).append(finding)
    order = {"critical": 0, "warning": 1, "info": 2}
    kinds = list(Kind)
    first_cause: dict[int, int] = {}

    def cause_place(pair: tuple[int, Finding]) -> tuple[int, int]:
        kind = pair[1].kind
        return (CAUSES.index(kind) if kind in CAUSES else len(CAUSES), order[pair[1].severity])

    for index, finding in sorted(enumerate(findings), key=cause_place):
        if finding.kind not in WAITS and finding.pid in caused and finding.pid not in first_cause:
            first_cause[finding.pid] = index
    for pid, index in first_cause.items():
        findings[index] = replace(findings[index], caused=tuple(caused[pid]))

    def rank(finding: Finding) -> tuple[int, int, int, float]:
        worst = min(order[f.severity] for f in (finding, *finding.caused))
        return (worst, -len(finding.caused), kinds.index(finding.kind), -(finding.value or 0))

    return sorted(findings, key=rank)
