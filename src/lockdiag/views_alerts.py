"""Views of `blockers` (wait-for trees) and `check` (findings, Nagios, Prometheus)."""

from __future__ import annotations

import re
from typing import Any, Literal

from lockdiag.durations import format_duration
from lockdiag.findings import KINDS, SEVERITIES, CheckPolicy, CheckReport, Finding
from lockdiag.graph import Blockers, Node, Tree
from lockdiag.observe import Pattern, Sampler, patterns
from lockdiag.pooltest import ADVICE, Result
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.snapshot import Snapshot
from lockdiag.terminate import Preview
from lockdiag.views import JSON_VERSION, entry_data, lock_label, notes_block, server_data

NAGIOS_EXIT = {"OK": 0, "WARNING": 1, "CRITICAL": 2}

# -- blockers ----------------------------------------------------------------------------------


def _node_text(node: Node | None, pid: int, report: Blockers) -> str:
    server = report.snapshot.server
    if pid == 0:  # pg_blocking_pids() reports a prepared transaction as pid 0
        return "a prepared transaction (pid 0: COMMIT PREPARED or ROLLBACK PREPARED ends it)"
    if node is None or node.session is None:
        return f"pid {pid}"
    session = node.session
    parts = [f"pid {pid}"]
    if session.application_name:
        parts.append(clean(session.application_name))
    if session.hidden:
        parts.append("[state hidden]")
    elif session.state:
        since = ""
        if session.state_change is not None:
            since = f" {format_duration((server.now - session.state_change).total_seconds())}"
        parts.append(f"[{clean(session.state)}{since}]")
    if node.workers:
        parts.append(f"(+{len(node.workers)} parallel worker(s))")
    return " ".join(parts)


def tree_lines(tree: Tree, report: Blockers, prefix: str = "", last: bool = True) -> list[str]:
    node = report.nodes.get(tree.pid)
    server = report.snapshot.server
    if tree.edge is None:
        line = _node_text(node, tree.pid, report)
        if node and node.holds:
            held = ", ".join(dict.fromkeys(lock_label(e, server) for e in node.holds))
            line += f" holds {held}"
            bound = max((e.held_at_least or 0.0) for e in node.holds)
            if any(e.held_at_least is not None for e in node.holds):
                line += f" (≥ {format_duration(bound)})"
        lines = [line]
        child_prefix = ""
    else:
        branch = "└─ " if last else "├─ "
        line = prefix + branch + _node_text(node, tree.pid, report)
        if tree.cycle:
            line += "  ↺ cycle: already shown above"
        elif node is not None and node.waits is not None:
            waited = node.waits.waited
            line += f" waits {format_duration(waited)}" if waited is not None else " waits"
            line += f" for {lock_label(node.waits, server)} ({node.waits.lock.mode})"
            if tree.edge.kind == "queued":
                line += f", queued behind waiter {tree.edge.blocker} (not a holder)"
        lines = [line]
        child_prefix = prefix + ("   " if last else "│  ")
    for index, child in enumerate(tree.children):
        lines += tree_lines(child, report, child_prefix, index == len(tree.children) - 1)
    return lines


def _tree_data(tree: Tree) -> dict[str, Any]:
    return {
        "pid": tree.pid,
        "edge": tree.edge.kind if tree.edge else None,
        "cycle": tree.cycle,
        "children": [_tree_data(c) for c in tree.children],
    }


