"""The incident: what one snapshot says is wrong, ranked once, for every view.

*Causes* are the root blockers of the wait-for graph, and each backend a finding is about that
nobody waits for (a lock that outlived its client, an old session lock). Each cause leads with
its *contended* locks — the ones others wait for, by queue length, then the longest wait — so
it is named by the lock that matters, never by its first lock in sort order. Its *impact* is
the sessions it holds up (in all and directly) and the longest of their waits; its severity is
at least the worst of the waits it causes; its *symptoms* are the wait findings of its chains
(and any finding about a session inside its chain). One order — sessions held up, then
whether it ends by itself (a lock whose client is gone, an idle holder, before a query at
work), then the longest wait, severity and age — and one count serve `check`, `list`,
`blockers`, `watch`, `who-holds`, `sample` and the exporter's page, so no two of them can
disagree about what comes first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lockdiag.core.analysis import LockEntry
from lockdiag.core.findings import (
    CAUSES,
    WAITS,
    CheckReport,
    Finding,
    Kind,
    Severity,
    locks_in,
)
from lockdiag.core.graph import Root
from lockdiag.core.model import IDLE_STATES, ServerInfo, Session, describe_lock
from lockdiag.core.ownership import Ownership
from lockdiag.durations import format_duration

Status = Literal["OK", "WARNING", "CRITICAL"]
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2, None: 3}
OWN_IDS = frozenset({"virtualxid", "transactionid"})  # every transaction holds its own


@dataclass(frozen=True)
class Contended:
    """A lock that others wait for, with its queue."""

    entry: LockEntry  # the holder's granted lock
    label: str
    queue: int  # sessions waiting for it directly
    longest_wait: float | None  # the longest of their waits


@dataclass(frozen=True)
class Cause:
    pid: int | None
    session: Session | None
    label: str  # the lock that names it: its most contended, else its headline finding's
    entry: LockEntry | None  # that lock's entry
    contended: tuple[Contended, ...]  # most waited-for first
    locks: int  # every lock the backend holds (the real count, for folds and headings)
    kind: Kind | None  # its headline finding's kind; None for a root no finding is about
    severity: Severity | None  # the worst of its findings and of the waits it causes
    findings: tuple[Finding, ...]  # about this backend, headline first
    symptoms: tuple[Finding, ...]  # the waits it causes (and findings inside its chains)
    blocked: int  # sessions held up by it, directly or through others
    blocked_directly: int
    longest_wait: float | None  # the longest wait of the sessions it holds up
    age: float | None  # how long it has held its lock (a lower bound), where known
    root: Root | None  # its place in the wait-for graph, for a root blocker

    @property
    def kind_name(self) -> str:
        """Its headline finding's kind, or ``root-blocker`` for a root no finding is about."""
        return self.kind.value if self.kind is not None else "root-blocker"

    @property
    def evidence(self) -> str:
        return self.findings[0].evidence if self.findings else self.impact

    @property
    def impact(self) -> str:
        """``blocks 4 sessions (3 directly), longest wait 7m28s``; "" when it blocks none."""
        if not self.blocked:
            return ""
        longest = (
            f", longest wait {format_duration(self.longest_wait)}"
            if self.longest_wait is not None
            else ""
        )
        return f"blocks {self.blocked} session(s) ({self.blocked_directly} directly){longest}"

    @property
    def owner(self) -> Ownership | None:
        """The evidence that its owner's work is over, where a finding about a held lock
        weighed it (see core.ownership)."""
        return next((f.owner for f in self.findings if f.owner is not None), None)

    @property
    def next_step(self) -> str:
        if self.findings:
            return self.findings[0].next_step
        return "see the chain: lockdiag blockers"

    @property
    def alerts(self) -> bool:
        """Whether `check` reports it: a finding is about it or about the waits it causes."""
        return self.severity is not None


@dataclass(frozen=True)
class Incident:
    report: CheckReport
    causes: tuple[Cause, ...]  # the one order
    unattached: tuple[Finding, ...]  # waits no root accounts for (a deadlock not yet broken)

    @property
    def alerting(self) -> tuple[Cause, ...]:
        """The causes `check` reports, in the same order."""
        return tuple(c for c in self.causes if c.alerts)

    @property
    def status(self) -> Status:
        return self.report.status  # every finding is a cause's, a symptom or unattached

    @property
    def waiting(self) -> int:
        """Sessions waiting for a lock (each once, however many locks it waits for)."""
        return len({e.lock.pid for e in self.report.census.waiters})

    def counts(self) -> tuple[int, int]:
        """(critical, warning) causes: the one count every view prints (info causes, which
        never page, apart: :attr:`info`)."""
        causes = self.alerting
        critical = sum(1 for c in causes if c.severity == "critical")
        return critical, len(causes) - critical - self.info + len(self.unattached)

    @property
    def info(self) -> int:
        """Causes reported that never change the exit code (a key no registry names)."""
        return sum(1 for c in self.alerting if c.severity == "info")

    def summary(self) -> str:
        """``2 critical, 1 warning cause(s); 5 session(s) waiting``, ``no findings``, or
        ``no alerts; 1 info cause(s)`` when only what never pages is reported."""
        critical, warning = self.counts()
        info = f"{self.info} info cause(s)" if self.info else ""
        if not (critical or warning):
            return f"no alerts; {info}" if info else "no findings"
        waiting = f"; {self.waiting} session(s) waiting" if self.waiting else ""
        return f"{critical} critical, {warning} warning cause(s){waiting}" + (
            f"; {info}" if info else ""
        )

    def cause_of(self, pid: int | None) -> Cause | None:
        """The cause a backend is, or whose chain it is in (the first in the one order)."""
        graph = self.report.graph
        for cause in self.causes:
            if cause.pid == pid or (
                cause.root is not None and pid is not None and graph.holds_up(cause.root.pid, pid)
            ):
                return cause
        return None


