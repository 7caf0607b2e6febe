"""`lockdiag log`: the incident after it ended, from PostgreSQL's own log.

Per key its episodes, most total wait first; per namespace the totals; the deadlocks and the
statements cancelled while they waited; a timeline for one key. Every string that came from
the log (application, user, statement) passes through :func:`clean`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from lockdiag.keys import AdvisoryTag
from lockdiag.logs import (
    DATABASE_NAMES,
    GZIP_RATIO,
    MAX_LINE,
    OPEN_HOLDERS,
    OPEN_WAITS,
    Cancellation,
    Damage,
    Deadlock,
    Episode,
    Identity,
    KeyReport,
    LogReport,
    ReadCounts,
    Stretch,
    byte_size,
)
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.views.common import JSON_VERSION

SHOWN_PIDS = 6  # per cell on a terminal and in plain text; markdown and csv keep every pid


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1000:
        return f"{value:.0f}ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{rest:02d}s"


def _time(moment: datetime | None) -> str:
    """Month, day and time to the millisecond: the year is in the heading's span."""
    return moment.isoformat(sep=" ", timespec="milliseconds")[5:] if moment else ""


def _span(moment: datetime | None) -> str:
    return moment.isoformat(sep=" ", timespec="milliseconds") if moment else ""


def _identity(who: Identity) -> str:
    """``billing-worker (app)``: the application and, in brackets, the user; no comma, so
    that a list of sessions is cut between sessions."""
    if who.user:
        return f"{clean(who.application)} ({clean(who.user)})".lstrip()
    return clean(who.application)


def _who(pid: int, who: Identity) -> str:
    return f"{pid} {_identity(who)}".rstrip()


def _people(people: dict[int, Identity], limit: int | None, left_out: int = 0) -> str:
    items = list(people.items())
    shown = items if limit is None else items[:limit]
    text = ", ".join(_who(pid, who) for pid, who in shown)
    more = len(items) - len(shown) + left_out
    return f"{text}, +{more}" if more else text


