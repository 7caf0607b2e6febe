"""The exporter's page: an incident page, one section per target.

Each target leads with its state (up, or unknown because it is down, since when and why), the
time of its last scrape, its status and the incident's summary; then its causes in the one
order every view shares (:mod:`lockdiag.core.incident`), each saying what `check` says in the
order `check` says it (:func:`lockdiag.views.check.cause_heading`, ``cause_detail``) with
the holder's session beside it (its pool, when it is a pooler's server connection, and how
sure lockdiag is that its work is over: proven, declared, unknown); the waits each cause
makes under it; then the waits no cause accounts for, the root blockers below every threshold
and the snapshot's notes.

Plain HTML and CSS, no script; it reloads itself (a load takes a scrape). Every string from a
server — application names, queries, lock labels, errors, target names — is HTML-escaped.
"""

from __future__ import annotations

import html
import math
import time
from datetime import datetime, timezone
from typing import Protocol

from lockdiag.core.findings import Finding
from lockdiag.core.incident import Cause, Incident
from lockdiag.core.model import PoolLink
from lockdiag.durations import format_duration
from lockdiag.render import clean
from lockdiag.views.check import caused_line, owner_line

REFRESH_FLOOR = 15  # seconds: the page takes a scrape per load, so never faster than this
SYMPTOMS_OPEN = 3  # a cause's waits are listed open up to this many, folded beyond
QUERY_CHARS = 300


class TargetState(Protocol):
    @property
    def name(self) -> str: ...

    report: Incident | None
    error: str | None
    seconds: float
    taken_at: float  # time.monotonic() when the last scrape ended (0.0: never)
    down_since: float | None  # time.time() when the target went down, None while it is up
    stalled: bool  # it did not answer in time: retried in the background, scrapes do not wait


def page(targets: list[TargetState], interval: float) -> str:
    refresh = max(REFRESH_FLOOR, math.ceil(interval))
    sections = [_target(index, target) for index, target in enumerate(targets)]
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<meta http-equiv='refresh' content='{refresh}'>"
        f"<title>{html.escape(_title(targets))}</title><style>{STYLE}</style></head><body>"
        "<header><h1>lockdiag exporter</h1>"
        f"<p class='meta'><a href='/metrics'>/metrics</a> · /probe?target=NAME · sampling "
        f"every {format_duration(interval)} · this page reloads every {refresh}s (each load "
        "takes a scrape)</p>"
        f"{_overview(targets)}</header><main>{''.join(sections)}</main></body></html>\n"
    )


def _title(targets: list[TargetState]) -> str:
    statuses = [t.report.status if t.report is not None else "UNKNOWN" for t in targets]
    worst = next((s for s in ("CRITICAL", "UNKNOWN", "WARNING", "OK") if s in statuses), "OK")
    return f"{worst} · lockdiag exporter" if targets else "lockdiag exporter"


def _overview(targets: list[TargetState]) -> str:
    """One line per target, linking to its section: the whole fleet at a glance."""
    if len(targets) < 2:
        return ""
    rows = []
    for index, target in enumerate(targets):
        report = target.report
        status = report.status if report is not None else "UNKNOWN"
        said = report.summary() if report is not None else f"down: {target.error or '?'}"
        rows.append(
            f"<li><a href='#t{index}'>{_e(target.name)}</a> "
            f"<span class='badge {status.lower()}'>{status}</span> {_e(said)}</li>"
        )
    return f"<ul class='overview'>{''.join(rows)}</ul>"


# -- one target --------------------------------------------------------------------------------


