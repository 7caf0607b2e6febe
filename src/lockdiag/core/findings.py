"""Detectors for `lockdiag check`: what deserves an alert, with evidence and a next step.

Each detector reads one analysed snapshot. Durations are the certain lower bounds of analysis
(an idle holder has held its locks at least since it went idle); nothing is extrapolated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from operator import attrgetter
from typing import Literal

from lockdiag.core.analysis import Flag, LockEntry, Policy, namespace_of
from lockdiag.core.catalogue import Known, collisions, software_of_session
from lockdiag.core.graph import Blockers, Queue, tree_pids
from lockdiag.core.leaders import NO_CONTENTION, Contention, Leader, contention
from lockdiag.core.model import ServerInfo, Session, Snapshot, describe_lock
from lockdiag.core.ownership import (
    Ownership,
    may_release,
    ownership,
    tell_apart,
    what_ending_breaks,
    written,
)
from lockdiag.durations import format_duration
from lockdiag.keys import LockTriple
from lockdiag.registry import Namespace, Unregistered

# "info": reported in every format, never changes the exit code (hygiene, not an incident)
Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class Kind(str, Enum):
    """A finding's kind, in the order findings of one severity are listed."""

    OUTLIVED_CLIENT = "outlived-client"
    SESSION_LOCK = "session-lock"
    LONG_WAIT = "long-wait"
    STUCK_OWNER = "stuck-owner"
    BLOCKED_MANY = "blocked-many"
    UNREGISTERED = "unregistered"
    EXPECT_VIOLATED = "expect-violated"
    MAX_HOLD = "max-hold"
    MAX_WAIT = "max-wait"
    LOCK_QUEUE = "lock-queue"
    STALLED = "stalled"

    def __str__(self) -> str:
        return self.value


# kinds whose value is a lower bound on a duration (PostgreSQL records no acquisition time)
LOWER_BOUND_KINDS = frozenset(
    {Kind.OUTLIVED_CLIENT, Kind.SESSION_LOCK, Kind.STUCK_OWNER, Kind.EXPECT_VIOLATED,
     Kind.MAX_HOLD}
)  # fmt: skip


@dataclass(frozen=True)
class Threshold:
    """A warning level and an optional critical level (seconds, or a count)."""

    warning: float
    critical: float | None = None

    def severity(self, value: float | None) -> Severity | None:
        if value is None:
            return None
        if self.critical is not None and value >= self.critical:
            return "critical"
        return "warning" if value >= self.warning else None


@dataclass(frozen=True)
class CheckPolicy:
    session_age: Threshold = Threshold(300, 3600)  # certain session lock held this long
    wait_age: Threshold = Threshold(30, 300)  # a session waiting for a lock
    idle_age: Threshold = Threshold(60, 600)  # holder idle in transaction while others wait
    max_blocked: Threshold = Threshold(5, 20)  # sessions behind one root blocker (more than N)
    unregistered: Unregistered = "report"  # keys no registry names: hygiene, not paging

    def analysis_policy(self) -> Policy:
        """The analysis flags certain session locks from the warning level on, so the
        session-lock detector can read the flag."""
        return Policy(session_age=self.session_age.warning)


@dataclass(frozen=True)
class Finding:
    kind: Kind
    severity: Severity
    pid: int | None
    lock: str
    evidence: str
    next_step: str
    entry: LockEntry | None = None  # the first lock it is about
    value: float | None = None  # seconds or a count, for perfdata
    locks: int = 1  # the locks it is about: one backend's, in one namespace where it matters
    root: int | None = None  # a wait's: the root blocker at the head of its chain
    caused: tuple[Finding, ...] = ()  # a cause's: the wait findings of its chains
    # a held lock's: the evidence that its owner's work is over (see core.ownership)
    owner: Ownership | None = None

    @property
    def lower_bound(self) -> bool:
        """Whether ``value`` is a lower bound (a hold, not an exact wait or a count)."""
        return self.kind in LOWER_BOUND_KINDS


@dataclass(frozen=True)
class Census:
    """What one pass over every lock says, for the detectors and for metrics."""

    flagged: dict[Flag, list[LockEntry]]  # the entries carrying each flag, in order
    software: dict[int, Known]  # the well-known software whose lock each backend holds
    waiters: list[LockEntry]  # locks not granted, in order
    # advisory locks by (database, namespace: the registry's, a known software's or
    # "unregistered", "held" or "waiting")
    advisory: dict[tuple[str, str, str], int]
    oldest_session_lock: float  # the longest lower bound of a certain session lock, or 0


