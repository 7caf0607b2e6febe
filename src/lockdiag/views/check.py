"""`lockdiag check`: findings as text, JSON, a Nagios line or Prometheus metrics, for one
server or a fleet.
"""

from __future__ import annotations

from typing import Any, Literal

from lockdiag.core.findings import SEVERITIES, CheckPolicy, CheckReport, Finding, Kind
from lockdiag.durations import format_duration
from lockdiag.render import Block, Output, Text, clean, text_height
from lockdiag.views.common import (
    JSON_VERSION,
    entry_data,
    notes_block,
    server_data,
)
from lockdiag.views.metrics import Metric, exposition, gauge, labelled, merged

NAGIOS_EXIT = {"OK": 0, "WARNING": 1, "CRITICAL": 2}


# -- check -------------------------------------------------------------------------------------


def check_output(report: CheckReport, fmt: str, policy: CheckPolicy) -> Output:
    if fmt == "nagios":
        return Output(lambda: [Text([nagios_line(report, policy)])], dict)
    if fmt == "prometheus":
        return Output(lambda: [Text(exposition(check_metrics(report)))], dict)

    def blocks(columns: int = 0, lines: int = 0) -> list[Block]:
        """Every finding in full; on a terminal of ``lines`` lines, in full where they fit
        (the most urgent first), then their headings only, the summary again at the end."""
        findings = report.findings
        summary = Text([f"{report.status}: {_counts(findings)}"], "verdict")
        folded = {id(wait) for finding in findings for wait in finding.caused}
        shown = [f for f in findings if id(f) not in folded]  # waits: under their cause
        notes = notes_block(report.notes)
        noted = [line for block in notes if isinstance(block, Text) for line in block.lines]
        room = lines - 4 - text_height(noted, columns)  # two summaries, a note, a prompt
        out: list[Block] = [summary]
        headings_only = 0
        for index, finding in enumerate(shown):
            pid = f"  pid {finding.pid}" if finding.pid is not None else ""
            style: Literal["critical", "warning"] = finding.severity
            heading = f"{finding.severity.upper()} {finding.kind}: {clean(finding.lock)}{pid}"
            detail = [f"  {clean(finding.evidence)}"]
            if finding.caused:
                detail.append(f"  {_caused(finding)}")
            detail.append(f"  next: {clean(finding.next_step)}")
            height = 1 + text_height(detail, columns)
            rest = len(shown) - index - 1  # each later one takes a heading line at least
            if lines and height + rest > room:
                out.append(Text([heading], style))
                room -= 1
                headings_only += 1
                continue
            out += [Text([heading], style), Text(detail)]
            room -= height
        if headings_only:
            out.append(Text([f"({headings_only} shown by heading only: lockdiag check "
                             "--format plain | less shows them all)"], "note"))  # fmt: skip
        out += notes
        if lines and findings:
            out.append(summary)  # the verdict again where the eye ends
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "status": report.status,
            "server": server_data(report.snapshot),
            "findings": [_finding_data(f) for f in report.findings],
            "notes": report.notes,
        }

    return Output(blocks, data, screen=blocks)


def _worst(findings: tuple[Finding, ...]) -> Literal["critical", "warning"]:
    return "critical" if any(f.severity == "critical" for f in findings) else "warning"


def _caused(cause: Finding) -> str:
    """The waits a cause holds up, folded into one line."""
    waits = sorted(cause.caused, key=lambda f: -(f.value or 0.0))
    who = ", ".join(f"pid {w.pid}" for w in waits[:5]) + (" ..." if len(waits) > 5 else "")
    longest = format_duration(waits[0].value or 0.0)
    return f"causes {len(waits)} {_worst(cause.caused).upper()} wait(s), longest {longest}: {who}"


def _counts(findings: list[Finding]) -> str:
    if not findings:
        return "no findings"
    critical = sum(1 for f in findings if f.severity == "critical")
    return f"{critical} critical, {len(findings) - critical} warning"


def _finding_data(finding: Finding) -> dict[str, Any]:
    entry = finding.entry
    return {
        "kind": finding.kind,
        "severity": finding.severity,
        "pid": finding.pid,
        "lock": finding.lock,
        "evidence": finding.evidence,
        "next_step": finding.next_step,
        "value": finding.value,
        "lower_bound": finding.lower_bound,
        "locks": finding.locks,
        "lock_detail": entry_data(entry) if entry else None,
        "root_blocker": finding.root,
        "causes": [{"kind": f.kind, "pid": f.pid, "value": f.value} for f in finding.caused],
    }


def _metrics(report: CheckReport) -> dict[str, float]:
    found = report.census
    return {
        "waiting": float(len({e.lock.pid for e in found.waiters})),
        "longest_wait": max((e.waited for e in found.waiters if e.waited), default=0.0),
        "oldest_session_lock": found.oldest_session_lock,
        "most_blocked": float(max((r.total for r in report.graph.roots), default=0)),
    }