def _target(index: int, target: TargetState) -> str:
    report = target.report
    scraped = _scraped_at(target)
    if report is None:
        state = f"unknown — target down since {_down_since(target, scraped)}: " + (
            target.error or "no answer"
        )
        if target.stalled:
            state += " (retried in the background; scrapes do not wait for it)"
        return (
            f"<section class='target unknown' id='t{index}'><h2>{_e(target.name)} "
            "<span class='badge unknown'>UNKNOWN</span></h2>"
            f"<p class='state down'>{_e(state)}</p>"
            f"<p class='meta'>last scrape {_last_scrape(scraped)}, took {_took(target)}</p>"
            "</section>"
        )
    server = report.report.snapshot.server
    status = report.status
    body = [_cause(cause, report) for cause in report.alerting]
    body += [_loose(finding) for finding in report.unattached]
    if not body:
        body.append("<p class='quiet'>no cause: nobody waits long, no lock held too long</p>")
    return (
        f"<section class='target {status.lower()}' id='t{index}'><h2>{_e(target.name)} "
        f"<span class='badge up'>up</span> <span class='badge {status.lower()}'>{status}</span>"
        f"</h2><p class='summary'>{status}: {_e(report.summary())}</p>"
        f"<p class='meta'>last scrape {_last_scrape(scraped)}, took {_took(target)} · "
        f"server time {_clock(server.now)} · PostgreSQL {_e(server.version)}"
        + (f" · database {_e(server.database)}" if server.database else "")
        + "</p>"
        + "".join(body)
        + _quiet_causes(report)
        + _notes(report.report.notes)
        + "</section>"
    )


def _scraped_at(target: TargetState) -> datetime | None:
    """The wall-clock time of the last scrape, from the exporter's monotonic ``taken_at``."""
    taken = target.taken_at
    if taken <= 0:
        return None
    ago = max(0.0, time.monotonic() - taken)
    return datetime.fromtimestamp(time.time() - ago, timezone.utc)


def _last_scrape(scraped: datetime | None) -> str:
    """``16:52:10 UTC (3s ago)``."""
    if scraped is None:
        return "at an unknown time"
    ago = (datetime.now(timezone.utc) - scraped).total_seconds()
    return f"{_clock(scraped)} ({format_duration(ago) + ' ago' if ago >= 1 else 'just now'})"


def _took(target: TargetState) -> str:
    return f"{target.seconds * 1000:.1f} ms"


def _down_since(target: TargetState, scraped: datetime | None) -> str:
    since = target.down_since
    if since is not None:
        return _clock(datetime.fromtimestamp(since, timezone.utc))
    # The exporter keeps only its last scrape: down then, maybe for longer.
    return f"{_clock(scraped)} or earlier" if scraped is not None else "an unknown time"


# -- causes ------------------------------------------------------------------------------------


def _cause(cause: Cause, incident: Incident) -> str:
    """`check`'s heading and detail, in its order, with the holder's session as facts."""
    severity = cause.severity or "warning"
    kind = cause.kind_name
    more = f" <span class='more'>(+{cause.locks - 1} more)</span>" if cause.locks > 1 else ""
    heading = (
        f"<h3><span class='sev'>{severity.upper()}</span> {_e(kind)}: "
        f"<span class='lock'>{_e(cause.label)}</span>{more}{_who(cause)}</h3>"
    )
    detail = [f"<p class='impact'>{_e(cause.impact)}</p>"] if cause.impact else []
    if cause.findings:
        detail.append(f"<p class='evidence'>{_e(cause.findings[0].evidence)}</p>")
    if len(cause.findings) > 1:
        detail.append(
            "<ul class='also'>"
            + "".join(
                f"<li class='{f.severity}'>also {_e(f.kind.value)} ({f.severity}): "
                f"{_e(f.evidence)}</li>"
                for f in cause.findings[1:]
            )
            + "</ul>"
        )
    if cause.symptoms:
        detail.append(_symptoms(cause.symptoms))
    if cause.owner is not None:
        detail.append(f"<p class='owner'>{_e(owner_line(cause.owner))}</p>")
    detail.append(f"<p class='next'><b>next:</b> {_e(cause.next_step)}</p>")
    return (
        f"<article class='cause {severity}'>{heading}{_facts(cause, incident)}"
        f"{''.join(detail)}</article>"
    )


def _who(cause: Cause) -> str:
    if cause.pid is None:
        return ""
    app = cause.session.application_name if cause.session else None
    return f" <span class='who'>pid {cause.pid}" + (f" ({_e(app)})" if app else "") + "</span>"