def census(entries: list[LockEntry]) -> Census:
    flagged: dict[Flag, list[LockEntry]] = {flag: [] for flag in Flag}
    software: dict[int, Known] = {}
    waiters: list[LockEntry] = []
    counted: dict[tuple[object, ...], _Count] = {}  # by identity of namespace and software
    oldest = 0.0
    for entry in entries:
        for flag in entry.flags:
            flagged[flag].append(entry)
        decoded, granted = entry.decoded, entry.lock.granted
        if not granted:
            waiters.append(entry)
        elif entry.lifetime == "session" and (entry.held_at_least or 0.0) > oldest:
            oldest = entry.held_at_least or 0.0
        if decoded is None:
            continue
        namespace, known = decoded.namespace, decoded.known
        kind = (entry.database, id(namespace), id(known), granted)
        count = counted.get(kind)
        if count is None:
            count = counted[kind] = _Count(entry)
        count.locks += entry.lock.keys  # a span counts its every lock
        if known is not None and granted:
            pid = entry.lock.pid
            if pid is not None and pid not in software and known.behaviour is not None:
                software[pid] = known
    advisory: dict[tuple[str, str, str], int] = {}
    for count in counted.values():
        first = count.first
        state = "held" if first.lock.granted else "waiting"
        key = (first.database or "", namespace_of(first), state)
        advisory[key] = advisory.get(key, 0) + count.locks
    return Census(flagged, software, waiters, advisory, oldest)


class _Count:
    __slots__ = ("first", "locks")

    def __init__(self, first: LockEntry) -> None:
        self.first, self.locks = first, 0


@dataclass(frozen=True)
class CheckReport:
    snapshot: Snapshot
    findings: list[Finding]
    entries: list[LockEntry] = field(repr=False)
    graph: Blockers = field(repr=False)
    census: Census = field(repr=False)
    notes: list[str] = field(default_factory=list)
    # leaders and the sessions polling a try-lock: contention that leaves no row in pg_locks
    contention: Contention = field(default=NO_CONTENTION, repr=False)

    @property
    def status(self) -> Literal["OK", "WARNING", "CRITICAL"]:
        severities = {f.severity for f in self.findings}
        if "critical" in severities:
            return "CRITICAL"
        return "WARNING" if "warning" in severities else "OK"


def check(
    snapshot: Snapshot,
    entries: list[LockEntry],
    graph: Blockers,
    notes: list[str],
    policy: CheckPolicy = CheckPolicy(),
) -> CheckReport:
    """Findings of one analysed snapshot (a Diagnosis's; use Diagnosis.findings). Its entries
    are analysed with ``policy.analysis_policy()``: the session-lock detector reads the flag."""
    found = census(entries)
    flagged, software = found.flagged, found.software
    standing = contention(snapshot, entries)
    findings = [
        *_outlived_clients(flagged[Flag.OUTLIVED_CLIENT], software, snapshot),
        *_session_locks(flagged[Flag.LONG_SESSION_LOCK], policy, software, snapshot, standing),
        *_waits(found.waiters, policy, snapshot.server),
        *_stuck_owners(flagged[Flag.STUCK_OWNER], policy, snapshot, software),
        *_crowded_roots(graph, policy, snapshot.server),
        *_unregistered(flagged[Flag.UNREGISTERED], policy.unregistered),
        *_namespace_rules(flagged[Flag.EXPECT_XACT], flagged[Flag.MAX_HOLD]),
        *_lock_queues(graph, policy),
        *_stalled(snapshot, software, policy),
    ]
    return CheckReport(snapshot, by_cause(findings, graph), entries, graph, found, notes, standing)


WAITS = frozenset({Kind.LONG_WAIT, Kind.MAX_WAIT})
# which finding about a root blocker says best why others wait (it carries their waits)
CAUSES = [Kind.STUCK_OWNER, Kind.OUTLIVED_CLIENT, Kind.SESSION_LOCK, Kind.MAX_HOLD,
          Kind.EXPECT_VIOLATED, Kind.BLOCKED_MANY, Kind.UNREGISTERED]  # fmt: skip


def by_cause(findings: list[Finding], graph: Blockers) -> list[Finding]:
    """Causes before symptoms. Each wait finding learns the root blocker of its chain; the
    first finding about that root (its cause: a stuck owner, a leaked lock...) carries the
    waits it causes. Order: the worst severity a finding has or causes, then how many waits
    it causes, then the kind's place and the value."""
    root_of = {pid: root.tree.pid for root in graph.roots for pid in tree_pids(root.tree)[1:]}
    findings = [
        replace(f, root=root_of.get(f.pid)) if f.kind in WAITS and f.pid is not None else f
        for f in findings
    ]
    caused: dict[int, list[Finding]] = {}
    for finding in findings:
        if finding.root is not None:
            caused.setdefault(finding.root, []).append(finding)
    order = {"critical": 0, "warning": 1, "info": 2}
    kinds = list(Kind)
    first_cause: dict[int, int] = {}
    for index, finding in sorted(
        enumerate(findings), key=lambda p: (CAUSES.index(p[1].kind) if p[1].kind in CAUSES
                                            else len(CAUSES), order[p[1].severity])
    ):  # fmt: skip
        if finding.kind not in WAITS and finding.pid in caused and finding.pid not in first_cause:
            first_cause[finding.pid] = index
    for pid, index in first_cause.items():
        findings[index] = replace(findings[index], caused=tuple(caused[pid]))

    def rank(finding: Finding) -> tuple[int, int, int, float]:
        worst = min(order[f.severity] for f in (finding, *finding.caused))
        return (worst, -len(finding.caused), kinds.index(finding.kind), -(finding.value or 0))

    return sorted(findings, key=rank)