def blockers_output(report: Blockers) -> Output:
    def blocks() -> list[Block]:
        if not report.roots and not report.cycles:
            waiting = sum(1 for n in report.nodes.values() if n.waits)
            return [Text([f"no session waits for a lock ({waiting} waiting)" if waiting else
                          "no session waits for a lock"], "verdict")]  # fmt: skip
        out: list[Block] = []
        for number, root in enumerate(report.roots, start=1):
            longest = format_duration(root.longest_wait) if root.longest_wait is not None else "?"
            out.append(
                Text(
                    [
                        f"root blocker {number}: blocks {root.direct} directly, {root.total} in "
                        f"total, longest wait {longest}"
                    ],
                    "verdict",
                )
            )
            out.append(Text(tree_lines(root.tree, report)))
        for cycle in report.cycles:
            chain = " → ".join(map(str, [*cycle, cycle[0]]))
            out.append(
                Text(
                    [
                        f"cycle (a deadlock not yet broken; the server ends one of them after "
                        f"deadlock_timeout): {chain}"
                    ],
                    "error",
                )
            )
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "server": server_data(report.snapshot),
            "nodes": [_node_data(node) for node in report.nodes.values()],
            "edges": [
                {"waiter": e.waiter, "blocker": e.blocker, "kind": e.kind} for e in report.edges
            ],
            "roots": [
                {
                    "pid": r.tree.pid,
                    "direct": r.direct,
                    "total": r.total,
                    "longest_wait_seconds": r.longest_wait,
                    "tree": _tree_data(r.tree),
                }
                for r in report.roots
            ],
            "cycles": report.cycles,
        }

    return Output(blocks, data)


def _node_data(node: Node) -> dict[str, Any]:
    session = node.session
    return {
        "pid": node.pid,
        "application_name": session.application_name if session else None,
        "state": session.state if session else None,
        "user": session.user if session else None,
        "query": session.query if session else None,
        "parallel_workers": node.workers,
        "waits": entry_data(node.waits) if node.waits else None,
        "holds": [entry_data(e) for e in node.holds],
    }


# -- check -------------------------------------------------------------------------------------


def check_output(report: CheckReport, fmt: str, policy: CheckPolicy) -> Output:
    if fmt == "nagios":
        return Output(lambda: [Text([nagios_line(report, policy)])], dict)
    if fmt == "prometheus":
        return Output(lambda: [Text(prometheus_lines(report))], dict)

    def blocks() -> list[Block]:
        findings = report.findings
        out: list[Block] = [Text([f"{report.status}: {_counts(findings)}"], "verdict")]
        for finding in findings:
            pid = f"  pid {finding.pid}" if finding.pid is not None else ""
            style: Literal["error", "note"] = "error" if finding.severity == "critical" else "note"
            out.append(
                Text(
                    [f"{finding.severity.upper()} {finding.kind}: {clean(finding.lock)}{pid}"],
                    style,
                )
            )
            out.append(
                Text([f"  {clean(finding.evidence)}", f"  next: {clean(finding.next_step)}"])
            )
        return [
            *out,
            *notes_block(_privilege_notes(report)),
        ]

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "status": report.status,
            "server": server_data(report.snapshot),
            "findings": [_finding_data(f) for f in report.findings],
            "notes": _privilege_notes(report),
        }

    return Output(blocks, data)


def _privilege_notes(report: CheckReport) -> list[str]:
    from lockdiag.analysis import privilege_notes

    return privilege_notes(report.snapshot, report.entries)


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
        "lower_bound": finding.kind in ("session-lock", "stuck-owner", "max-hold"),
        "locks": finding.locks,
        "lock_detail": entry_data(entry) if entry else None,
    }


def _metrics(report: CheckReport) -> dict[str, float]:
    entries = report.entries
    waits = [e.waited for e in entries if e.waited is not None]
    session_locks = [
        e.held_at_least for e in entries if e.lifetime == "session" and e.held_at_least is not None
    ]
    return {
        "waiting": float(len({e.lock.pid for e in entries if not e.lock.granted})),
        "longest_wait": max(waits, default=0.0),
        "oldest_session_lock": max(session_locks, default=0.0),
        "most_blocked": float(max((r.total for r in report.graph.roots), default=0)),
    }


def nagios_line(report: CheckReport, policy: CheckPolicy) -> str:
    """One status line with perfdata, as monitoring plugins write it."""
    metrics = _metrics(report)
    summary = _counts(report.findings)
    if report.findings:
        first = report.findings[0]
        summary += f"; {first.kind}: {clean(first.evidence)}"

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


_LABEL_UNSAFE = re.compile(r'["\\\n]')