def _facts(cause: Cause, incident: Incident) -> str:
    """The holder's state and since when, its waiters, the longest wait, who it is."""
    now = incident.report.snapshot.server.now
    session = cause.session
    facts: list[tuple[str, str]] = []
    if session is not None and session.hidden:
        facts.append(("holder", "hidden (needs pg_read_all_stats)"))
    elif session is not None and session.state:
        since = ""
        if session.state_change is not None:
            age = max(0.0, (now - session.state_change).total_seconds())
            since = f" for {format_duration(age)} (since {_clock(session.state_change, now)})"
        facts.append(("holder", _e(session.state) + since))
    link = cause.entry.pool if cause.entry is not None else None
    if link is not None:
        facts.append(("pool", _e(_pool(link))))
    if cause.owner is not None:
        facts.append(("its work is over", _e(cause.owner.level)))
    waiters = f"{cause.blocked} ({cause.blocked_directly} directly)" if cause.blocked else "none"
    facts.append(("waiters", waiters))
    if cause.longest_wait is not None:
        facts.append(("longest wait", format_duration(cause.longest_wait)))
    if cause.age is not None:
        facts.append(("held at least", format_duration(cause.age)))
    if len(cause.contended) > 1:
        facts.append(
            (
                "also waited for",
                ", ".join(f"{_e(c.label)} ({c.queue} waiting)" for c in cause.contended[1:]),
            )
        )
    if session is not None:
        where = [s for s in (session.user, session.database, session.client_addr) if s is not None]
        if where:
            facts.append(("user · database · client", " · ".join(_e(s) for s in where)))
        if session.query and not session.hidden:
            query = clean(session.query)
            short = query if len(query) <= QUERY_CHARS else query[:QUERY_CHARS] + "…"
            facts.append(("last query", f"<code>{html.escape(short)}</code>"))
    cells = "".join(f"<div><dt>{name}</dt><dd>{value}</dd></div>" for name, value in facts)
    return f"<dl class='facts'>{cells}</dl>"


def _pool(link: PoolLink) -> str:
    """``postgres/app (transaction) at 127.0.0.1:6432, no client attached``."""
    mode = f" ({link.pool_mode})" if link.pool_mode else ""
    if link.via == "address":
        return f"a server connection of the pooler at {link.pooler} (its console not read)"
    client = f"client {link.client} attached" if link.client else "no client attached"
    return f"{link.pool or '?'}{mode} at {link.pooler}, {client}"


def _symptoms(symptoms: tuple[Finding, ...]) -> str:
    """The waits a cause makes: `check`'s folded line as the summary, each one under it."""
    items = "".join(
        f"<li class='{f.severity}'><span class='sev'>{f.severity.upper()}</span> "
        f"{_e(f.kind.value)}: {_e(f.evidence)}</li>"
        for f in symptoms
    )
    opened = " open" if len(symptoms) <= SYMPTOMS_OPEN else ""
    return (
        f"<details class='symptoms'{opened}><summary>{_e(caused_line(symptoms))}</summary>"
        f"<ul>{items}</ul></details>"
    )


def _loose(finding: Finding) -> str:
    """A finding no cause accounts for (a wait whose root is not found: a deadlock)."""
    pid = f" <span class='who'>pid {finding.pid}</span>" if finding.pid is not None else ""
    return (
        f"<article class='cause {finding.severity}'><h3><span class='sev'>"
        f"{finding.severity.upper()}</span> {_e(finding.kind.value)}: "
        f"<span class='lock'>{_e(finding.lock)}</span>{pid}</h3>"
        f"<p class='evidence'>{_e(finding.evidence)}</p>"
        f"<p class='next'><b>next:</b> {_e(finding.next_step)}</p></article>"
    )


def _quiet_causes(incident: Incident) -> str:
    """Root blockers below every threshold: not alerting, but others wait for them."""
    quiet = [c for c in incident.causes if not c.alerts]
    if not quiet:
        return ""
    items = "".join(
        f"<li><span class='lock'>{_e(c.label)}</span>{_who(c)}: {_e(c.impact or c.evidence)}</li>"
        for c in quiet
    )
    return (
        f"<details class='other'><summary>{len(quiet)} other root blocker(s), below every "
        f"threshold</summary><ul>{items}</ul></details>"
    )