def _outcomes(outcomes: dict[str, int]) -> str:
    order = sorted(outcomes.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{count} {name}" for name, count in order)


def _read_lines(reads: list[ReadCounts]) -> list[str]:
    lines = []
    for read in reads:
        layout = f" (prefix {read.prefix!r})" if read.format == "stderr" and read.prefix else ""
        lines.append(
            f"{clean(read.name)}: {read.format or 'empty'}{layout}, {read.lines} line(s), "
            f"{read.entries} entr{'y' if read.entries == 1 else 'ies'}"
        )
    return lines


def _notes(report: LogReport) -> list[str]:
    notes = []
    for read in report.reads:
        name = clean(read.name)
        if read.unparsed:
            notes.append(f"{name}: {read.unparsed} line(s) could not be read and were skipped")
        if read.cut_short:
            notes.append(f"{name}: the last line is cut short (a file still being written?)")
        notes += _damage_notes(name, read.damage)
        if read.outside:
            notes.append(f"{name}: {read.outside} lock entr(ies) outside --since/--until")
        if read.foreign:
            notes.append(
                f"{name}: {read.foreign} entr(ies) are in another language (lc_messages), e.g. "
                f"{clean(read.foreign_sample)!r}: lockdiag reads English messages only; set "
                "lc_messages = 'C' (or 'en_US.UTF-8') so that the next incident can be read"
            )
    if report.waits_closed_early:
        notes.append(
            f"{report.waits_closed_early} wait(s) closed while open, as 'no end logged' (their "
            f"last figure, a lower bound): more than {OPEN_WAITS:,} waits were open at once (or "
            f"{OPEN_HOLDERS:,} holders listed by them), more than a server has sessions: the "
            "oldest were closed first; an end of one logged later counts as another wait"
        )
    if report.database_names_left_out:
        notes.append(
            f"{report.database_names_left_out} lock entr(ies) on databases past the first "
            f"{DATABASE_NAMES:,} named: those databases are shown by OID"
        )
    if report.unnamed_lock_timeouts:
        notes.append(
            f"{report.unnamed_lock_timeouts} lock timeout(s) fired before deadlock_timeout: "
            "the log does not say which lock (lower deadlock_timeout, or raise lock_timeout)"
        )
    if not report.keys and not report.deadlock_count and not report.cancellation_count:
        notes.append(
            "no lock wait, deadlock or lock timeout in the log: is log_lock_waits on? "
            "(waits shorter than deadlock_timeout are never logged)"
        )
    return notes


def _damage_notes(name: str, damage: Damage) -> list[str]:
    notes = []
    if damage.nul_count:
        notes.append(
            f"{name}: {byte_size(damage.nul_bytes)} in {damage.nul_count} stretch(es) of NUL "
            f"bytes skipped (what a crash leaves in a log), with the partial line before each: "
            f"{_places(damage.nul_stretches, damage.nul_count)}; the rest was read"
        )
    if damage.long_count:
        notes.append(
            f"{name}: {damage.long_count} line(s) longer than {byte_size(MAX_LINE)} skipped "
            f"({byte_size(damage.long_bytes)}): {_places(damage.long_lines, damage.long_count)}"
        )
    if damage.undecodable:
        notes.append(f"{name}: {damage.undecodable} byte(s) that are not UTF-8 shown as U+FFFD")
    if damage.inflate_limit is not None:
        notes.append(
            f"{name}: read up to {byte_size(damage.inflate_limit)} of text only: the gzip data "
            f"inflates to more than {GZIP_RATIO} times its size (a decompression bomb?); to "
            f"read it all: zcat {name} | lockdiag log -"
        )
    return notes


def _places(stretches: list[Stretch], count: int) -> str:
    listed = ", ".join(f"{byte_size(s.length)} at byte {s.offset}" for s in stretches)
    return listed + (f" and {count - len(stretches)} more" if count > len(stretches) else "")


def _episode_row(
    key: KeyReport, episode: Episode, limit: int | None, when: Callable[[datetime | None], str]
) -> list[str]:
    return [
        clean(key.label),
        clean(key.database),
        when(episode.first),
        when(episode.last),
        str(episode.waits),
        _ms(episode.longest_ms),
        _ms(episode.total_ms),
        _people(episode.holders, limit),
        _people(episode.waiters, limit, episode.pids_left_out),
        _outcomes(episode.outcomes),
    ]


EPISODE_HEADERS = [
    "KEY",
    "DATABASE",
    "FIRST SEEN",
    "LAST SEEN",
    "WAITS",
    "LONGEST",
    "TOTAL",
    "HOLDERS",
    "WAITERS",
    "OUTCOMES",
]


def _deadlock_row(
    report: LogReport, deadlock: Deadlock, when: Callable[[datetime | None], str]
) -> list[str]:
    cycle = "; ".join(
        f"{step.pid} waits for {step.mode} on {clean(report.label(step.tag))}, held by "
        f"{step.blocked_by}"
        for step in deadlock.cycle
    )
    victim = _who(deadlock.victim, deadlock.victim_identity) if deadlock.victim else ""
    return [when(deadlock.time), victim, cycle, clean(deadlock.statement)]


def _cancellation_row(
    report: LogReport, cancelled: Cancellation, when: Callable[[datetime | None], str]
) -> list[str]:
    who = _who(cancelled.pid, cancelled.identity) if cancelled.pid is not None else ""
    return [
        when(cancelled.time),
        cancelled.kind,
        who,
        clean(report.label(cancelled.tag)),
        _ms(cancelled.waited_ms),
        clean(cancelled.statement),
    ]


def _timeline_label(report: LogReport) -> str:
    key = report.timeline_key
    assert key is not None
    if isinstance(key, AdvisoryTag):  # its label is its numbers
        return key.label
    named = next((k.label for k in report.keys if k.tally.tag.advisory == key), None)
    return f"{clean(named)} {key.describe()}" if named else key.describe()


def log_output(report: LogReport) -> Output:
    """The post-mortem: what was read, the episodes per key, the namespaces, the deadlocks and
    the cancellations; with a key asked for, its timeline first."""

    def tables(limit: int | None, when: Callable[[datetime | None], str]) -> list[Block]:
        out: list[Block] = []
        if report.timeline_key is not None:
            out.append(
                Table(
                    ["TIME", "EVENT", "PID", "WHO", "WAITED", "DETAIL"],
                    [
                        [
                            when(e.time),
                            e.event,
                            str(e.pid or ""),
                            _identity(e.identity),
                            _ms(e.waited_ms),
                            e.detail,
                        ]
                        for e in report.timeline
                    ],
                    title=f"Timeline of {_timeline_label(report)}",
                    essential={0, 1},
                    optional=[5, 3],
                    wide={5},
                    empty="this key appears in no lock message of the log",
                    left_out=report.timeline_left_out,
                )
            )
        out.append(
            Table(
                EPISODE_HEADERS,
                [
                    _episode_row(key, episode, limit, when)
                    for key in report.keys
                    for episode in key.tally.episodes
                ],
                title="Lock waits per key, most total wait first (one row per episode)",
                essential={0},
                words={7, 8},
                optional=[1, 9, 3, 5],
                wide={7, 8, 9},
                empty="no lock wait logged",
                left_out=sum(key.tally.episodes_left_out for key in report.keys),
            )
        )
        out.append(
            Table(
                ["NAMESPACE", "KEYS", "WAITS", "LONGEST", "TOTAL", "IN DEADLOCKS"],
                [
                    [
                        clean(n.namespace),
                        str(n.keys),
                        str(n.waits),
                        _ms(n.longest_ms),
                        _ms(n.total_ms),
                        str(n.deadlocks),
                    ]
                    for n in report.namespaces
                ],
                title="Per namespace",
                essential={0},
            )
        )
        if report.deadlock_count:
            out.append(
                Table(
                    ["TIME", "CANCELLED", "CYCLE", "STATEMENT CANCELLED"],
                    [_deadlock_row(report, d, when) for d in report.deadlocks],
                    title=f"Deadlocks ({report.deadlock_count})",
                    essential={0, 1},
                    wide={2, 3},
                    optional=[3],
                    left_out=report.deadlock_count - len(report.deadlocks),
                )
            )
        if report.cancellation_count:
            out.append(
                Table(
                    ["TIME", "CANCELLED BY", "PID", "KEY", "WAITED", "STATEMENT"],
                    [_cancellation_row(report, c, when) for c in report.cancellations],
                    title=f"Statements cancelled while waiting ({report.cancellation_count})",
                    essential={0, 1},
                    wide={3, 5},
                    optional=[5, 2],
                    left_out=report.cancellation_count - len(report.cancellations),
                )
            )
        return out

    def heading() -> list[Block]:
        span = (
            f"entries from {_span(report.first)} to {_span(report.last)}"
            if report.first
            else "no lock entry"
            if not report.keys
            else "no times (the prefix has no %m, %t or %n)"
        )
        waits = sum(k.tally.waits for k in report.keys)
        head = [
            f"{waits} lock wait(s) on {len(report.keys)} lock(s), {report.deadlock_count} "
            f"deadlock(s), {report.cancellation_count} statement(s) cancelled while waiting; "
            f"{span}"
        ]
        return [Text(head, "verdict"), Text(_read_lines(report.reads))]

    def blocks() -> list[Block]:
        notes = _notes(report)
        return [
            *heading(),
            *([Text(notes, "warning")] if notes else []),
            *tables(SHOWN_PIDS, _time),
        ]

    def document() -> list[Block]:  # markdown and csv: every pid (csv takes the first table)
        notes = _notes(report)
        return [*heading(), *([Text(notes, "warning")] if notes else []), *tables(None, _span)]

    return Output(blocks, lambda: log_data(report), document=document)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _people_data(people: dict[int, Identity]) -> list[dict[str, Any]]:
    return [
        {
            "pid": pid,
            "application_name": who.application,
            "user": who.user,
            "database": who.database,
        }
        for pid, who in people.items()
    ]


def log_data(report: LogReport) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "files": [
            {
                "name": r.name,
                "format": r.format,
                "prefix": r.prefix,
                "lines": r.lines,
                "entries": r.entries,
                "unparsed_lines": r.unparsed,
                "foreign_entries": r.foreign,
                "outside_range": r.outside,
                "last_line_cut_short": r.cut_short,
                "damage": {
                    "nul_bytes": r.damage.nul_bytes,
                    "nul_stretches": r.damage.nul_count,
                    "long_lines": r.damage.long_count,
                    "long_line_bytes": r.damage.long_bytes,
                    "skipped": [
                        [s.offset, s.length]
                        for s in sorted(r.damage.nul_stretches + r.damage.long_lines)
                    ],
                    "undecodable_bytes": r.damage.undecodable,
                    "gzip_truncated": r.damage.truncated,
                    "gzip_read_up_to": r.damage.inflate_limit,
                },
            }
            for r in report.reads
        ],
        "first": _iso(report.first),
        "last": _iso(report.last),
        "keys": [_key_data(key) for key in report.keys],
        "namespaces": [
            {
                "namespace": n.namespace,
                "keys": n.keys,
                "waits": n.waits,
                "longest_wait_ms": n.longest_ms,
                "total_wait_ms": n.total_ms,
                "deadlocks": n.deadlocks,
            }
            for n in report.namespaces
        ],
        "deadlocks": [
            {
                "time": _iso(d.time),
                "cancelled_pid": d.victim,
                "cancelled_application_name": d.victim_identity.application,
                "cancelled_user": d.victim_identity.user,
                "statement": d.statement,
                "cycle": [
                    {
                        "pid": s.pid,
                        "mode": s.mode,
                        "lock": s.tag.text,
                        "key": report.label(s.tag),
                        "blocked_by": s.blocked_by,
                        "query": s.query,
                    }
                    for s in d.cycle
                ],
            }
            for d in report.deadlocks
        ],
        "deadlock_count": report.deadlock_count,
        "cancellations": [
            {
                "time": _iso(c.time),
                "kind": c.kind,
                "pid": c.pid,
                "application_name": c.identity.application,
                "user": c.identity.user,
                "lock": c.tag.text if c.tag else None,
                "key": report.label(c.tag) if c.tag else None,
                "waited_ms": c.waited_ms,
                "statement": c.statement,
            }
            for c in report.cancellations
        ],
        "cancellation_count": report.cancellation_count,
        "lock_timeouts_without_lock": report.unnamed_lock_timeouts,
        "timeline": None
        if report.timeline_key is None
        else [
            {
                "time": _iso(e.time),
                "event": e.event,
                "pid": e.pid,
                "application_name": e.identity.application,
                "user": e.identity.user,
                "waited_ms": e.waited_ms,
                "detail": e.detail,
            }
            for e in report.timeline
        ],
        "timeline_left_out": report.timeline_left_out,
        "waits_closed_early": report.waits_closed_early,
        "database_names_left_out": report.database_names_left_out,
        "notes": _notes(report),
    }


