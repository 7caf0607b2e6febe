"""`lockdiag sample`: per-key and per-namespace statistics over time, and their patterns."""

from __future__ import annotations

from typing import Any

from lockdiag.core.observe import KeyStats, Pattern, Sampler, patterns
from lockdiag.durations import format_duration
from lockdiag.keys import TAG_NAMESPACE
from lockdiag.render import STEP, Block, Output, Table, Text, clean
from lockdiag.views.common import (
    JSON_VERSION,
)
from lockdiag.views.metrics import Metric, exposition, gauge

# -- sample ------------------------------------------------------------------------------------


def _namespace_rows(sampler: Sampler) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for stats in sampler.keys.values():
        name = stats.namespace or (TAG_NAMESPACE if stats.tag else "unregistered")
        row = totals.setdefault(
            name,
            {
                "keys": 0,
                "held_samples": 0,
                "waited_samples": 0,
                "longest_hold": 0.0,
                "longest_wait": 0.0,
                "acquisitions": 0,
                "releases": 0,
            },
        )
        row["keys"] += stats.keys
        row["held_samples"] += stats.samples_held
        row["waited_samples"] += stats.samples_waited
        row["longest_hold"] = max(row["longest_hold"], stats.longest_hold)
        row["longest_wait"] = max(row["longest_wait"], stats.longest_wait)
        row["acquisitions"] += stats.acquisitions
        row["releases"] += stats.releases
    return totals


FOLD_AT = 3  # keys of one namespace held by one session, nobody waiting: folded into one row


def fold(ordered: list[KeyStats]) -> list[tuple[str, list[KeyStats]]]:
    """The table's rows as (label, keys): FOLD_AT or more keys of one database and namespace,
    held by one session, that nobody waited for, become one row at the place of the first,
    labelled like `list`'s ("500 x invoice_pdf_export 10000..10499", counting the keys)."""
    groups: dict[tuple[object, ...], list[KeyStats]] = {}
    for stats in ordered:
        if stats.namespace is not None and not stats.waiter_pids and len(stats.holder_pids) == 1:
            groups.setdefault((stats.database, stats.namespace, *stats.holder_pids), []).append(
                stats
            )
    folded = {id(m): g for g in groups.values() if len(g) >= FOLD_AT for m in g}
    rows: list[tuple[str, list[KeyStats]]] = []
    for stats in ordered:
        group = folded.get(id(stats))
        if group is None:
            rows.append((stats.label, [stats]))
        elif group[0] is stats:
            resources = sorted(r for m in group if (r := m.resource) is not None)
            span = f"{resources[0]}..{resources[-1]}" if resources else ""
            keys = sum(m.keys for m in group)
            rows.append((f"{keys} x {stats.namespace} {span}".rstrip(), group))
    return rows


def _seconds(value: float) -> str:
    return f"{round(value, 2):g}s" if value < 60 else format_duration(value)


