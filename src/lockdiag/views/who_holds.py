"""`lockdiag who-holds`: the holders and the queue of one key, with a verdict in words."""

from __future__ import annotations

from typing import Any

from lockdiag.core.analysis import Flag, LockEntry
from lockdiag.core.diagnosis import WhoHolds
from lockdiag.core.findings import figures, queue_evidence, queue_step, software_step
from lockdiag.core.holding import Holding, holding
from lockdiag.core.incident import Cause, Incident
from lockdiag.core.leaders import Poll, retry_words, retrying
from lockdiag.core.model import Snapshot
from lockdiag.core.ownership import ownership
from lockdiag.durations import format_duration
from lockdiag.keys import AdvisoryTag, LockTriple
from lockdiag.render import STEP, VERDICT, Block, Output, Text, clean
from lockdiag.views.columns import (
    HOLDER_COLUMNS,
    WAITER_COLUMNS,
    HolderRow,
    WaiterRow,
    cells_of,
    holder_line,
    table,
    waiter_line,
)
from lockdiag.views.common import (
    JSON_VERSION,
    busy_bounds,
    busy_note,
    entry_data,
    known_data,
    lock_label,
    notes_block,
    pool_attached,
    server_data,
    unknown_ages,
)
from lockdiag.views.keys import key_data, lock_sql


def verdict(report: WhoHolds, snapshot: Snapshot | None = None) -> str:
    """The answer in one sentence: who holds the key, how, and how many wait; with the
    ``snapshot``, how a well-known program holds it (where its work runs)."""
    # a key's name and its numbers; a tag's label is its numbers
    label = report.label if report.decoded is None else f"{report.label} {report.key}"
    if not report.holders:
        if report.waiters:
            return f"nobody holds {label} right now, but {len(report.waiters)} session(s) wait"
        return f"nobody holds {label}"
    text = f"{label} is held by " + "; ".join(_holder_summary(h, snapshot) for h in report.holders)
    if report.waiters:
        longest = max((w.waited or 0.0) for w in report.waiters)
        text += f"; {len(report.waiters)} waiting (longest {format_duration(longest)})"
    return text


def retriers(report: WhoHolds, snapshot: Snapshot) -> list[Poll]:
    """The sessions that retry this key, invisible to pg_locks (their last query tries it)."""
    if not isinstance(report.key, LockTriple):
        return []
    return retrying(snapshot, report.key, report.holders)


def cause_verdict(
    report: WhoHolds, retry: list[Poll] | None = None, snapshot: Snapshot | None = None
) -> tuple[str, str | None]:
    """The key in the incident's terms, and one next step: whether its holder is a cause, or
    in a cause's chain, or waits for something else, or whether nobody waits at all (in
    pg_locks; ``retry``: the sessions that retry it, which pg_locks never shows). With the
    ``snapshot``, a lock its program's routine left behind is said to be one, even with
    nobody waiting: every later call of that program does nothing until it goes."""
    label = clean(report.label)
    retried = retry_words(retry) if retry else ""
    if not report.holders:
        if report.waiters:
            return (
                f"{label}: nobody holds it, but {len(report.waiters)} session(s) wait for it",
                "see what they wait for: lockdiag blockers",
            )
        return f"{label}: nobody holds it: nothing to do", None
    found = report.incident() if report.incident is not None else None
    if found is None:
        return f"{label}: {_held_by(report.holders)}", None
    ranked = [(found.cause_of(e.lock.pid), e) for e in report.holders]
    causes = [(c, e) for c, e in ranked if c is not None]
    holding = {e.lock.pid for e in report.holders}
    leader = next((x for x in found.report.contention.leaders if x.pid in holding), None)
    paging = any(c.severity in ("warning", "critical") for c, _ in causes)
    if leader is not None and not report.waiters and not paging:
        # failed tries leave no row: nobody waits in pg_locks, its standbys poll
        return f"{label}: {clean(leader.sentence())}", clean(leader.declaration())
    if causes:  # the holder worst ranked in the incident speaks for the key
        cause, entry = min(causes, key=lambda pair: found.causes.index(pair[0]))
        return _in_cause_terms(label, report, found, cause, entry, retried), cause.next_step
    waits = _waits(found, report.holders)
    behind = _left_behind(report.holders, snapshot)
    if behind is not None and not waits:
        who = _who(
            behind.pid, behind.entry.session.application_name if behind.entry.session else None
        )
        how = (
            "left behind by a call that failed"
            if behind.call is not None
            else "left behind by a call, or held by other code on purpose"
        )
        return (
            f"{label}: held by {who}, a session lock of {behind.known.software} {how}: no "
            "call of it runs in that idle session",
            software_step(behind, snapshot) if snapshot is not None else None,
        )
    if waits:
        return f"{label}: {_held_by(report.holders)}, which {waits}", (
            "see the chain: lockdiag blockers"
        )
    if report.waiters:  # waiters nobody's chain accounts for (a wait not yet in the graph)
        return (
            f"{label}: {_held_by(report.holders)}; {len(report.waiters)} session(s) wait",
            "see the chain: lockdiag blockers",
        )
    if retried:
        return f"{label}: {_held_by(report.holders)}, nobody waits in pg_locks: {retried}", None
    return f"{label}: {_held_by(report.holders)}, nobody waits: nothing to do", None