def _key_data(key: KeyReport) -> dict[str, Any]:
    tally, tag, decoded = key.tally, key.tally.tag, key.decoded
    advisory = tag.advisory or tag.tag
    return {
        "key": key.label,
        "namespace": key.namespace,
        "resource": decoded.resource if decoded else None,
        "lock": tag.text,
        "locktype": tag.kind,
        "database_oid": tag.database,
        "database": key.database,
        "relation_oid": tag.relation,
        "classid": advisory.classid if advisory else None,
        "objid": advisory.objid if advisory else None,
        "objsubid": advisory.objsubid if advisory else None,
        "waits": tally.waits,
        "longest_wait_ms": tally.longest_ms,
        "total_wait_ms": tally.total_ms,
        "first_seen": _iso(tally.first),
        "last_seen": _iso(tally.last),
        "deadlocks": tally.deadlocks,
        "nowait_failures": tally.failures,
        "outcomes": tally.outcomes,
        "keys_counted_together": tally.folded,
        "episodes_left_out": tally.episodes_left_out,
        "episodes": [
            {
                "first_seen": _iso(e.first),
                "last_seen": _iso(e.last),
                "waits": e.waits,
                "longest_wait_ms": e.longest_ms,
                "total_wait_ms": e.total_ms,
                "holders": _people_data(e.holders),
                "waiters": _people_data(e.waiters),
                "pids_left_out": e.pids_left_out,
                "outcomes": e.outcomes,
            }
            for e in tally.episodes
        ],
    }