def _notes(notes: list[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{_e(note)}</li>" for note in notes)
    return f"<div class='notes'><h4>notes</h4><ul>{items}</ul></div>"


# -- helpers -----------------------------------------------------------------------------------


def _e(text: str | None) -> str:
    """A server's string, safe in HTML text and attributes, on one line."""
    return html.escape(clean(text))


def _clock(moment: datetime, reference: datetime | None = None) -> str:
    """``14:03:37 UTC``, with the date unless it is ``reference``'s (or today's)."""
    utc = moment.astimezone(timezone.utc) if moment.tzinfo else moment
    day = (reference or datetime.now(timezone.utc)).astimezone(timezone.utc).date()
    return utc.strftime("%H:%M:%S UTC" if utc.date() == day else "%Y-%m-%d %H:%M:%S UTC")


STYLE = """
:root{--crit:#b3261e;--warn:#9a5b00;--ok:#1e6b2f;--ink:#1d1d1f;--mute:#5f6368;--line:#dadce0}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);
margin:0 auto;padding:12px 16px 32px;max-width:1180px;overflow-wrap:anywhere}
h1{font-size:1.3rem;margin:0 0 2px}
h2{font-size:1.15rem;margin:0 0 4px}
h3{font-size:1rem;margin:0 0 6px;font-weight:600}
h4{margin:8px 0 2px;font-size:.9rem}
p{margin:4px 0}
a{color:#0b57d0}
.meta,.quiet{color:var(--mute);font-size:.87rem}
.overview{margin:8px 0 0;padding-left:18px;font-size:.9rem}
.target{border-top:3px solid var(--line);margin-top:18px;padding-top:10px}
.target.critical{border-top-color:var(--crit)}
.target.warning{border-top-color:var(--warn)}
.target.ok{border-top-color:var(--ok)}
.target.unknown{border-top-color:#6b3fa0}
.badge{display:inline-block;font-size:.75rem;font-weight:700;padding:1px 7px;
border-radius:9px;vertical-align:2px;color:#fff;background:var(--mute)}
.badge.up,.badge.ok{background:var(--ok)}
.badge.critical{background:var(--crit)}
.badge.warning{background:var(--warn)}
.badge.unknown{background:#6b3fa0}
.summary{font-weight:600}
.state.down{font-weight:600;color:#6b3fa0}
.cause{border:1px solid var(--line);border-left:5px solid var(--warn);border-radius:6px;
padding:8px 12px;margin:10px 0;background:#fff}
.cause.critical{border-left-color:var(--crit)}
.cause .sev{font-weight:700}
.cause.critical>h3 .sev,li.critical>.sev{color:var(--crit)}
.cause.warning>h3 .sev,li.warning>.sev{color:var(--warn)}
.lock{font-family:ui-monospace,Menlo,Consolas,monospace;background:#f1f3f4;padding:0 4px;
border-radius:3px}
.who,.more{color:var(--mute);font-weight:400}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:4px 16px;
margin:4px 0 6px;padding:6px 8px;background:#f8f9fa;border-radius:4px}
.facts div{min-width:0}
.facts dt{font-size:.72rem;text-transform:uppercase;letter-spacing:.03em;color:var(--mute)}
.facts dd{margin:0;font-size:.9rem}
.facts code{font-size:.8rem}
.facts div:has(code){grid-column:1/-1}
.impact{font-weight:600}
.also{margin:2px 0;padding-left:20px;font-size:.92rem}
.symptoms,.other{margin:4px 0;font-size:.92rem}
.symptoms summary,.other summary{cursor:pointer}
.symptoms ul,.other ul{margin:2px 0;padding-left:20px}
.next{background:#e8f0fe;border-radius:4px;padding:4px 8px;margin-top:6px}
.notes{color:var(--mute);font-size:.87rem}
.notes ul{margin:0;padding-left:20px}
@media (max-width:640px){body{padding:8px;font-size:14px}
.facts{grid-template-columns:1fr 1fr}}
"""