def incident(report: CheckReport) -> Incident:
    """The causes of one check report (a Diagnosis's), ranked."""
    chain_of = report.graph.owner  # every pid inside a root's chain -> the worst such root
    about: dict[int | None, list[Finding]] = {}  # findings about a backend in no chain
    symptoms: dict[int, list[Finding]] = {}  # findings inside a root's chains
    unattached: list[Finding] = []
    for finding in _flat(report.findings):
        head = chain_of.get(finding.pid) if finding.pid is not None else None
        if head is not None:
            symptoms.setdefault(head, []).append(finding)
        elif finding.kind in WAITS:
            unattached.append(finding)
        else:
            about.setdefault(finding.pid, []).append(finding)
    held: dict[int, list[LockEntry]] = {}
    for entry in report.entries:  # a transaction's own ids count only when someone waits
        if (
            entry.lock.granted
            and entry.lock.pid is not None
            and (entry.blocks or entry.lock.locktype not in OWN_IDS)
        ):
            held.setdefault(entry.lock.pid, []).append(entry)
    waited = {e.lock.pid: e.waited for e in report.census.waiters}
    roots: dict[int | None, Root] = {root.pid: root for root in report.graph.roots}
    causes = [
        _cause(
            report,
            pid,
            roots.get(pid),
            sorted(about.get(pid, []), key=_headline),
            symptoms.get(pid, []) if pid is not None else [],
            held.get(pid, []) if pid is not None else [],
            waited,
        )
        for pid in [*roots, *(p for p in about if p not in roots)]
    ]
    causes.sort(key=_rank)
    # the trees in this order: a session held up by several roots is expanded under the
    # first of them shown, and is a leaf that says so under the others
    ranked = iter(report.graph.ranked([c.root.pid for c in causes if c.root is not None]))
    causes = [replace(c, root=next(ranked)) if c.root is not None else c for c in causes]
    return Incident(report, tuple(causes), tuple(unattached))


def _cause(
    report: CheckReport,
    pid: int | None,
    root: Root | None,
    own: list[Finding],
    caused: list[Finding],
    locks: list[LockEntry],
    waited: dict[int | None, float | None],
) -> Cause:
    server = report.snapshot.server
    contended = sorted(
        (
            Contended(
                e,
                _label(e, server),
                len(e.blocks),
                max((w for b in e.blocks if (w := waited.get(b)) is not None), default=None),
            )
            for e in locks
            if e.blocks
        ),
        key=lambda c: (-c.queue, -(c.longest_wait or 0.0)),
    )
    headline = own[0] if own else None
    entry: LockEntry | None = None
    if contended:
        label, entry = contended[0].label, contended[0].entry
    elif headline is not None and headline.entry is not None:
        label, entry = _label(headline.entry, server), headline.entry
    else:
        label = headline.lock if headline is not None else "?"
    severities = [f.severity for f in (*own, *caused)]
    age = entry.held_at_least if entry is not None else None
    if age is None and headline is not None and headline.lower_bound:
        age = headline.value
    return Cause(
        pid=pid,
        session=report.snapshot.session(pid) if pid is not None else None,
        label=label,
        entry=entry,
        contended=tuple(contended),
        locks=locks_in(locks),
        kind=headline.kind if headline is not None else None,
        severity=min(severities, key=SEVERITY_RANK.__getitem__) if severities else None,
        findings=tuple(own),
        symptoms=tuple(sorted(caused, key=lambda f: -(f.value or 0.0))),
        blocked=root.total if root else 0,
        blocked_directly=root.direct if root else 0,
        longest_wait=root.longest_wait if root else None,
        age=age,
        root=root,
    )


def _flat(findings: list[Finding]) -> list[Finding]:
    """Every finding once: the waits a finding carries (``caused``) are findings too."""
    seen: dict[int, Finding] = {}
    for finding in findings:
        for one in (finding, *finding.caused):
            seen.setdefault(id(one), one)
    return list(seen.values())


def _headline(finding: Finding) -> tuple[int, int, float]:
    """Which finding about a backend says best why others wait (or why it matters)."""
    place = CAUSES.index(finding.kind) if finding.kind in CAUSES else len(CAUSES)
    return (place, SEVERITY_RANK[finding.severity], -(finding.value or 0.0))


def _rank(cause: Cause) -> tuple[int, int, float, int, float, int]:
    """Impact (sessions held up), then whether it ends by itself, then the longest wait, then
    severity, then age."""
    return (
        -cause.blocked,
        _ends_by_itself(cause),
        -(cause.longest_wait or 0.0),
        SEVERITY_RANK[cause.severity],
        -(cause.age or 0.0),
        cause.pid or 0,
    )


def _ends_by_itself(cause: Cause) -> int:
    """0: it will not end on its own (its client is gone, it is idle, or it is a prepared
    transaction); 1: unknown (its state hidden); 2: it is working (a query runs), so it may."""
    owner, session = cause.owner, cause.session
    if (owner is not None and owner.level == "proven") or cause.pid in (None, 0):
        return 0
    if session is None or session.state is None:
        return 1
    return 0 if session.state in IDLE_STATES else 2


def _label(entry: LockEntry, server: ServerInfo) -> str:
    return entry.decoded.label if entry.decoded is not None else describe_lock(entry.lock, server)
