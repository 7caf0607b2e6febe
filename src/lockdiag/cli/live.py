"""Commands over time: watch (a live view) and sample (statistics over a period)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from lockdiag.cli.common import (
    DURATION,
    connection_options,
    formats,
    get_registry,
    get_target,
    pooler_options,
    registry_option,
    show,
)
from lockdiag.cli.screen import progress_reporter, run
from lockdiag.core.observe import Looks, Sampler
from lockdiag.durations import format_duration
from lockdiag.errors import EXIT_INTERRUPTED, InputError, ServerError
from lockdiag.evidence import Analysis
from lockdiag.evidence.paced import Feed, Replay, sample, watching
from lockdiag.views.sample import achieved_interval, behind, sample_output
from lockdiag.views.watch import CHECK, State


@click.command("watch")
@click.option(
    "--interval", **DURATION, default="2s", show_default=True, help="Time between refreshes."
)
@click.option("--once", is_flag=True, help="Print one frame as text and exit (no terminal needed).")
@click.option(
    "--record",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Append every snapshot to FILE, one JSON line each.",
)
@click.option(
    "--from",
    "replay",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Replay a file written by --record instead of reading a server; a snapshot file "
    "(lockdiag snapshot -o) replays as one frame.",
)
@pooler_options
@connection_options
@registry_option
def watch_command(
    interval: float, once: bool, record: str | None, replay: str | None, registry: str | None
) -> None:
    """A live view that refreshes, like top: findings, root blockers, holders and waiters.

    It remembers when each lock was first seen ("seen 4m12s", next to the lower bound of AGE)
    and marks new rows with +. Keys: q quit, p pause, n narrow to a namespace, i narrow to a
    pid, c clear. A lost connection shows "connection lost, retrying" and reconnects.

    \b
    Examples:
      lockdiag watch
      lockdiag watch --interval 5s --record incident.jsonl
      lockdiag watch --from incident.jsonl
      lockdiag watch --once
    """
    if interval <= 0:
        raise InputError("--interval must be more than zero")
    if replay is not None and record is not None:
        raise InputError("give either --from FILE or --record FILE, not both")
    names = get_registry(registry)
    # check's findings, and --session-age and max_hold judging the time seen held too
    analysis = Analysis(CHECK.analysis_policy(), Looks())
    feed: Feed
    if replay is not None:  # a recording needs no server, nor the driver
        feed = Replay(Path(replay), names, analysis, interval)
    else:
        feed = watching(get_target(names), analysis, interval, Path(record) if record else None)
    run(State(names), feed, interval, once)


@click.command("sample")
@click.option(
    "--duration", **DURATION, default="60s", show_default=True, help="How long to sample."
)
@click.option(
    "--interval", **DURATION, default="250ms", show_default=True, help="Time between samples."
)
@pooler_options
@connection_options
@registry_option
@formats("markdown", "csv", "prometheus")
def sample_command(duration: float, interval: float, registry: str | None, fmt: str) -> None:
    """Contention statistics over a period, per namespace and per key.

    A probe of pg_stat_activity per sample, on one connection; pg_locks is read when it changed
    (a sample in between counts the last read again), within a duty cycle. Reports for each
    key the samples in which it was held and waited on, distinct holders and waiters, the
    longest observed hold and wait, estimated acquisitions and releases, and the contention
    rate; then calls out idle holders, broad keys and duplicate dispatch. Progress goes to
    stderr; Ctrl-C stops early and reports what was sampled (exit 130).

    \b
    Examples:
      lockdiag sample --duration 60s --interval 250ms
      lockdiag sample --duration 10m --format prometheus > lockdiag-sample.prom
    """
    if interval <= 0 or duration <= 0:
        raise InputError("--duration and --interval must be more than zero")
    names = get_registry(registry)
    server = get_target(names)
    errors: list[str] = []
    sampler = Sampler()
    interrupted = False
    with progress_reporter(duration, interval) as report:

        def progress(done: int, expected: int, error: str | None) -> None:
            if error and (not errors or errors[-1] != error):
                errors.append(error)
                click.echo(f"lockdiag: sample: {error}", err=True)
            report(done, expected)

        try:
            sample(server, duration, interval, progress, sampler)
        except KeyboardInterrupt:
            interrupted = True
    if sampler.samples == 0 and errors and not interrupted:
        raise ServerError(errors[-1])
    show(sample_output(sampler, interval, duration=duration), fmt)
    achieved = achieved_interval(sampler)
    if behind(achieved, interval):
        click.echo(
            f"lockdiag: sample: warning: asked every {format_duration(interval)}, achieved every "
            f"{format_duration(achieved or 0.0)}: episodes shorter than that can be missed "
            "(a longer --interval, or fewer locks, keeps the rate)",
            err=True,
        )
    if interrupted:
        click.echo("lockdiag: interrupted: the figures cover what was sampled", err=True)
        sys.exit(EXIT_INTERRUPTED)