def _in_cause_terms(
    label: str,
    report: WhoHolds,
    found: Incident,
    cause: Cause,
    entry: LockEntry,
    retried: str = "",
) -> str:
    rank = found.causes.index(cause)
    place = f"cause {rank + 1} of {len(found.causes)}"
    severity = (
        f" ({cause.severity.upper()} {cause.kind_name})" if cause.severity is not None else ""
    )
    who = _who(cause.pid, cause.session.application_name if cause.session else None)
    if cause.root is not None:
        what = "the worst root blocker" if rank == 0 else f"a root blocker ({place})"
    else:
        what = "the first cause" if rank == 0 else f"a cause ({place})"
    if cause.pid != entry.lock.pid:  # the holder is inside the chain of another cause
        holder = _who(entry.lock.pid, entry.session.application_name if entry.session else None)
        waits = _waits(found, [entry])
        return (
            f"{label}: held by {holder}, which {waits or 'is in the chain of ' + who}; "
            f"{who} is {what}: {cause.impact or clean(cause.evidence)}{severity}"
        )
    through = "" if clean(cause.label) == label else f" through {clean(cause.label)}"
    if not report.waiters:
        nobody = (
            f"nobody waits for it in pg_locks ({retried})" if retried else "nobody waits for it"
        )
        held = f"{label}: held by {who}, {nobody}"
        if cause.blocked:
            return f"{held}; but that session is {what}{through}: {cause.impact}{severity}"
        return f"{held}; that session is {what}: {clean(cause.evidence)}{severity}"
    return f"{label}: {who} is {what}{through}: {cause.impact or clean(cause.evidence)}{severity}"


def queue_lines(report: WhoHolds) -> list[str]:
    """Where a waiter for this key heads a queue (an exclusive request that shared ones queue
    behind): the queue, and the quick way out first."""
    if not report.waiters or report.incident is None:
        return []
    graph = report.incident().report.graph
    waiting = {e.lock.pid for e in report.waiters}
    server = graph.snapshot.server
    return [
        line
        for queue in graph.queues()
        if queue.waiter in waiting
        for line in (
            f"queue: {clean(queue_evidence(queue, server))}",
            f"first: {clean(queue_step(queue, graph.snapshot))}",
        )
    ]


def _left_behind(holders: list[LockEntry], snapshot: Snapshot | None) -> Holding | None:
    if snapshot is None:
        return None
    found = (holding(e, snapshot) for e in holders)
    return next((h for h in found if h is not None and h.left_behind), None)


def _who(pid: int | None, app: str | None) -> str:
    who = f"pid {pid}" if pid is not None else "a prepared transaction"
    return who + (f" ({clean(app)})" if app else "")


def _held_by(holders: list[LockEntry]) -> str:
    return "held by " + ", ".join(
        _who(e.lock.pid, e.session.application_name if e.session else None) for e in holders
    )


def _waits(found: Incident, holders: list[LockEntry]) -> str:
    """What the holders themselves wait for: ``waits for invoice_export 5 (held by pid 7)``."""
    server = found.report.snapshot.server
    pids = {e.lock.pid for e in holders}
    waiting = [e for e in found.report.entries if not e.lock.granted and e.lock.pid in pids]
    return "; ".join(
        f"waits for {lock_label(e, server)}"
        + (f" (held by pid {', '.join(map(str, e.waits_for))})" if e.waits_for else "")
        for e in waiting
    )


def _holder_summary(entry: LockEntry, snapshot: Snapshot | None = None) -> str:
    session = entry.session
    who = f"pid {entry.lock.pid}" if entry.lock.pid is not None else "a prepared transaction"
    if session is None:
        return who
    if session.application_name:
        who += f" ({session.application_name})"
    if session.hidden:
        return f"{who}, state hidden (no pg_read_all_stats), lifetime unknown"
    state = session.state or "state unknown"
    if entry.held_at_least is not None:
        state += f" {format_duration(entry.held_at_least)}"
    pool = entry.pool
    if entry.lifetime == "session" and pool is not None and pool.via == "console":
        attached = pool_attached(pool)
        outlived = Flag.OUTLIVED_CLIENT in entry.flags
        return (
            f"{who}, {state}, session lock on pooled server connection of {pool.pooler} pool "
            f"{pool.pool} ({attached}"
            + (f", lent by {pool.pool_mode} pooling" if pool.client and outlived else "")
            + ")"
            + (": the lock outlived the client that took it" if outlived else "")
        )
    program = holding(entry, snapshot) if snapshot is not None else None
    if program is not None and (words := program_words(program)):
        return f"{who}, {state}, {words}"
    if entry.lifetime == "session":
        known = entry.decoded.known if entry.decoded else None
        if known is not None and known.behaviour is not None:
            return f"{who}, {state}, session lock of {known.software} ({known.behaviour.normal})"
        owner = ownership([entry])
        if owner.level == "unknown":  # idle proves only that it is idle
            return f"{who}, {state}, session lock (whether its work is over: unknown)"
        return f"{who}, {state}, session lock ({owner.evidence})"
    return f"{who}, {state}, lifetime unknown (transaction or session lock)"


