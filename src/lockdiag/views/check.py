"""`lockdiag check`: findings as text, JSON, a Nagios line or Prometheus metrics, for one
server or a fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from lockdiag.core.findings import SEVERITIES, WAITS, CheckPolicy, Finding, Kind, figures
from lockdiag.core.incident import Cause, Incident
from lockdiag.core.ownership import Ownership
from lockdiag.durations import format_duration
from lockdiag.render import (
    DETAIL,
    STEP,
    VERDICT,
    Block,
    Output,
    Table,
    Text,
    clean,
    plugin_text,
    text_height,
)
from lockdiag.views.common import (
    JSON_VERSION,
    busy_bounds,
    busy_note,
    entry_data,
    notes_block,
    server_data,
)
from lockdiag.views.metrics import Metric, exposition, gauge, labelled, merged

NAGIOS_EXIT = {"OK": 0, "WARNING": 1, "CRITICAL": 2}


# -- check -------------------------------------------------------------------------------------


def check_output(incident: Incident, policy: CheckPolicy) -> Output:
    """The causes worst first as text (fitted to a screen), JSON, a table of causes for a
    ticket, a Nagios line and Prometheus metrics: one incident, every form."""
    report = incident.report
    # a bound from a session that keeps running statements: the rule could not judge it
    limit = policy.session_age.warning
    busy = [b for b in busy_bounds(report.snapshot, report.entries) if b.unjudged(limit)]
    why = f"--session-age {format_duration(limit)} cannot judge it from one read (watch can)"
    notes = report.notes + busy_note(busy, "held", why=why)

    def blocks(columns: int = 0, lines: int = 0) -> list[Block]:
        """Every cause in full, worst first, its findings and the waits it causes under it; on
        a terminal of ``lines`` lines, in full where they fit, then by heading only, the
        summary again at the end."""
        summary = Text([f"{incident.status}: {incident.summary()}"], "verdict", VERDICT)
        shown = [(cause_heading(c), cause_detail(c)) for c in incident.alerting]
        shown += [(finding_heading(f), _finding_detail(f)) for f in incident.unattached]
        noting = notes_block(notes)
        noted = [line for block in noting if isinstance(block, Text) for line in block.lines]
        room = lines - 4 - text_height(noted, columns)  # two summaries, a note, a prompt
        out: list[Block] = [summary]
        headings_only = 0
        tops = [text_height([heading], columns) for (heading, _), _ in shown]  # headings wrap
        for index, ((heading, style), detail) in enumerate(shown):
            top = tops[index]
            height = top + text_height(detail, columns)
            rest = sum(tops[index + 1 :])  # each later one takes its heading at least
            if lines and (headings_only or height + rest > room):
                # worst first: once one is cut, no lesser cause is shown in more detail; the
                # first cut one keeps what fits of its impact and its next step
                brief = _fitting(
                    _brief(detail) if not headings_only else [], room - top - rest, columns
                )
                kept = [Text(brief, rank=STEP if not index else DETAIL)] if brief else []
                out += [Text([heading], style, VERDICT), *kept]
                room -= top + text_height(brief, columns)
                headings_only += 1
                continue
            out += [
                Text([heading], style, VERDICT),
                Text(detail, rank=STEP if not index else DETAIL),
            ]
            room -= height
        if headings_only:
            said = (
                f"({headings_only} shown in part or by heading only: lockdiag check "
                "--format plain | less shows them all)"
            )
            out.append(Text([said], "note", VERDICT))
        out.append(Text(leader_lines(incident)))
        out += noting
        if lines and shown:
            out.append(summary)  # the verdict again where the eye ends
        return out

    def data() -> dict[str, Any]:
        critical, warning = incident.counts()
        return {
            "version": JSON_VERSION,
            "status": incident.status,
            "summary": {"critical": critical, "warning": warning, "waiting": incident.waiting},
            "server": server_data(report.snapshot),
            "causes": [_cause_data(c) for c in incident.alerting],
            "findings": [_finding_data(f) for f in _ranked_findings(incident)],
            "leaders": leaders_data(incident),
            "notes": notes,
        }

    return Output(
        blocks,
        data,
        screen=blocks,
        document=lambda: markdown_blocks(incident),
        status=lambda: nagios_line(incident, policy),
        metrics=lambda: exposition([up(1), *check_metrics(incident)]),
    )


def up(value: int | None = None) -> Metric:
    """``lockdiag_up``, as the exporter names it, so that one target-down alert rule serves
    the exporter, the textfile collector and a fleet's check."""
    return gauge("lockdiag_up", "Whether the check read its server (1) or not (0).", value)