def _who(entry: LockEntry) -> str:
    session = entry.session
    name = f" ({session.application_name})" if session and session.application_name else ""
    return f"pid {entry.lock.pid}{name}"


def _label(entry: LockEntry, server: ServerInfo | None = None) -> str:
    """The lock's name: decoded for an advisory lock; a relation by name where the snapshot
    can tell it (``server``), else in pg_locks' own terms."""
    if entry.decoded is not None:  # a span's: its lowest key's, as the full read's first
        return entry.decoded.first_keys(1)[0].label
    return describe_lock(entry.lock, server) if server is not None else entry.lock.locktype


def _by_backend(entries: Iterable[LockEntry], by_namespace: bool = False) -> list[list[LockEntry]]:
    """Locks grouped by backend (and namespace), in order. A backend holding thousands of
    locks is one finding, not thousands: its locks share the lower bound of their age."""
    groups: dict[tuple[object, ...], list[LockEntry]] = {}
    for entry in entries:
        namespace = entry.decoded.namespace if by_namespace and entry.decoded else None
        groups.setdefault((entry.lock.pid, id(namespace)), []).append(entry)
    # the locks others wait for first (most waiters first): a group is named by its first
    return [sorted(group, key=lambda e: -len(e.blocks)) for group in groups.values()]


def locks_in(group: list[LockEntry]) -> int:
    """How many locks a group's entries stand for: a span (LockRow.keys) counts its every
    lock, so an aggregated read counts as the full read does."""
    return sum(e.lock.keys for e in group)


def _labels(group: list[LockEntry]) -> str:
    """The first lock's label, and how many more."""
    more = locks_in(group) - group[0].lock.keys
    return _label(group[0]) + (f" (+{more} more)" if more else "")


def _listed(group: list[LockEntry], shown: int = 3) -> str:
    """For evidence: the first few labels of a group of more than one lock."""
    if len(group) == 1 and group[0].lock.keys == 1:
        return ""
    names: list[str] = []
    for entry in group:  # a span's keys as the full read's rows (Decoded.first_keys)
        if len(names) == shown:
            break
        if entry.decoded is None:
            names.append(_label(entry))
        else:
            names += [d.label for d in entry.decoded.first_keys(shown - len(names))]
    more = locks_in(group) - len(names)
    return f": {', '.join(names)}" + (f" and {more} more" if more else "")


def software_step(known: Known, pid: int | None) -> str:
    """A next step in that software's terms: never a timeout to set nor a session to end as a
    routine step, since that would abort a deploy or a job in the middle of its work."""
    behaviour = known.behaviour
    assert behaviour is not None
    if behaviour.runs:  # "an Acme Deploy" (not "a Acme Deploy deploy"), "a Sqitch deploy"
        run = known.software
        if not run.lower().endswith(behaviour.kind):
            run += f" {behaviour.kind}"
        return (
            f"{_article(run)} {run} is running, or died holding its lock "
            f"({behaviour.normal}): check that {behaviour.kind} (its process, its log) before "
            f"acting; ending its session mid-{behaviour.kind} can leave {known.software}'s "
            "record of applied changes out of step with the schema"
        )
    if behaviour.kind == "library" and not behaviour.check:  # a library with a documented hold
        return (
            f"{known.software} {known.meaning}: {behaviour.normal}; look for the code path that "
            "takes it and never lets go"
        )
    default = f"check the {known.software} process that owns pid {pid} before acting"
    check = behaviour.check or default
    return f"{known.software} {known.meaning} is {behaviour.normal}: {check}"


def _article(word: str) -> str:
    """The article before ``word``, by its first letter: a name read letter by letter or
    with a "you" sound is rare among software names, and "an hour" is no software."""
    you = word.lower().startswith(("uni", "use", "one"))
    vowel = word[:1].lower() in tuple("aeiou") and not you
    return "an" if vowel else "a"


def _outlived_clients(
    leaked: list[LockEntry], software: dict[int, Known], snapshot: Snapshot
) -> Iterator[Finding]:
    """The leak this tool exists for: a session lock taken through a transaction-pooling
    PgBouncer, on a server connection that no client is using any more, or that the pool
    lends to a client now which did not take it (flagged so)."""
    for group in _by_backend(leaked):
        entry, pool, count = group[0], group[0].pool, locks_in(group)
        assert pool is not None
        pid = entry.lock.pid
        held = entry.held_at_least
        bound = f" for at least {format_duration(held)}" if held is not None else ""
        waiting = sum(len(e.blocks) for e in group)
        what = "lock outlived its client" if count == 1 else f"{count} locks outlived their client"
        attached = (
            f"lent to client {pool.client} now (it only borrows the connection)"
            if pool.client
            else "with no client attached"
        )
        yield Finding(
            Kind.OUTLIVED_CLIENT,
            "critical" if waiting else "warning",
            pid,
            _labels(group),
            f"{what}: taken through pool {pool.pool} of {pool.pooler} "
            f"({pool.pool_mode or 'unknown'} pooling), held{bound} by server connection "
            f"pid {pid} {attached}{_listed(group)}"
            + (f"; {waiting} session(s) wait for it" if waiting else ""),
            software_step(software[pid], pid)
            if pid is not None and pid in software
            else "use transaction-level locks (pg_advisory_xact_lock) behind a transaction "
            "pooler, or session pooling, or server_reset_query_always = 1; last resort: "
            f"lockdiag terminate {pid} (ends that pooled server connection; "
            + (
                f"it refuses while client {pool.client} is attached: once that client's "
                "transaction ends, run it again"
                if pool.client
                else "only while its preview shows no client attached: between transactions "
                "the pool hands it to other clients"
            )
            + ")",
            entry,
            held,
            count,
            owner=ownership(group, snapshot.remembered.get(pid) if pid is not None else None),
        )