def _label(value: str) -> str:
    return _LABEL_UNSAFE.sub(lambda m: {"\n": "\\n"}.get(m.group(), "\\" + m.group()), value)


def prometheus_lines(report: CheckReport) -> list[str]:
    """Text exposition format, for node_exporter's textfile collector. Label values are
    bounded: finding kinds and severities are fixed lists, namespaces come from the registry
    (every unregistered key counts under namespace="unregistered")."""
    metrics = _metrics(report)
    lines = [
        "# HELP lockdiag_findings Findings of the last check, by kind and severity.",
        "# TYPE lockdiag_findings gauge",
    ]
    for kind in KINDS:
        for severity in SEVERITIES:
            count = sum(1 for f in report.findings if f.kind == kind and f.severity == severity)
            lines.append(f'lockdiag_findings{{kind="{kind}",severity="{severity}"}} {count}')
    gauges = [
        ("waiting_sessions", "Sessions waiting for a lock.", metrics["waiting"]),
        ("longest_wait_seconds", "Longest current lock wait.", metrics["longest_wait"]),
        (
            "oldest_session_lock_seconds",
            "Oldest certain session-level advisory lock (a lower bound).",
            metrics["oldest_session_lock"],
        ),
        (
            "most_blocked_sessions",
            "Sessions behind the worst root blocker.",
            metrics["most_blocked"],
        ),
    ]
    for name, text, value in gauges:
        lines += [f"# HELP lockdiag_{name} {text}", f"# TYPE lockdiag_{name} gauge"]
        lines.append(f"lockdiag_{name} {value:g}")
    counts: dict[tuple[str, str], int] = {}
    for entry in report.entries:
        if entry.decoded is None:
            continue
        name = entry.decoded.namespace.name if entry.decoded.namespace else "unregistered"
        state = "held" if entry.lock.granted else "waiting"
        counts[(name, state)] = counts.get((name, state), 0) + 1
    lines += [
        "# HELP lockdiag_advisory_locks Advisory locks by registry namespace and state.",
        "# TYPE lockdiag_advisory_locks gauge",
    ]
    for (name, state), count in sorted(counts.items()):
        lines.append(
            f'lockdiag_advisory_locks{{namespace="{_label(name)}",state="{state}"}} {count}'
        )
    return lines


# -- terminate ---------------------------------------------------------------------------------


def terminate_preview_output(preview: Preview, snapshot: Snapshot, cancel: bool) -> Output:
    server = snapshot.server
    session = preview.session

    def blocks() -> list[Block]:
        who = f"pid {preview.pid}"
        if session.application_name:
            who += f" ({clean(session.application_name)})"
        details = [
            f"{who}: user {clean(session.user)}, database {clean(session.database)}, "
            f"client {clean(session.client) or 'local socket'}, "
            f"state {clean(session.state) or 'hidden'}",
            f"query: {clean(session.query)}",
        ]
        if preview.waits is not None:
            details.append(f"waits for {lock_label(preview.waits, server)}")
        if preview.blocked:
            details.append(
                f"holds up {len(preview.blocked)} session(s): "
                + ", ".join(map(str, preview.blocked[:20]))
                + (" ..." if len(preview.blocked) > 20 else "")
            )
        rows = [
            [
                lock_label(e, server),
                e.lock.mode.removesuffix("Lock"),
                e.lifetime or "",
                ",".join(map(str, e.blocks)),
            ]
            for e in preview.releases
        ]
        action = (
            "cancelling its query releases its transaction-level locks only; session-level "
            "locks stay held"
            if cancel
            else "ending the session releases every lock below"
        )
        return [
            Text(details),
            Table(["LOCK", "MODE", "LIFETIME", "BLOCKS"], rows, title=action, empty="no locks"),
        ]

    def data() -> dict[str, Any]:
        return {
            "pid": preview.pid,
            "action": "cancel" if cancel else "terminate",
            "application_name": session.application_name,
            "user": session.user,
            "client_addr": session.client_addr,
            "state": session.state,
            "query": session.query,
            "holds": [entry_data(e) for e in preview.holds],
            "waits": entry_data(preview.waits) if preview.waits else None,
            "blocked": preview.blocked,
        }

    return Output(blocks, data)