def unknown_output(error: str, hint: str | None = None) -> Output:
    """What `check` says when it cannot decide (no server, a bad snapshot, registry or settings
    file, bad arguments, a bug), in every format, so that a monitor never reads silence:
    the verdict line, a JSON object with the error, the Nagios UNKNOWN line, and
    ``lockdiag_up 0`` with the error as a comment (a label would make each message a new
    series). Only the first line of a many-line error is shown, with how many more."""
    lines = error.splitlines() or ["unknown error"]
    more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
    reason = clean(lines[0]) + more
    return Output(
        lambda: [Text([f"UNKNOWN: {reason}"], "verdict")],
        lambda: {"version": JSON_VERSION, "status": "UNKNOWN", "error": error, "hint": hint},
        status=lambda: f"LOCKDIAG UNKNOWN - {plugin_text(reason)}",
        metrics=lambda: [f"# lockdiag error: {reason}", *exposition([up(0)])],
    )


Style = Literal["critical", "warning", "note"]
STYLE: dict[str, Style] = {"critical": "critical", "warning": "warning", "info": "note"}
CAUSE_HEADERS = [
    "SEVERITY",
    "KIND",
    "LOCK",
    "PID",
    "APPLICATION",
    "BLOCKED",
    "LONGEST WAIT",
    "NEXT STEP",
]


def _brief(detail: list[str]) -> list[str]:
    """A cause's detail when it cannot be shown whole: its impact (the first line), the lock
    queue's way out where there is one, and its next step (the last)."""
    if len(detail) <= 2:
        return detail
    first = [line for line in detail[1:-1] if line.startswith("  first: ")]
    return [detail[0], *first, detail[-1]]


def _fitting(lines: list[str], room: int, columns: int) -> list[str]:
    """The first of ``lines`` that fit in ``room`` screen lines, in order."""
    kept: list[str] = []
    for line in lines:
        height = text_height([line], columns)
        if height > room:
            break
        kept.append(line)
        room -= height
    return kept


def markdown_blocks(incident: Incident) -> list[Block]:
    """For a ticket or a channel: the verdict, one pipe table of causes in the incident's
    order (then the waits no cause accounts for), the notes."""
    rows = [_cause_row(c) for c in incident.alerting]
    rows += [
        [
            f.severity.upper(),
            f.kind.value,
            clean(f.lock),
            _pid(f.pid),
            "",
            "",
            "",
            clean(f.next_step),
        ]
        for f in incident.unattached
    ]
    return [
        Text([f"{incident.status}: {incident.summary()}"], "verdict"),
        Table(CAUSE_HEADERS, rows, title="Causes (worst first)", empty="no causes"),
        *notes_block(incident.report.notes),
    ]


def _cause_row(cause: Cause) -> list[str]:
    more = f" (+{cause.locks - 1} more)" if cause.locks > 1 else ""
    blocked = f"{cause.blocked} ({cause.blocked_directly} directly)" if cause.blocked else "0"
    return [
        (cause.severity or "warning").upper(),
        cause.kind_name,
        f"{clean(cause.label)}{more}",
        _pid(cause.pid),
        clean(cause.session.application_name) if cause.session else "",
        blocked,
        format_duration(cause.longest_wait) if cause.longest_wait is not None else "",
        clean(cause.next_step),
    ]


def _pid(pid: int | None) -> str:
    return str(pid) if pid is not None else ""


def cause_heading(cause: Cause) -> tuple[str, Style]:
    """``CRITICAL session-lock: tenant_summary 73 (+1 more)  pid 4163 (billing-worker)``:
    named by the lock others wait for, with the cause's severity (never below its waits')."""
    severity = cause.severity or "warning"
    more = f" (+{cause.locks - 1} more)" if cause.locks > 1 else ""
    kind = cause.kind_name
    return f"{severity.upper()} {kind}: {clean(cause.label)}{more}{_who(cause)}", STYLE[severity]


def _who(cause: Cause) -> str:
    if cause.pid is None:
        return ""
    app = cause.session.application_name if cause.session else None
    return f"  pid {cause.pid}" + (f" ({clean(app)})" if app else "")


