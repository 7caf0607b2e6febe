"""The exporter's page: its targets, up or down, the last error, findings and root blockers
now. Every string from a server is HTML-escaped."""

from __future__ import annotations

import html
from typing import Protocol

from lockdiag.core.incident import Incident
from lockdiag.durations import format_duration


class TargetState(Protocol):
    name: str
    report: Incident | None
    error: str | None
    seconds: float


def page(targets: list[TargetState], interval: float) -> str:
    rows = []
    for target in targets:
        report = target.report
        state = "up" if report is not None else "down"
        findings = "".join(
            f"<li class='{f.severity}'>{html.escape(f.severity.upper())} "
            f"{html.escape(str(f.kind))}: {html.escape(f.lock)} — {html.escape(f.evidence)}</li>"
            for f in (report.report.findings if report else [])
        )
        roots = "".join(
            f"<li>pid {root.tree.pid} blocks {root.total} session(s), longest wait "
            f"{format_duration(root.longest_wait or 0.0)}</li>"
            for root in (report.report.graph.roots if report else [])
        )
        rows.append(
            f"<tr><td>{html.escape(target.name)}</td><td class='{state}'>{state}</td>"
            f"<td>{html.escape(target.error or '')}</td><td>{target.seconds * 1000:.1f} ms</td>"
            f"<td><ul>{findings or '<li>no findings</li>'}</ul>"
            f"<ul>{roots}</ul></td></tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>lockdiag exporter</title>"
        "<style>body{font-family:sans-serif}td{vertical-align:top;padding:4px 8px}"
        ".down,.critical{color:#b00}.warning{color:#a60}.up{color:#070}</style></head><body>"
        "<h1>lockdiag exporter</h1>"
        f"<p><a href='/metrics'>/metrics</a> · /probe?target=NAME · sampling every "
        f"{format_duration(interval)}</p>"
        "<table><tr><th>target</th><th>state</th><th>last error</th><th>last scrape</th>"
        "<th>findings and root blockers at the last scrape</th></tr>"
        + "".join(rows)
        + "</table></body></html>\n"
    )