# -- pooltest ----------------------------------------------------------------------------------


def pooltest_output(results: list[Result], left: int) -> Output:
    unsafe = [r for r in results if not r.ok]

    def blocks() -> list[Block]:
        rows = [[r.scenario, r.safe, r.observed, "ok" if r.ok else "UNSAFE"] for r in results]
        out: list[Block] = [
            Table(["SCENARIO", "A SAFE SETUP GIVES", "OBSERVED", "VERDICT"], rows, wide={1, 2}),
        ]
        if unsafe:
            summary = (
                f"{len(unsafe)} unsafe behaviour(s): advisory locks through this pool do not "
                "protect what they should."
            )
            out.append(Text([summary], "error"))
            out.append(Text([f"- {line}" for line in ADVICE]))
        else:
            out.append(Text(["every scenario behaved safely"], "verdict"))
        if left:
            out.append(Text([f"{left} holder(s) of the test key could not be released"], "error"))
        return out

    def data() -> dict[str, Any]:
        return {
            "safe": not unsafe and not left,
            "results": [
                {"scenario": r.scenario, "safe": r.safe, "observed": r.observed, "ok": r.ok}
                for r in results
            ],
            "left_behind": left,
            "advice": ADVICE if unsafe else [],
        }

    return Output(blocks, data)


# -- sample ------------------------------------------------------------------------------------


def _namespace_rows(sampler: Sampler) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for stats in sampler.keys.values():
        name = stats.namespace or "unregistered"
        row = totals.setdefault(
            name,
            {"keys": 0, "held_samples": 0, "waited_samples": 0, "longest_hold": 0.0,
             "longest_wait": 0.0, "acquisitions": 0, "releases": 0},
        )  # fmt: skip
        row["keys"] += 1
        row["held_samples"] += stats.samples_held
        row["waited_samples"] += stats.samples_waited
        row["longest_hold"] = max(row["longest_hold"], stats.longest_hold)
        row["longest_wait"] = max(row["longest_wait"], stats.longest_wait)
        row["acquisitions"] += stats.acquisitions
        row["releases"] += stats.releases
    return totals