def cause_detail(cause: Cause) -> list[str]:
    """Its impact, the lock queue's way out first where there is one, its findings, the
    figures where they need a word, the waits it causes, its owner, its next step."""
    detail = [f"  {cause.impact}"] if cause.impact else []
    queue = next((f for f in cause.symptoms if f.kind == Kind.LOCK_QUEUE), None)
    if queue is not None:
        detail += [f"  queue: {clean(queue.evidence)}", f"  first: {clean(queue.next_step)}"]
    if cause.findings:
        detail.append(f"  {clean(cause.findings[0].evidence)}")
    detail += [f"  also {f.kind} ({f.severity}): {clean(f.evidence)}" for f in cause.findings[1:]]
    both = figures(cause.age, cause.contended[0].longest_wait if cause.contended else None)
    if both is not None:
        detail.append(f"  figures: {both}")
    if cause.symptoms:
        detail.append(f"  {caused_line(cause.symptoms)}")
    if cause.owner is not None:
        detail.append(f"  {owner_line(cause.owner)}")
    detail.append(f"  {'then' if queue else 'next'}: {clean(cause.next_step)}")
    return detail


def leader_lines(incident: Incident) -> list[str]:
    """The leaders no session-lock finding speaks of (that finding names its leader): each
    with its standbys polling, failover named as the design."""
    said = {f.pid for f in incident.report.findings if f.kind == Kind.SESSION_LOCK}
    return [
        f"leader: {clean(leader.sentence())}; {clean(leader.declaration())}"
        for leader in incident.report.contention.leaders
        if leader.pid not in said
    ]


def leaders_data(incident: Incident) -> list[dict[str, Any]]:
    return [
        {
            "pid": leader.pid,
            "lock": leader.label,
            "namespace": leader.namespace,
            "standbys": [
                {"pid": p.session.pid, "application_name": p.session.application_name}
                for p in leader.standbys
            ],
            "evidence": leader.sentence(),
            "declaration": leader.declaration(),
        }
        for leader in incident.report.contention.leaders
    ]


def owner_line(owner: Ownership) -> str:
    """``evidence that its work is over: unknown (the session is idle: ...)``."""
    if owner.going_on:  # seen going on elsewhere: ``its work is not over: ... runs on pid 9``
        return f"its work is not over: {clean(owner.evidence)}"
    return f"evidence that its work is over: {owner.level} ({clean(owner.evidence)})"


def owner_data(owner: Ownership | None) -> dict[str, str] | None:
    return {"level": owner.level, "evidence": owner.evidence} if owner is not None else None


def finding_heading(finding: Finding) -> tuple[str, Style]:
    pid = f"  pid {finding.pid}" if finding.pid is not None else ""
    return (
        f"{finding.severity.upper()} {finding.kind}: {clean(finding.lock)}{pid}",
        STYLE[finding.severity],
    )


def _finding_detail(finding: Finding) -> list[str]:
    return [f"  {clean(finding.evidence)}", f"  next: {clean(finding.next_step)}"]


def _worst(findings: tuple[Finding, ...]) -> str:
    severities = {f.severity for f in findings}
    return next((s for s in ("critical", "warning") if s in severities), "info")


def caused_line(symptoms: tuple[Finding, ...]) -> str:
    """The findings inside a cause's chains (waits, mostly), folded into one line."""
    pids = list(dict.fromkeys(f.pid for f in symptoms))  # a session may have two findings
    who = ", ".join(f"pid {pid}" for pid in pids[:5]) + (" ..." if len(pids) > 5 else "")
    waits = [f.value or 0.0 for f in symptoms if f.kind in WAITS]
    longest = f", longest {format_duration(max(waits))}" if waits else ""
    what = "wait(s)" if len(waits) == len(symptoms) else "finding(s)"
    return f"causes {len(symptoms)} {_worst(symptoms).upper()} {what}{longest}: {who}"


def _ranked_findings(incident: Incident) -> list[Finding]:
    """Every finding once, in the incident's order: each cause's, then the waits it causes."""
    ranked = [f for c in incident.alerting for f in (*c.findings, *c.symptoms)]
    return [*ranked, *incident.unattached]


def _cause_data(cause: Cause) -> dict[str, Any]:
    return {
        "pid": cause.pid,
        "application_name": cause.session.application_name if cause.session else None,
        "kind": cause.kind_name,
        "severity": cause.severity,
        "lock": cause.label,
        "locks": cause.locks,
        "contended": [
            {"lock": c.label, "waiting": c.queue, "longest_wait": c.longest_wait}
            for c in cause.contended
        ],
        "blocked": cause.blocked,
        "blocked_directly": cause.blocked_directly,
        "longest_wait": cause.longest_wait,
        "held_at_least": cause.age,
        "evidence": cause.evidence,
        "owner_done": owner_data(cause.owner),
        "next_step": cause.next_step,
        "findings": [f.kind.value for f in cause.findings],
        "symptoms": [
            {"kind": f.kind.value, "pid": f.pid, "value": f.value} for f in cause.symptoms
        ],
    }