def _session_locks(
    old: list[LockEntry],
    policy: CheckPolicy,
    software: dict[int, Known],
    snapshot: Snapshot,
    standing: Contention = NO_CONTENTION,
) -> Iterator[Finding]:
    # the flag: a certain session lock held past --session-age's warning level, in a namespace
    # not declared long-lived (a leader lock never raises an alert)
    for group in _by_backend(old):
        entry, count = group[0], locks_in(group)
        held = entry.held_for  # the backend's: the same for each of its locks
        severity = policy.session_age.severity(held)
        if severity is None or held is None:
            continue
        what = (
            "certain session-level lock" if count == 1 else f"{count} certain session-level locks"
        )
        owner = ownership(group)
        leader = standing.leader_of(entry.lock.pid)
        yield Finding(
            Kind.SESSION_LOCK,
            severity,
            entry.lock.pid,
            _labels(group),
            f"{what} held by {_who(entry)}, idle, for at least {held_words(entry)}"
            + _listed(group)
            + (f"; a leader lock: {leader.polling()}" if leader is not None else ""),
            software_step(software[entry.lock.pid], entry.lock.pid)
            if entry.lock.pid in software
            else _leader_step(leader)
            if leader is not None
            else _idle_holder_step(entry, owner, snapshot),
            entry,
            held,
            count,
            owner=owner,
        )


def _leader_step(leader: Leader) -> str:
    """For a leader with standbys polling: failover is the design, not a hazard, and the
    registry declaration that quiets it."""
    return (
        "a leader lock is held for the life of its process, and its standbys take it over when "
        f"that process ends (failover, by design): {leader.declaration()}. If no process of "
        "that program should lead now, the unlock was missed: find it from the leader's client "
        "address and port"
    )


def _idle_holder_step(entry: LockEntry, owner: Ownership, snapshot: Snapshot) -> str:
    """For an idle holder of session locks: with no evidence that its work is over, both
    possibilities and the step that tells them apart; ending it only once that is known."""
    apart = tell_apart(entry, snapshot)
    if not may_release(owner, advisory=True):
        return (
            "idle proves only that it is idle: its work may go on elsewhere (on another "
            "connection, or outside the database), or the unlock was missed (a missing "
            "pg_advisory_unlock, a lock taken through a pooled connection). Tell them apart: "
            f"{apart}. Do not end it before you know: "
            + what_ending_breaks("ending it", _namespace(entry))
        )
    return _ending_step(entry, owner, apart)


def _ending_step(entry: LockEntry, owner: Ownership, apart: str, lost: str = "") -> str:
    """Ending the session, offered after the step that checks the owning process, for a
    holder whose evidence allows it (see core.ownership.may_release)."""
    return (
        f"{owner.sentence}. Check the owning process first: {apart}. Once its work is known "
        f"to be over: lockdiag terminate {entry.lock.pid}" + (f" ({lost})" if lost else "")
    )


def _namespace(entry: LockEntry) -> Namespace | None:
    return entry.decoded.namespace if entry.decoded is not None else None


def _waits(waiters: list[LockEntry], policy: CheckPolicy, server: ServerInfo) -> Iterator[Finding]:
    for entry in waiters:
        if entry.waited is None:
            continue
        namespace = entry.decoded.namespace if entry.decoded else None
        if namespace is not None and namespace.max_wait is not None:
            if entry.waited > namespace.max_wait:  # exceeded, as max_hold
                why = f" (max_wait of {namespace.name})"
                yield _wait_finding(Kind.MAX_WAIT, "critical", entry, why, server)
            continue
        severity = policy.wait_age.severity(entry.waited)
        if severity is not None:
            yield _wait_finding(Kind.LONG_WAIT, severity, entry, "", server)


def _wait_finding(
    kind: Kind, severity: Severity, entry: LockEntry, why: str, server: ServerInfo
) -> Finding:
    blockers = ", ".join(map(str, entry.waits_for or entry.queued_behind)) or "unknown"
    return Finding(
        kind,
        severity,
        entry.lock.pid,
        _label(entry, server),
        f"{_who(entry)} has waited {format_duration(entry.waited or 0)}{why}, "
        f"blocked by pid {blockers}",
        "see who blocks it: lockdiag blockers",
        entry,
        entry.waited,
    )