def sample_output(sampler: Sampler, fmt: str, interval: float) -> Output:
    found = patterns(sampler)
    ordered = sorted(
        sampler.keys.values(), key=lambda s: (-s.samples_waited, -s.samples_held, s.label)
    )
    costs = sorted(sampler.query_seconds) or [0.0]
    median_ms = costs[len(costs) // 2] * 1000

    if fmt == "prometheus":
        return Output(lambda: [Text(_sample_metrics(sampler, found, median_ms))], dict)

    def blocks() -> list[Block]:
        def percent(count: int) -> str:
            return f"{100 * count / sampler.samples:.0f}%" if sampler.samples else "-"

        rows = [
            [
                clean(s.label),
                clean(s.database),
                percent(s.samples_held),
                percent(s.samples_waited),
                str(len(s.holder_pids)),
                str(len(s.waiter_pids)),
                format_duration(s.longest_hold),
                format_duration(s.longest_wait) if s.samples_waited else "",
                f"~{s.acquisitions}/{s.releases}",
                f"{100 * s.contention:.0f}%",
            ]
            for s in ordered
        ]
        lines = [
            f"{sampler.samples} sample(s) every {format_duration(interval)}; cost: "
            f"{median_ms:.1f} ms per sample (median round trip, max {costs[-1] * 1000:.1f} ms), "
            f"{sampler.samples} read(s) of pg_locks in total"
        ]
        out: list[Block] = [
            Text(lines, "verdict"),
            Table(
                [
                    "KEY",
                    "DATABASE",
                    "HELD",
                    "WAITED",
                    "HOLDERS",
                    "WAITERS",
                    "LONGEST HOLD",
                    "LONGEST WAIT",
                    "ACQ/REL",
                    "CONTENTION",
                ],
                rows,
                title="Per key (HELD, WAITED: share of samples; ACQ/REL: estimated acquisitions "
                "and releases)",
                wide={0},
                empty="no advisory lock seen",
            ),
        ]
        if found:
            out.append(Text([f"{p.kind}: {clean(p.label)}: {p.evidence}" for p in found], "note"))
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "samples": sampler.samples,
            "interval_seconds": interval,
            "started": sampler.started.isoformat() if sampler.started else None,
            "ended": sampler.ended.isoformat() if sampler.ended else None,
            "cost": {
                "pg_locks_reads": sampler.samples,
                "median_seconds": costs[len(costs) // 2],
                "max_seconds": costs[-1],
            },
            "keys": [
                {
                    "key": s.label,
                    "database": s.database,
                    "namespace": s.namespace,
                    "samples_held": s.samples_held,
                    "samples_waited": s.samples_waited,
                    "holders": [{"application_name": a, "client": c} for a, c in sorted(s.holders)],
                    "distinct_holders": len(s.holder_pids),
                    "distinct_waiters": len(s.waiter_pids),
                    "longest_hold_seconds": s.longest_hold,
                    "longest_wait_seconds": s.longest_wait,
                    "acquisitions": s.acquisitions,
                    "releases": s.releases,
                    "contention": s.contention,
                }
                for s in ordered
            ],
            "namespaces": _namespace_rows(sampler),
            "patterns": [{"kind": p.kind, "key": p.label, "evidence": p.evidence} for p in found],
        }

    return Output(blocks, data)


def _sample_metrics(sampler: Sampler, found: list[Pattern], median_ms: float) -> list[str]:
    """Per namespace only: keys are unbounded, namespaces come from the registry."""
    lines = [
        "# HELP lockdiag_sample_samples Samples taken.",
        "# TYPE lockdiag_sample_samples gauge",
        f"lockdiag_sample_samples {sampler.samples}",
        "# HELP lockdiag_sample_seconds_per_sample Median round trip of one snapshot.",
        "# TYPE lockdiag_sample_seconds_per_sample gauge",
        f"lockdiag_sample_seconds_per_sample {median_ms / 1000:g}",
    ]
    metrics = [
        ("held_samples", "Samples in which a key of the namespace was held."),
        ("waited_samples", "Samples in which a key of the namespace was waited for."),
        ("longest_hold", "Longest observed hold, seconds."),
        ("longest_wait", "Longest observed wait, seconds."),
        ("acquisitions", "Estimated acquisitions while sampling."),
    ]
    rows = _namespace_rows(sampler)
    for name, text in metrics:
        metric = f"lockdiag_sample_{name}"
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
        for namespace, row in sorted(rows.items()):
            lines.append(f'{metric}{{namespace="{_label(namespace)}"}} {row[name]:g}')
    lines += [
        "# HELP lockdiag_sample_patterns Patterns seen, by kind.",
        "# TYPE lockdiag_sample_patterns gauge",
    ]
    for kind in ("stuck-owner", "broad-key", "duplicate-dispatch"):
        lines.append(
            f'lockdiag_sample_patterns{{kind="{kind}"}} {sum(1 for p in found if p.kind == kind)}'
        )
    return lines


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
            lines: list[str] = []
            seen: set[str] = set()
            for target, report, _ in results:
                up = 1 if report else 0
                lines.append(f'lockdiag_target_up{{target="{_label(target)}"}} {up}')
                for line in prometheus_lines(report) if report else []:
                    if line.startswith("#"):
                        if line not in seen:
                            seen.add(line)
                            lines.append(line)
                        continue
                    name, _, rest = line.partition(" ")
                    labelled = (
                        name.replace("{", f'{{target="{_label(target)}",', 1)
                        if "{" in name
                        else f'{name}{{target="{_label(target)}"}}'
                    )
                    lines.append(f"{labelled} {rest}")
            return lines

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
