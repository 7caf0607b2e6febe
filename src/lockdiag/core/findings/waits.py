"""Detectors of waits: a wait past --wait-age or its namespace's max_wait, a root blocker with
too many sessions behind it, and a waiter that sessions queue behind (a lock queue)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lockdiag.core.analysis import LockEntry
from lockdiag.core.findings.model import Finding, Kind
from lockdiag.core.findings.words import (
    label,
    who,
)
from lockdiag.core.graph import Blockers, Queue
from lockdiag.core.model import ServerInfo, Snapshot
from lockdiag.core.policy import CheckPolicy, Severity
from lockdiag.durations import format_duration


def long_waits(
    waiters: list[LockEntry], policy: CheckPolicy, server: ServerInfo
) -> Iterator[Finding]:
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
        label(entry, server),
        f"{who(entry)} has waited {format_duration(entry.waited or 0)}{why}, "
        f"blocked by pid {blockers}",
        "see who blocks it: lockdiag blockers",
        entry,
        entry.waited,
    )


def crowded_roots(graph: Blockers, policy: CheckPolicy, server: ServerInfo) -> Iterator[Finding]:
    """Roots with more than --max-blocked sessions behind them that have waited at least
    --wait-age's warning level: a queue of waits of a few milliseconds is ordinary
    contention, not an incident."""
    floor = policy.wait_age.warning
    waited = graph.selection(
        pid
        for pid, node in graph.nodes.items()
        if node.waits and (node.waits.waited or 0.0) >= floor
    )
    for root in graph.roots:
        long = graph.count_behind(root.pid, waited)  # each session once, however reached
        if long <= policy.max_blocked.warning:
            continue
        critical = policy.max_blocked.critical
        severity: Severity = "critical" if critical is not None and long > critical else "warning"
        node = graph.nodes.get(root.pid)
        held = list(dict.fromkeys(label(e, server) for e in node.holds)) if node else []
        app = node.session.application_name if node and node.session else None
        longest = format_duration(root.longest_wait) if root.longest_wait is not None else "?"
        yield Finding(
            Kind.BLOCKED_MANY,
            severity,
            root.pid,
            held[0] + (f" (+{len(held) - 1} more)" if len(held) > 1 else "") if held else "?",
            f"pid {root.pid}{f' ({app})' if app else ''} blocks {long} session(s) that "
            f"have waited {format_duration(floor)} or more ({root.total} behind it in all, "
            f"{root.direct} directly); longest wait {longest}",
            "see the chain: lockdiag blockers",
            None,
            float(long),
        )


def lock_queues(graph: Blockers, policy: CheckPolicy) -> Iterator[Finding]:
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
            label(queue.entry, server),
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
        f"{who(queue.entry)} waits for {queue.entry.lock.mode.removesuffix('Lock')} on "
        f"{label(queue.entry, server)}, held by {holders}; {len(queue.queued)} session(s) "
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