def sample_output(sampler: Sampler, interval: float, duration: float | None = None) -> Output:
    """The report: the header (duration, samples achieved, interval) first, then the callouts,
    then the per-key table, folded for reading, every row for a ticket or a spreadsheet.
    ``duration`` is the one asked for, when the caller passes it; the header always gives the
    time the samples spanned."""
    found = patterns(sampler)
    ordered = sorted(
        sampler.keys.values(), key=lambda s: (-s.samples_waited, -s.samples_held, s.label)
    )
    costs = sorted(sampler.query_seconds) or [0.0]
    median_ms = costs[len(costs) // 2] * 1000
    spanned = (
        (sampler.ended - sampler.started).total_seconds()
        if sampler.started and sampler.ended
        else 0.0
    )

    achieved = achieved_interval(sampler)
    standing = sampler.standing

    def blocks(folded: bool = True) -> list[Block]:
        def percent(count: int) -> str:
            return f"{100 * count / sampler.samples:.0f}%" if sampler.samples else "-"

        def row(label: str, group: list[KeyStats]) -> list[str]:
            s = group[0]
            if len(group) == 1:
                return [
                    clean(label),
                    clean(s.database),
                    percent(s.samples_held),
                    percent(s.samples_waited),
                    str(len(s.holder_pids)),
                    str(len(s.waiter_pids)),
                    _at_least(s.longest_seen),
                    _at_least(s.held_at_least),
                    f"≥ {format_duration(s.longest_wait)}" if s.samples_waited else "",
                    _turns(group),
                    f"{100 * s.contention:.0f}%",
                ]
            return [  # one session's keys that nobody waited for: no wait, no contention
                clean(label),
                clean(s.database),
                percent(max(m.samples_held for m in group)),
                percent(0),
                "1",
                "0",
                _at_least(max(m.longest_seen for m in group)),
                _at_least(max(m.held_at_least for m in group)),
                "",
                _turns(group),
                "0%",
            ]

        grouped = fold(ordered) if folded else [(s.label, [s]) for s in ordered]
        rows = [row(label, group) for label, group in grouped]
        asked = f" of {_seconds(duration)} asked for" if duration is not None else ""
        expected = f" of {max(1, int(duration / interval))} expected" if duration else ""
        lines = [
            f"sampled {_seconds(spanned)}{asked} (first to last sample): "
            f"{sampler.samples}{expected} sample(s), every {format_duration(interval)}"
            + _achieved(achieved, interval),
            f"cost: {median_ms:.1f} ms per read of pg_locks (median round trip, max "
            f"{costs[-1] * 1000:.1f} ms), {sampler.reads} read(s) in total" + _reads(sampler),
        ]
        in_spans = sum(s.keys for s in sampler.keys.values() if s.keys > 1)
        if in_spans:
            lines.append(
                f"{in_spans:,} lock(s) read as spans (a session's keys in a range, nobody "
                "waiting): their acquisitions and releases are not known (ACQ/REL ?)"
            )
        out: list[Block] = [Text(lines, "verdict")]
        # the patterns and leaders are sample's answer: on a small screen they outstay the
        # per-key rows (a leader's 500-key neighbour must not push it off)
        if found:
            callouts = [f"{p.kind}: {clean(p.label)}: {p.evidence}" for p in found]
            out.append(Text(callouts, "note", STEP))
        if standing.leaders:
            said = [s.sentence(standing.reads) for s in standing.leaders.values()]
            out.append(Text([f"leader: {clean(sentence)}" for sentence in said], "note", STEP))
        out.append(
            Table(
                [
                    "KEY",
                    "DATABASE",
                    "HELD",
                    "WAITED",
                    "HOLDERS",
                    "WAITERS",
                    "SEEN HELD",
                    "LOWER BOUND",
                    "LONGEST WAIT",
                    "ACQ/REL",
                    "CONTENTION",
                ],
                rows,
                title="Per key (HELD, WAITED: share of samples; SEEN HELD: the longest one session "
                "was seen holding it at every look, within the sampling; LOWER BOUND: the "
                "longest hold one read proves, since its holder went idle or since a wait it "
                "caused began; LONGEST WAIT: as seen, a lower bound; ACQ/REL: estimated "
                "acquisitions and releases)",
                essential={0},  # a key is never cut: 73 must not read as 7…
                optional=[1, 9, 7, 8, 6],
                empty="no advisory lock seen",
            )
        )
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "samples": sampler.samples,
            "interval_seconds": interval,
            "achieved_interval_seconds": achieved,
            "duration_seconds": duration,
            "sampled_seconds": spanned,
            "started": sampler.started.isoformat() if sampler.started else None,
            "ended": sampler.ended.isoformat() if sampler.ended else None,
            "cost": {
                "pg_locks_reads": sampler.reads,
                "read_interval_seconds": sampler.read_interval,
                "median_seconds": costs[len(costs) // 2],
                "max_seconds": costs[-1],
            },
            "keys": [
                {
                    "key": s.label,
                    "database": s.database,
                    "namespace": s.namespace,
                    **({"extension_tag": True} if s.tag else {}),
                    "samples_held": s.samples_held,
                    "samples_waited": s.samples_waited,
                    "holders": [{"application_name": a, "client": c} for a, c in sorted(s.holders)],
                    "holder_pids": [
                        {"pid": pid, "application_name": s.names.get(pid)}
                        for pid in sorted(s.holder_pids)
                    ],
                    "waiter_pids": [
                        {"pid": pid, "application_name": s.names.get(pid)}
                        for pid in sorted(s.waiter_pids)
                    ],
                    "distinct_holders": len(s.holder_pids),
                    "distinct_waiters": len(s.waiter_pids),
                    "longest_hold_seconds": s.longest_hold,
                    "seen_held_seconds": s.longest_seen,
                    "held_at_least_seconds": s.held_at_least,
                    "longest_wait_seconds": s.longest_wait,
                    "acquisitions": s.acquisitions if s.keys == 1 else None,
                    "releases": s.releases if s.keys == 1 else None,
                    "keys": s.keys,
                    "contention": s.contention,
                }
                for s in ordered
            ],
            "namespaces": _namespace_rows(sampler),
            "patterns": [{"kind": p.kind, "key": p.label, "evidence": p.evidence} for p in found],
            "leaders": [
                {
                    "pid": seen.leader.pid,
                    "key": seen.leader.label,
                    "namespace": seen.leader.namespace,
                    "reads": seen.reads,
                    "standby_pids": sorted(seen.standbys),
                    "evidence": seen.sentence(standing.reads),
                }
                for seen in standing.leaders.values()
            ],
            "polling_sessions": {name: len(pids) for name, pids in standing.polling.items()},
        }

    return Output(
        blocks,
        data,
        document=lambda: blocks(folded=False),
        metrics=lambda: _sample_metrics(sampler, found, median_ms),
    )


def achieved_interval(sampler: Sampler) -> float | None:
    """The mean time between samples, first to last; None with fewer than two."""
    if sampler.samples < 2 or sampler.started is None or sampler.ended is None:
        return None
    return (sampler.ended - sampler.started).total_seconds() / (sampler.samples - 1)


BEHIND = 1.25  # an achieved interval this much longer than the one asked is said plainly


def behind(achieved: float | None, interval: float) -> bool:
    return achieved is not None and achieved > interval * BEHIND


def _achieved(achieved: float | None, interval: float) -> str:
    if not behind(achieved, interval):
        return ""
    assert achieved is not None
    return (
        f"; achieved every {format_duration(achieved)} only (each sample took "
        f"longer than the interval): episodes shorter than that can be missed"
    )


def _reads(sampler: Sampler) -> str:
    """How often the lock table was read, when not at every sample."""
    if sampler.reads == sampler.samples:
        return ""
    every = sampler.read_interval
    rate = f", one every {format_duration(every)}" if every is not None else ""
    return (
        f"{rate}: the other samples found pg_stat_activity unchanged since the last read, "
        "whose locks they count again"
    )


def _turns(group: list[KeyStats]) -> str:
    """ACQ/REL: estimated acquisitions and releases; '?' for a span's keys (not known)."""
    if any(m.keys > 1 for m in group):
        return "?"
    return f"~{sum(m.acquisitions for m in group)}/{sum(m.releases for m in group)}"


def _at_least(seconds: float) -> str:
    return f"≥ {format_duration(seconds)}" if seconds else ""


def _sample_metrics(sampler: Sampler, found: list[Pattern], median_ms: float) -> list[str]:
    """Per namespace only: keys are unbounded, namespaces come from the registry."""
    metrics = [
        gauge("lockdiag_sample_samples", "Samples taken.", sampler.samples),
        gauge(
            "lockdiag_sample_seconds_per_sample",
            "Median round trip of one snapshot.",
            median_ms / 1000,
        ),
        gauge(
            "lockdiag_sample_interval_seconds",
            "Mean time between samples, achieved.",
            achieved_interval(sampler) or 0.0,
        ),
    ]
    per_namespace = [
        ("held_samples", "Samples in which a key of the namespace was held."),
        ("waited_samples", "Samples in which a key of the namespace was waited for."),
        ("longest_hold", "Longest observed hold, seconds."),
        ("longest_wait", "Longest observed wait, seconds."),
        ("acquisitions", "Estimated acquisitions while sampling."),
    ]
    rows = _namespace_rows(sampler)
    for name, text in per_namespace:
        metric = Metric(f"lockdiag_sample_{name}", text)
        for namespace, row in sorted(rows.items()):
            metric.add(row[name], namespace=namespace)
        metrics.append(metric)
    polling = Metric(
        "lockdiag_sample_polling_sessions",
        "Sessions seen polling a try-lock while holding no advisory lock (contention that "
        "leaves no row in pg_locks), by the namespace of the leader they stood by for.",
    )
    for namespace, pids in sorted(sampler.standing.polling.items()):
        polling.add(len(pids), namespace=namespace)
    metrics.append(polling)
    patterns_seen = Metric("lockdiag_sample_patterns", "Patterns seen, by kind.")
    for kind in ("idle-holder", "broad-key", "duplicate-dispatch"):
        patterns_seen.add(sum(1 for p in found if p.kind == kind), kind=kind)
    return exposition([*metrics, patterns_seen])