def _finding_data(finding: Finding) -> dict[str, Any]:
    entry = finding.entry
    return {
        "kind": finding.kind,
        "severity": finding.severity,
        "pid": finding.pid,
        "lock": finding.lock,
        "evidence": finding.evidence,
        "owner_done": owner_data(finding.owner),
        "next_step": finding.next_step,
        "value": finding.value,
        "lower_bound": finding.lower_bound,
        "locks": finding.locks,
        "lock_detail": entry_data(entry) if entry else None,
        "root_blocker": finding.root,
        "causes": [{"kind": f.kind, "pid": f.pid, "value": f.value} for f in finding.caused],
    }


def _metrics(incident: Incident) -> dict[str, float]:
    report = incident.report
    found = report.census
    return {
        "waiting": float(len({e.lock.pid for e in found.waiters})),
        "longest_wait": max((e.waited for e in found.waiters if e.waited), default=0.0),
        "oldest_session_lock": found.oldest_session_lock,
        "most_blocked": float(max((r.total for r in report.graph.roots), default=0)),
    }


def nagios_line(incident: Incident, policy: CheckPolicy) -> str:
    """One status line with perfdata, as monitoring plugins write it: the verdict, the count,
    then the worst cause, named by the lock others wait for."""
    report = incident.report
    metrics = _metrics(incident)
    summary = incident.summary()
    causes = incident.alerting
    if causes:
        heading, _ = cause_heading(causes[0])
        first = heading.split(" ", 1)[1].replace("  ", " ")
        summary += f"; {first}" + (f", {causes[0].impact}" if causes[0].impact else "")
    elif incident.unattached:
        summary += f"; {incident.unattached[0].kind}: {clean(incident.unattached[0].evidence)}"
    if report.notes:  # what could not be read changes what the status means
        note = clean(report.notes[0])
        summary += f"; {len(report.notes)} note(s): {note[:100]}{'…' if len(note) > 100 else ''}"

    def limits(threshold: Any) -> str:
        critical = "" if threshold.critical is None else f"{threshold.critical:g}"
        return f"{threshold.warning:g};{critical}"

    perfdata = [
        f"causes={len(incident.alerting)};;;0",
        f"findings={len(report.findings)};;;0",
        f"waiting={metrics['waiting']:g};;;0",
        f"longest_wait={metrics['longest_wait']:.3f}s;{limits(policy.wait_age)};0",
        f"oldest_session_lock={metrics['oldest_session_lock']:.3f}s;{limits(policy.session_age)};0",
        f"most_blocked={metrics['most_blocked']:g};{limits(policy.max_blocked)};0",
    ]
    return f"LOCKDIAG {incident.status} - {plugin_text(summary)} | {' '.join(perfdata)}"


def check_metrics(incident: Incident) -> list[Metric]:
    """The series of one check, for node_exporter's textfile collector. Label values are
    bounded: finding kinds and severities are fixed lists, namespaces come from the registry
    (every unregistered key counts under namespace="unregistered", every extension's advisory
    tag under namespace="(extension tag)")."""
    report = incident.report
    values = _metrics(incident)
    causes = Metric(
        "lockdiag_causes",
        "Causes of the last check (root blockers and findings nobody waits for), by severity: "
        "the count every view prints.",
    )
    critical, warning = incident.counts()
    causes.add(critical, severity="critical")
    causes.add(warning, severity="warning")
    causes.add(incident.info, severity="info")
    findings = Metric("lockdiag_findings", "Findings of the last check, by kind and severity.")
    for kind in Kind:
        for severity in SEVERITIES:
            count = sum(1 for f in report.findings if f.kind == kind and f.severity == severity)
            findings.add(count, kind=kind.value, severity=severity)
    alerting = Metric(
        "lockdiag_alerting_causes",
        "Causes of the last check (the causes of its JSON), by headline kind, severity, evidence "
        "that the holder's work is over (proven, declared, unknown) and pool of the pooler's "
        'server connection it holds on ("" when none).',
    )
    tally = Counter((c.kind_name, c.severity or "", *cause_labels(c)) for c in incident.alerting)
    for (headline, level, evidence, pool), count in sorted(tally.items()):
        alerting.add(count, kind=headline, severity=level, evidence=evidence, pool=pool)
    counts = report.census.advisory
    locks = Metric(
        "lockdiag_advisory_locks",
        "Advisory locks by database, namespace (the registry's, a known software's, "
        "(extension tag) or unregistered) and state.",
    )
    for (database, name, state), count in sorted(counts.items()):
        locks.add(count, database=database, namespace=name, state=state)
    polling = Metric(
        "lockdiag_polling_sessions",
        "Sessions whose last query is a try-lock and that hold no advisory lock (contention "
        "that leaves no row in pg_locks), by the namespace of the leader they stand by for "
        '("unknown" when none is held here).',
    )
    for name, count in sorted(report.contention.by_namespace().items()):
        polling.add(count, namespace=name)
    return [
        causes,
        alerting,
        findings,
        gauge("lockdiag_waiting_sessions", "Sessions waiting for a lock.", values["waiting"]),
        gauge(
            "lockdiag_longest_wait_seconds", "Longest current lock wait.", values["longest_wait"]
        ),
        gauge(
            "lockdiag_oldest_session_lock_seconds",
            "Oldest certain session-level advisory lock (a lower bound).",
            values["oldest_session_lock"],
        ),
        gauge(
            "lockdiag_most_blocked_sessions",
            "Sessions behind the worst root blocker.",
            values["most_blocked"],
        ),
        locks,
        polling,
    ]