def _stuck_owners(
    stuck: list[LockEntry], policy: CheckPolicy, snapshot: Snapshot, software: dict[int, Known]
) -> Iterator[Finding]:
    server = snapshot.server
    reported: set[int | None] = set()
    advisory = _advisory_holders(snapshot) if stuck else set()  # read only when needed
    for entry in stuck:
        session = entry.session
        if session is None or entry.lock.pid in reported:
            continue
        idle = entry.held_at_least  # for an idle backend: time since it went idle
        severity = policy.idle_age.severity(idle)
        if severity is None or idle is None:
            continue
        reported.add(entry.lock.pid)
        owner = ownership([entry])
        pid = entry.lock.pid
        known = (software.get(pid) if pid is not None else None) or software_of_session(
            session.application_name
        )
        yield Finding(
            Kind.STUCK_OWNER,
            severity,
            entry.lock.pid,
            _label(entry, server),
            f"{_who(entry)} is {session.state} for {format_duration(idle)} while "
            f"{len(entry.blocks)} session(s) wait for its lock",
            software_step(known, entry.lock.pid)
            if known is not None
            else _stuck_owner_step(entry, owner, snapshot, pid in advisory),
            entry,
            idle,
            owner=owner,
        )


def _advisory_holders(snapshot: Snapshot) -> set[int | None]:
    """The backends holding an advisory lock: their exclusion depends on their sessions."""
    return {r.pid for r in snapshot.locks if r.granted and r.locktype == "advisory"}


def _stuck_owner_step(
    entry: LockEntry, owner: Ownership, snapshot: Snapshot, advisory: bool
) -> str:
    """For a holder idle in transaction while others wait: what its idleness can mean and the
    step that tells it apart. A holder of advisory locks may be idle in its transaction by
    design: no timeout and no terminate without evidence (see core.ownership.may_release).
    For one holding none: a timeout for that program only (a server-wide one would also end
    the pauses of programs that do), and ending it where it has written nothing."""
    apart, lost = tell_apart(entry, snapshot), written(entry.session)
    if advisory:
        if may_release(owner, advisory):
            return _ending_step(entry, owner, apart, lost or "rolls back its transaction")
        return (
            "idle in transaction proves only that it is idle: some programs hold their lock so "
            "by design (a coordination library's lock connection, a two-phase commit between "
            f"its phases), others lost track of it. Tell them apart: {apart}. No "
            "idle_in_transaction_session_timeout and no terminate: "
            + what_ending_breaks("either", _namespace(entry))
        )
    session = entry.session
    role = session.user if session and session.user and not session.hidden else "ROLE"
    step = (
        "idle in transaction proves only that it is idle: the program keeps its transaction "
        f"open between statements, or lost track of it. Tell them apart: {apart}. It holds no "
        "advisory lock, so idle_in_transaction_session_timeout is safe for it: set it above "
        "its longest normal pause in its own connections (SET at connect), or by ALTER ROLE "
        f"{role} if no program of that role holds advisory locks in a transaction (never "
        "server-wide)"
    )
    if session is not None and session.wrote is False:  # a reader: ending it costs no data
        return f"{step}. {lost[:1].upper()}{lost[1:]}: lockdiag terminate {entry.lock.pid}"
    if owner.allows_ending:
        return f"{step}. {owner.sentence}: once its work is known to be over, " + (
            f"lockdiag terminate {entry.lock.pid} ({lost or 'rolls back its transaction'})"
        )
    return f"{step}. {lost[:1].upper()}{lost[1:]}" if lost else step


def _crowded_roots(graph: Blockers, policy: CheckPolicy, server: ServerInfo) -> Iterator[Finding]:
    """Roots with more than --max-blocked sessions behind them that have waited at least
    --wait-age's warning level: a queue of waits of a few milliseconds is ordinary
    contention, not an incident."""
    floor = policy.wait_age.warning
    for root in graph.roots:
        behind = [pid for pid in tree_pids(root.tree)[1:] if pid in graph.nodes]
        waits = [graph.nodes[pid].waits for pid in behind]
        long = sum(1 for w in waits if w is not None and (w.waited or 0.0) >= floor)
        if long <= policy.max_blocked.warning:
            continue
        critical = policy.max_blocked.critical
        severity: Severity = "critical" if critical is not None and long > critical else "warning"
        node = graph.nodes.get(root.tree.pid)
        held = list(dict.fromkeys(_label(e, server) for e in node.holds)) if node else []
        app = node.session.application_name if node and node.session else None
        longest = format_duration(root.longest_wait) if root.longest_wait is not None else "?"
        yield Finding(
            Kind.BLOCKED_MANY,
            severity,
            root.tree.pid,
            held[0] + (f" (+{len(held) - 1} more)" if len(held) > 1 else "") if held else "?",
            f"pid {root.tree.pid}{f' ({app})' if app else ''} blocks {long} session(s) that "
            f"have waited {format_duration(floor)} or more ({root.total} behind it in all, "
            f"{root.direct} directly); longest wait {longest}",
            "see the chain: lockdiag blockers",
            None,
            float(long),
        )