def program_words(found: Holding) -> str:
    """How a well-known program holds the lock, where the snapshot shows more than its
    catalogue entry says: the connection its work runs on, a lock its routine left behind,
    the routine at work; "" otherwise."""
    software, sibling = found.known.software, found.sibling
    if sibling is not None and found.software.sibling is not None:
        work = found.software.sibling.work
        return f"lock of {software}, whose {work} runs on pid {sibling.pid} ({sibling.state})"
    if found.sibling_gone and found.software.sibling is not None:
        work = found.software.sibling.work
        return f"lock of {software}, whose {work}'s connection is gone (its process died?)"
    if found.left_behind:
        return f"session lock of {software} on a session that runs no call of it (left behind?)"
    if found.call is not None and found.in_transaction:
        return f"{software}'s {found.call.call} returned in a transaction still open"
    if found.call is not None and not found.left_behind:
        session = found.entry.session
        if session is not None and session.state == "active":
            return f"{software}'s {found.call.call} at work"
    return ""


def _seen(holders: list[LockEntry]) -> str | None:
    """ "session" when a holder certainly holds it as a session lock."""
    return "session" if any(e.lifetime == "session" for e in holders) else None


def _key_line(report: WhoHolds) -> str:
    """The key's numbers and the SQL that takes it; a tag's numbers and what it is."""
    key, decoded = report.key, report.decoded
    if isinstance(key, AdvisoryTag):
        numbers = f"classid={key.classid} objid={key.objid} objsubid={key.objsubid}"
        return f"tag: pg_locks {numbers}: {key.meaning}"
    assert decoded is not None  # a key is always decoded (Diagnosis.who_holds)
    sql = lock_sql(decoded, _seen(report.holders), report.holders)
    return f"key: pg_locks {key}, {key.form} {key.describe()}; SQL: {sql}"


def who_holds_output(report: WhoHolds, snapshot: Snapshot) -> Output:
    now = snapshot.server.now
    key = report.key
    retry = retriers(report, snapshot)
    answer, next_step = cause_verdict(report, retry, snapshot)
    way_out = queue_lines(report)
    held = [e.held_at_least for e in report.holders if e.held_at_least is not None]
    waited = [e.waited for e in report.waiters if e.waited is not None]
    both = figures(max(held, default=None), max(waited, default=None))

    def blocks() -> list[Block]:
        holding = [HolderRow(e, now) for e in report.holders]
        queue = [WaiterRow(position, e) for position, e in enumerate(report.waiters, start=1)]
        holders = [cells_of(HOLDER_COLUMNS, row) for row in holding]
        waiters = [cells_of(WAITER_COLUMNS, row) for row in queue]
        return [
            # on a screen too small: the verdict stays, then the next step, then the rows
            Text([clean(verdict(report, snapshot))], "verdict", VERDICT),
            Text([answer], "verdict", VERDICT),
            Text([f"figures: {both}"] if both else []),
            Text(way_out, rank=STEP),
            Text(
                [f"{'then' if way_out else 'next'}: {clean(next_step)}"] if next_step else [],
                rank=STEP,
            ),
            Text([_key_line(report)]),
            table(
                HOLDER_COLUMNS,
                holders,
                title="Holders",
                empty="nobody holds it",
                compact=lambda i: holder_line(holding[i]),
            ),
            Text(unknown_ages(report.holders, "HELD"), "note"),
            Text(busy_note(busy_bounds(snapshot, report.holders), "HELD"), "note"),
            table(
                WAITER_COLUMNS,
                waiters,
                title="Waiters (in queue order, by wait start)",
                empty=f"nobody waits in pg_locks: {retry_words(retry)}"
                if retry
                else "nobody waits",
                compact=lambda i: waiter_line(queue[i]),
            ),
            *notes_block(report.notes),
        ]

    def data() -> dict[str, Any]:
        decoded = report.decoded
        return {
            "version": JSON_VERSION,
            "server": server_data(snapshot),
            "namespace": decoded.namespace.name if decoded and decoded.namespace else None,
            "resource": decoded.resource if decoded else None,
            "known": known_data(decoded.known) if decoded and decoded.known else None,
            "key": key_data(key, report.decoded, _seen(report.holders), report.holders),
            "held": report.held,
            "verdict": answer,
            "next_step": next_step,
            "queue": way_out,
            "figures": both,
            "summary": verdict(report, snapshot),
            "retrying": [p.session.pid for p in retry],
            "holders": [entry_data(e) for e in report.holders],
            "waiters": [entry_data(e) for e in report.waiters],
            "notes": report.notes,
        }

    return Output(blocks, data)