def cause_labels(cause: Cause) -> tuple[str, str]:
    """A cause's evidence level (``unknown`` where none was weighed) and the pool of the
    pooler's server connection it holds on ("" when none), as series and the page name them."""
    link = cause.entry.pool if cause.entry is not None else None
    pool = (link.pool or link.pooler) if link is not None else ""
    return (cause.owner.level if cause.owner is not None else "unknown"), pool


# -- check across a fleet ----------------------------------------------------------------------

WORST_FIRST = ("CRITICAL", "UNKNOWN", "WARNING", "OK")  # the monitoring-plugin ranking
STATUS_EXIT = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}


def worst(statuses: list[str]) -> str:
    return next((s for s in WORST_FIRST if s in statuses), "OK")


def fleet_check_output(
    results: list[tuple[str, Incident | None, str | None]], policy: CheckPolicy
) -> tuple[Output, str]:
    """Every target's findings, and the worst status of all (a failed target is UNKNOWN); a
    single server's as :func:`check_output` gives them (one server is a fleet of one)."""
    if len(results) == 1 and results[0][1] is not None:
        return check_output(results[0][1], policy), results[0][1].status
    statuses = [report.status if report else "UNKNOWN" for _, report, _ in results]
    status = worst(statuses)

    def summary(target: str, report: Incident | None, error: str | None) -> str:
        if report is None:
            return f"{target} UNKNOWN ({error})"
        return f"{target} {report.status} ({report.summary()})"

    def nagios() -> str:
        reports = [report for _, report, _ in results if report]
        metrics = [_metrics(report) for report in reports]
        findings = sum(len(report.report.findings) for report in reports)
        line = f"LOCKDIAG {status} - {len(results)} target(s): " + "; ".join(
            summary(*result) for result in results
        )
        perfdata = [
            f"findings={findings};;;0",
            f"waiting={sum(m['waiting'] for m in metrics):g};;;0",
            f"longest_wait={max((m['longest_wait'] for m in metrics), default=0):.3f}s;;;0",
            f"failed_targets={statuses.count('UNKNOWN')};;;0",
        ]
        return f"{plugin_text(line)} | {' '.join(perfdata)}"

    def metrics_lines() -> list[str]:
        read = up()
        groups = [[read]]
        for target, report, _ in results:
            read.add(1 if report else 0, target=target)
            if report is not None:
                groups.append(labelled(check_metrics(report), "target", target))
        return exposition(merged(groups))

    def sections(part: Callable[[Incident], list[Block]]) -> list[Block]:
        """The verdict over every target, then each target's own blocks under its name."""
        out: list[Block] = [
            Text([f"{status}: " + "; ".join(summary(*r) for r in results)], "verdict")
        ]
        for target, report, _ in results:
            if report is None or not (report.alerting or report.unattached):
                continue
            out.append(Text([f"== {clean(target)}"], "verdict"))
            out += part(report)[1:]  # its own verdict is in the first line already
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "status": status,
            "targets": [
                {
                    "target": target,
                    "status": report.status if report else "UNKNOWN",
                    "error": error,
                    "server": server_data(report.report.snapshot) if report else None,
                    "causes": [_cause_data(c) for c in report.alerting] if report else [],
                    "findings": [_finding_data(f) for f in _ranked_findings(report)]
                    if report
                    else [],
                }
                for target, report, error in results
            ],
        }

    output = Output(
        lambda: sections(lambda report: check_output(report, policy).blocks()),
        data,
        document=lambda: sections(markdown_blocks),
        status=nagios,
        metrics=metrics_lines,
    )
    return output, status