def _unregistered(unregistered: list[LockEntry], level: Unregistered) -> Iterator[Finding]:
    """One finding per database, holder and kind of advice, counting the keys it is about:
    info (reported, exit 0) unless ``level`` asks for a warning or for nothing."""
    if level == "ignore":
        return
    # the advice depends on the key space (form and high word) and the key's shape only, and
    # on how many keys the holder has in it: grouped by space and shape first
    spaces: dict[tuple[str | None, int | None, int, int, KeyShape], list[LockEntry]] = {}
    for entry in unregistered:
        if entry.lock.granted:
            triple = entry.decoded.triple  # type: ignore[union-attr]
            shape = key_shape(triple)
            key = (entry.database, entry.lock.pid, triple.objsubid, triple.classid, shape)
            spaces.setdefault(key, []).append(entry)
    groups: dict[tuple[str | None, int | None, str], list[LockEntry]] = {}
    for (database, pid, *_), found in spaces.items():
        keys = _keys(found)
        step = unregistered_step(found[0].decoded.triple, keys)  # type: ignore[union-attr]
        groups.setdefault((database, pid, step), []).extend(found)
    for (database, _, advice), found in groups.items():
        first = found[0]
        keys = _keys(found)
        where = f" in database {database}" if database else ""
        step = advice
        if keys == 1:  # a constant fixed in code, maybe: the entry that names it alone
            step += f"; {exact_entry(first.decoded.triple)}"  # type: ignore[union-attr]
        yield Finding(
            Kind.UNREGISTERED,
            "warning" if level == "warn" else "info",
            first.lock.pid,
            _labels(found),
            f"{keys} unregistered key(s) held by {_who(first)}{where}{_listed(found)}",
            step,
            first,
            float(keys),
            locks_in(found),
        )


def _keys(found: list[LockEntry]) -> int:
    """How many keys: a key held in two modes is two rows, a span as many keys as it has."""
    return len(set(map(_TRIPLE, found))) + sum(e.lock.keys - 1 for e in found)


_TRIPLE = attrgetter("decoded.triple")
PLAUSIBLE_ID = 1 << 20  # team namespaces are small numbers; a hash's high word rarely is
BYTE = range(-128, 256)  # a digest's byte, read signed or unsigned
KeyShape = Literal["small", "int4-hash", "bytes", ""]
SMALL_NUMBER = (
    "a small number (an enum, a counter or an object's id), not a hash: the bigint keys "
    "0..4294967295 share id 0 with the keys of Sqitch, Prisma, goose and Marten, so no "
    "namespace can take them as they are; find the code that takes it (its query, its "
    'application) and give it a namespace of its own: [namespaces.NAME] id = N, form = "bigint", '
    "taking pg_advisory_lock(N << 32 | number)"
)
HASHED_32 = (
    "a 32-bit key, most likely a hashed name (hashtext(); crc32 as django-pglocks 1.0 does; "
    "djb2 as @medusajs/locking-postgres does; the first 4 bytes of a sha256, sha1 or md5 "
    "digest): list candidate names under [known] (hashtext, django_pglocks, medusa: a name "
    "listed under django_pglocks is tried with each digest, in both byte orders); no "
    "namespace id fits it (a sign-extended int4: id 0 or -1)"
)
HASHED_64 = (
    "looks like a 64-bit hash of a name (the first 8 bytes of a sha256, sha1 or md5 digest, "
    "as django-pglocks, django-pglock, pals, GoodJob or pg-boss take them): list candidate "
    "names under [known] django_pglocks or pals; each is tried with each digest, in both "
    "byte orders"
)
HASHED_PAIR = (
    "looks like a pair made by hashing a name (with_advisory_lock puts a crc32 first, "
    "advisory-lock on npm two int4 of a sha256): list candidate names under [known] "
    "(with_advisory_lock, advisory_lock_npm: tried with sha256, sha1 and md5, both byte "
    "orders); if the first number is instead fixed in a program's code, more keys with the "
    "same first number will show it"
)
BYTES_PAIR = (
    "a pair of two byte-sized numbers: two bytes of a digest (md5, sha1, sha256), or an enum "
    "and a small number; one key cannot tell which, and a digest's byte is no namespace id: "
    "find the code that takes it (its query, its application); a fixed first number there is "
    "the namespace id to name in the registry file"
)


def exact_entry(triple: LockTriple) -> str:
    """The registry entry that names exactly one key, ready to paste."""
    args = triple.args
    key = str(args[0]) if len(args) == 1 else f"[{args[0]}, {args[1]}]"
    return f"to name this one key (a constant in code): [namespaces.NAME] key = {key}"


def key_shape(triple: LockTriple) -> KeyShape:
    """What a key's numbers look like: a small bigint (an enum, an id), a sign-extended
    32-bit value (a hash), a pair of byte-sized numbers (digest bytes, or an enum), or
    nothing in particular ("")."""
    first, second = triple.pair  # the high and low words of a bigint, as int4
    if triple.form == "pair":
        return "bytes" if first in BYTE and second in BYTE else ""
    if triple.classid in (0, 0xFFFFFFFF):  # within int4, or an unsigned 32-bit value
        return "small" if abs(triple.bigint) < PLAUSIBLE_ID else "int4-hash"
    return ""