def nagios_line(report: CheckReport, policy: CheckPolicy) -> str:
    """One status line with perfdata, as monitoring plugins write it."""
    metrics = _metrics(report)
    summary = _counts(report.findings)
    if report.findings:
        first = report.findings[0]
        summary += f"; {first.kind}: {clean(first.evidence)}"
    if report.notes:  # what could not be read changes what the status means
        note = clean(report.notes[0])
        summary += f"; {len(report.notes)} note(s): {note[:100]}{'…' if len(note) > 100 else ''}"

    def limits(threshold: Any) -> str:
        critical = "" if threshold.critical is None else f"{threshold.critical:g}"
        return f"{threshold.warning:g};{critical}"

    perfdata = [
        f"findings={len(report.findings)};;;0",
        f"waiting={metrics['waiting']:g};;;0",
        f"longest_wait={metrics['longest_wait']:.3f}s;{limits(policy.wait_age)};0",
        f"oldest_session_lock={metrics['oldest_session_lock']:.3f}s;{limits(policy.session_age)};0",
        f"most_blocked={metrics['most_blocked']:g};{limits(policy.max_blocked)};0",
    ]
    return f"LOCKDIAG {report.status} - {summary} | {' '.join(perfdata)}"


def check_metrics(report: CheckReport) -> list[Metric]:
    """The series of one check, for node_exporter's textfile collector. Label values are
    bounded: finding kinds and severities are fixed lists, namespaces come from the registry
    (every unregistered key counts under namespace="unregistered")."""
    values = _metrics(report)
    findings = Metric("lockdiag_findings", "Findings of the last check, by kind and severity.")
    for kind in Kind:
        for severity in SEVERITIES:
            count = sum(1 for f in report.findings if f.kind == kind and f.severity == severity)
            findings.add(count, kind=kind.value, severity=severity)
    counts = report.census.advisory
    locks = Metric(
        "lockdiag_advisory_locks",
        "Advisory locks by database, namespace (the registry's, a known software's, or "
        "unregistered) and state.",
    )
    for (database, name, state), count in sorted(counts.items()):
        locks.add(count, database=database, namespace=name, state=state)
    return [
        findings,
        gauge("lockdiag_waiting_sessions", "Sessions waiting for a lock.", values["waiting"]),
        gauge("lockdiag_longest_wait_seconds", "Longest current lock wait.",
              values["longest_wait"]),
        gauge("lockdiag_oldest_session_lock_seconds",
              "Oldest certain session-level advisory lock (a lower bound).",
              values["oldest_session_lock"]),
        gauge("lockdiag_most_blocked_sessions", "Sessions behind the worst root blocker.",
              values["most_blocked"]),
        locks,
    ]  # fmt: skip


# -- check across a fleet ----------------------------------------------------------------------

WORST_FIRST = ("CRITICAL", "UNKNOWN", "WARNING", "OK")  # the monitoring-plugin ranking
STATUS_EXIT = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}


def worst(statuses: list[str]) -> str:
    return next((s for s in WORST_FIRST if s in statuses), "OK")


def fleet_check_output(
    results: list[tuple[str, CheckReport | None, str | None]], fmt: str, policy: CheckPolicy
) -> tuple[Output, str]:
    """Every target's findings, and the worst status of all (a failed target is UNKNOWN)."""
    statuses = [report.status if report else "UNKNOWN" for _, report, _ in results]
    status = worst(statuses)

    def summary(target: str, report: CheckReport | None, error: str | None) -> str:
        if report is None:
            return f"{target} UNKNOWN ({error})"
        return f"{target} {report.status} ({_counts(report.findings)})"

    if fmt == "nagios":
        reports = [report for _, report, _ in results if report]
        metrics = [_metrics(report) for report in reports]
        findings = sum(len(report.findings) for report in reports)
        line = f"LOCKDIAG {status} - {len(results)} target(s): " + "; ".join(
            summary(*result) for result in results
        )
        perfdata = [
            f"findings={findings};;;0",
            f"waiting={sum(m['waiting'] for m in metrics):g};;;0",
            f"longest_wait={max((m['longest_wait'] for m in metrics), default=0):.3f}s;;;0",
            f"failed_targets={statuses.count('UNKNOWN')};;;0",
        ]
        return Output(lambda: [Text([f"{clean(line)} | {' '.join(perfdata)}"])], dict), status
    if fmt == "prometheus":

        def metrics_lines() -> list[str]:
            up = Metric("lockdiag_target_up", "Whether the target could be read (1) or not (0).")
            groups = [[up]]
            for target, report, _ in results:
                up.add(1 if report else 0, target=target)
                if report is not None:
                    groups.append(labelled(check_metrics(report), "target", target))
            return exposition(merged(groups))

        return Output(lambda: [Text(metrics_lines())], dict), status

    def blocks() -> list[Block]:
        out: list[Block] = [
            Text([f"{status}: " + "; ".join(summary(*r) for r in results)], "verdict")
        ]
        for target, report, _ in results:
            if report is None or not report.findings:
                continue
            out.append(Text([f"== {clean(target)}"], "verdict"))
            out += check_output(report, "plain", policy).blocks()[1:]
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
                    "server": server_data(report.snapshot) if report else None,
                    "findings": [_finding_data(f) for f in report.findings] if report else [],
                }
                for target, report, error in results
            ],
        }

    return Output(blocks, data), status