def unregistered_step(triple: LockTriple, keys: int = 1) -> str:
    """The advice that fits a key nobody named, ``keys`` being how many keys its holder has
    in its space (form and first number) with its shape: a namespace id only where the key
    looks like one (several keys share it, or a small first number; never a digest's byte,
    and never an id that takes in a well-known software's key), else what it looks like."""
    namespace_id = triple.pair[0]  # the first int4 (pair) or the high word (bigint)
    shape = key_shape(triple)
    if shape == "int4-hash":
        return HASHED_32
    if shape == "bytes":
        return BYTES_PAIR
    plausible = keys > 1 or shape == "small" or 0 < abs(namespace_id) < PLAUSIBLE_ID
    probe = Namespace(name="NAME", id=namespace_id, form=triple.form)
    if plausible and not collisions(probe, guesses=False):
        return (
            f"name it in the registry file: [namespaces.NAME] id = {namespace_id}, "
            f'form = "{triple.form}"'
        )
    if shape == "small":
        return SMALL_NUMBER
    return HASHED_PAIR if triple.form == "pair" else HASHED_64


def _namespace_rules(expecting_xact: list[LockEntry], over: list[LockEntry]) -> Iterator[Finding]:
    # the analysis flags each lock that breaks its namespace's rules
    for group in _by_backend(expecting_xact, by_namespace=True):
        entry, count = group[0], locks_in(group)
        assert entry.decoded is not None and entry.decoded.namespace is not None
        what = (
            "a certain session-level lock" if count == 1 else f"{count} certain session-level locks"
        )
        yield Finding(
            Kind.EXPECT_VIOLATED,
            "warning",
            entry.lock.pid,
            _labels(group),
            f"{entry.decoded.namespace.name} expects transaction-level locks, but {_who(entry)} "
            f"holds {what}{_listed(group)}",
            'use pg_advisory_xact_lock in that code path, or declare expect = "any"',
            entry,
            entry.held_at_least,
            count,
        )
    for group in _by_backend(over, by_namespace=True):
        entry, count = group[0], locks_in(group)
        namespace, age = entry.decoded.namespace if entry.decoded else None, entry.held_for
        assert namespace is not None and namespace.max_hold is not None and age is not None
        what = "it" if count == 1 else f"{count} of its locks"
        yield Finding(
            Kind.MAX_HOLD,
            "critical",
            entry.lock.pid,
            _labels(group),
            f"{_who(entry)} has held {what} at least {held_words(entry)}, over the "
            f"max_hold of {format_duration(namespace.max_hold)}{_listed(group)}",
            f"see the holder and its waiters: lockdiag who-holds {_label(entry)}",
            entry,
            age,
            count,
        )


# -- the lock queue, which figure is which, known software stalled -----------------------------


def _lock_queues(graph: Blockers, policy: CheckPolicy) -> Iterator[Finding]:
    """A waiter that sessions queue behind (a DDL waiting behind an idle reader, say): they
    wait for its request, not for the holder's lock, so cancelling its wait frees them at once;
    a fact no wait finding says. Fires with the longest of their waits, as --wait-age."""
    server = graph.snapshot.server
    for queue in graph.queues():
        severity = policy.wait_age.severity(queue.longest_wait)
        if severity is None:
            continue
        yield Finding(
            Kind.LOCK_QUEUE,
            severity,
            queue.waiter,
            _label(queue.entry, server),
            queue_evidence(queue, server),
            queue_step(queue, graph.snapshot),
            queue.entry,
            float(len(queue.queued)),
        )


def queue_evidence(queue: Queue, server: ServerInfo) -> str:
    """``pid 812 (deploy) waits for AccessExclusive on relation public.orders, held by pid
    700; 15 session(s) wait behind its request (pg_blocking_pids names it), not for that
    lock``."""
    holders = _pids(queue.holders)
    return (
        f"{_who(queue.entry)} waits for {queue.entry.lock.mode.removesuffix('Lock')} on "
        f"{_label(queue.entry, server)}, held by {holders}; {len(queue.queued)} session(s) "
        "wait behind its request (pg_blocking_pids names it), not for that lock"
    )


def queue_step(queue: Queue, snapshot: Snapshot) -> str:
    """The quick way out first: the waiting statement is cancelled (it holds nothing the queue
    waits for, and its program is told by the error), then retried with a lock_timeout so
    that it gives up instead of holding up the queue; then the holder."""
    pid = queue.waiter
    advisory = sum(
        1 for r in snapshot.locks if r.pid == pid and r.granted and r.locktype == "advisory"
    )
    held = (
        f"; it holds {advisory} advisory lock(s): the rollback releases those taken for its "
        "transaction, and its program sees the error"
        if advisory
        else ""
    )
    return (
        f"cancel its wait first: lockdiag terminate {pid} --cancel frees the "
        f"{len(queue.queued)} session(s) behind it at once (its statement fails; retry it "
        f"after SET lock_timeout = '5s'){held}; then see to the holder, "
        f"{_pids(queue.holders)}"
    )


def _pids(pids: Iterable[int]) -> str:
    return "pid " + ", ".join(map(str, pids))


def held_words(entry: LockEntry) -> str:
    """How long a lock has been held at least, and which bound that is, claiming no more than
    was seen: ``5m (seen held at every look since 10:02:07)``, or the state bound's figure."""
    seen, held = entry.seen, entry.held_for
    if held is None:
        return "a time not known"
    if seen is None or held != seen.seconds or held == entry.held_at_least:
        return format_duration(held)
    busy = "; it ran statements between looks: maybe released and retaken" if seen.busy else ""
    return f"{format_duration(held)} (seen held at every look since {seen.since:%H:%M:%S}{busy})"


def figures(held: float | None, waited: float | None) -> str | None:
    """Where a holder's lower bound is far below its oldest waiter's wait, what each figure
    means: both are true, and side by side without a word they read as a contradiction. The
    holder is not dated by the queue: a session queued ahead of a waiter may have been granted
    after that waiter began to wait (A holds, B and C wait; A ends: B's lock is younger than
    C's wait)."""
    if held is None or waited is None or waited < 2 * held + 1.0:
        return None
    return (
        f"held ≥ {format_duration(held)} counts from the holder's last change of state, "
        f"as PostgreSQL records no lock time; its oldest waiter has waited "
        f"{format_duration(waited)}: the lock has been taken that long, by this session or "
        "by one before it"
    )


# pg_repack's main connection, step 4 (bin/pg_repack.c, repack_one_table): it applies its log
# (repack.repack_apply) and polls SQL_XID_ALIVE once a second until the transactions open at
# its snapshot have ended, printing "Waiting for N transactions to finish. First PID: ..."
REPACK_POLLS = ("virtualtransaction = ANY", "repack.repack_apply")
VACUUM = ("vacuum ", "autovacuum: ")  # pg_repack ignores these (its SQL_XID_SNAPSHOT)


def _stalled(
    snapshot: Snapshot, software: dict[int, Known], policy: CheckPolicy
) -> Iterator[Finding]:
    """pg_repack waiting for older transactions: its lock's holder polls, so its lower bound
    never passes a second and no threshold on it can fire. The transactions it waits for are
    at least those of its database opened before its own first one (its table lock's, taken
    before its snapshot); the oldest is named. Fires with how long it has been at the table."""
    now = snapshot.server.now
    for pid, known in software.items():
        session = snapshot.session(pid)
        if known.software != "pg_repack" or session is None or session.hidden:
            continue
        if not any(poll in (session.query or "") for poll in REPACK_POLLS):
            continue
        own = {s.pid: s for s in snapshot.sessions.values()
               if s.database == session.database
               and s.application_name == session.application_name}  # fmt: skip
        # its table lock's transaction (step 1, before its snapshot), else its connection's
        began = min((s.xact_start for s in own.values() if s.xact_start),
                    default=session.backend_start)  # fmt: skip
        if began is None:
            continue
        older = sorted(
            (s for s in snapshot.sessions.values()
             if s.pid not in own and _waited_for(s, session.database, began)),
            key=lambda s: s.xact_start or now,
        )  # fmt: skip
        at_it = (now - began).total_seconds()
        severity = policy.wait_age.severity(at_it)
        if not older or severity is None:
            continue
        yield Finding(
            Kind.STALLED,
            severity,
            pid,
            known.label,
            f"pg_repack (pid {pid}) has been at {known.meaning.removeprefix('repack of ')} for "
            f"{format_duration(at_it)} and waits for older transactions to finish (its "
            f"output: 'Waiting for N transactions to finish'), at least {len(older)} opened "
            f"before it began; the oldest: {_transaction(older[0], now)}",
            f"pg_repack goes on by itself once pid {older[0].pid}'s transaction ends: ask its "
            "program to commit or roll back (it is not pg_repack's); leave pg_repack running "
            "(stopped mid-run it leaves its trigger and its repack.log_<oid> table behind)",
            None,
            at_it,
        )


def _waited_for(other: Session, database: str | None, began: datetime) -> bool:
    """A transaction pg_repack waits for: in its database, opened before its own first."""
    start, query = other.xact_start, (other.query or "").lstrip().lower()
    return (
        start is not None
        and start < began
        and other.database == database
        and not query.startswith(VACUUM)
    )


def _transaction(session: Session, now: datetime) -> str:
    """``pid 7 (old-transaction), idle in transaction, its transaction open since
    2026-...+00:00 (3m10s), last query: SELECT ...``."""
    start = session.xact_start
    assert start is not None
    app = f" ({session.application_name})" if session.application_name else ""
    verb = "running" if session.state == "active" else "last query"
    query = " ".join((session.query or "").split())
    query = query[:120] + ("…" if len(query) > 120 else "")
    age = format_duration((now - start).total_seconds())
    return (
        f"pid {session.pid}{app}, {session.state or 'state unknown'}, its transaction open "
        f"since {start.isoformat(timespec='seconds')} ({age})"
        + (f", {verb}: {query}" if query else "")
    )
