"""The commands that act: terminate (the only one that changes server state) and pooltest
(which takes only its own reserved test keys)."""

from __future__ import annotations

import sys
import time
from typing import NoReturn

import click

from lockdiag.cli.common import (
    DURATION,
    TIMEOUT,
    connection_options,
    format_option,
    get_registry,
    get_target,
    pooler_options,
    registry_option,
    show,
    source,
)
from lockdiag.core.analysis import LockEntry
from lockdiag.core.model import Snapshot
from lockdiag.core.termination import (
    END_ATTACHED_CLIENT,
    FORCE,
    AfterCancel,
    Preview,
    Refused,
    after_cancel,
    attached_client,
    keeps_working,
    nothing_to_cancel,
    preview,
)
from lockdiag.errors import EXIT_NEGATIVE, EXIT_OK, InputError, ServerError
from lockdiag.evidence import Reader, Target
from lockdiag.keys import parse_numbers
from lockdiag.pg.actions import act
from lockdiag.pg.pooltest import run
from lockdiag.pg.timeout import Timeout
from lockdiag.render import render
from lockdiag.views.pooltest import pooltest_output
from lockdiag.views.terminate import (
    cancel_report,
    terminate_outcome_output,
    terminate_preview_output,
)


@click.command("terminate")
@click.argument("pid", type=int)
@click.option(
    "--cancel", is_flag=True, help="Cancel the running query instead of ending the session."
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@click.option(
    FORCE,
    is_flag=True,
    help="With --yes: end the session even though it holds the lock of a program whose work "
    "goes on without it (its catalogue entry says so: a Rails or Sqitch migration runs on "
    "another connection), so that a second instance may run beside that work (refused "
    "without it).",
)
@click.option(
    END_ATTACHED_CLIENT,
    "end_attached_client",
    is_flag=True,
    help="Act even though the pooler shows a client attached to the server connection now: "
    "that client's transaction ends too (refused without it).",
)
@click.option(
    "--wait",
    **DURATION,
    default="5s",
    show_default=True,
    help="How long to wait for the backend to exit (or for a cancel to show), on top of --timeout.",
)
@pooler_options
@connection_options
@registry_option
@format_option
def terminate_command(
    pid: int,
    cancel: bool,
    yes: bool,
    force: bool,
    end_attached_client: bool,
    wait: float,
    registry: str | None,
    fmt: str,
) -> None:
    """End one session (or cancel its query) after showing what that releases.

    The only command that changes server state. It acts on exactly one pid, after a preview of
    the locks it holds and the sessions waiting behind it, and asks first (--yes for scripts).
    It refuses lockdiag's own session, non-client backends, sessions that hold no lock or
    whose start time it cannot see (without pg_read_all_stats), and a pooled server
    connection that the pooler shows a client attached to now (its transaction is that
    client's work) unless --end-attached-client says to end it too. The preview names a
    well-known program's lock and says what check says of it; with --yes it refuses to end
    the lock of a program whose work goes on without it (a Rails or Sqitch migration runs on
    another connection, and a second one could start beside it) unless --force says so.
    At the confirmation it signals the pid only if it is still the session shown (same start
    time) holding what the preview showed; otherwise it does nothing and says what changed.
    --cancel acts only while a query runs (an idle session's cancel releases nothing), then
    says which locks the cancel released and which stayed. --timeout bounds the preview as a
    whole, and the action after the confirmation (--wait added); once the signal is sent, what
    follows is said as seen: ended, not exited within --wait, or unknown.

    \b
    Exit codes: 0 done; 1 not done (declined, the pid gone or no longer the
    session shown, or signalled but not seen to exit or stop); 2 refused; 3 server
    error or missing privilege (pg_signal_backend, or membership in the owner's
    role).

    \b
    Examples:
      lockdiag terminate 812
      lockdiag terminate 812 --cancel --yes
      lockdiag terminate 812 --yes --force   # a lock whose work runs elsewhere
    """
    names = get_registry(registry)
    where = source()
    machine = fmt == "json"  # one JSON document on stdout at the end; people's text on stderr
    with Reader(get_target(names)) as reader:
        diagnosis = reader.read("all").diagnosed()
        plan = preview(diagnosis, pid)
        shown = terminate_preview_output(plan, diagnosis.snapshot, cancel)
        if machine:
            render(shown, "plain", sys.stderr)
        else:
            show(shown, fmt)

        def document(
            done: bool,
            message: str,
            released: list[LockEntry] | None = None,
            still_held: list[LockEntry] | None = None,
        ) -> None:
            if machine:
                show(terminate_outcome_output(shown, done, message, released, still_held), fmt)

        def finish(done: bool, message: str, *locks: list[LockEntry] | None) -> NoReturn:
            click.echo(message, err=machine or not done)
            document(done, message, *locks)
            sys.exit(EXIT_OK if done else EXIT_NEGATIVE)

        if cancel and (why := nothing_to_cancel(plan.session)):
            finish(False, why)
        if not end_attached_client and (why := attached_client(plan, cancel)):
            document(False, why)
            raise Refused(why)
        if yes and not force and (why := keeps_working(plan, cancel)):
            document(False, why)
            raise Refused(why)
        verb = "cancel the query of" if cancel else "terminate"
        if plan.waits is not None and not plan.blocked:
            verb += " the waiter"
        if not yes:
            if not sys.stdin.isatty():
                refusal = f"not confirmed: run with --yes to {verb} pid {pid} without a prompt"
                document(False, refusal)
                raise InputError(refusal)
            if not click.confirm(f"{verb} pid {pid}?", default=False, err=True):
                finish(False, "nothing done")
        with where.timeout.plus(wait).budget():  # the confirmation may have taken minutes
            outcome = act(reader.session, plan, cancel, wait)
            if not outcome.done:
                finish(False, outcome.message)
            if not cancel:
                finish(True, outcome.message, list(plan.releases), [])
            try:
                check, now = _after_cancel(reader, plan, wait)
            except ServerError as error:  # the cancel was sent: say so, not only the error
                finish(
                    False,
                    f"cancel request sent to pid {pid}; what it did is unknown: lockdiag could "
                    f"not read the server again ({error})",
                )
    finish(check.stopped, cancel_report(plan, now, check, wait), check.released, check.still_held)


def _after_cancel(reader: Reader, plan: Preview, wait: float) -> tuple[AfterCancel, Snapshot]:
    """New reads of the server (each under the session's deadline) until the query shown has
    stopped, or ``wait`` seconds have passed: a backend acts on a cancel at its next check for
    interrupts, not at once."""
    ends = time.monotonic() + wait
    while True:
        now = reader.snapshot("all")
        check = after_cancel(plan, now)
        if check.stopped:
            # the snapshot reads pg_locks before pg_stat_activity: a backend that aborted in
            # between shows its new state beside the locks it held a moment before; it
            # releases them before it reports that state, so a second read is the truth
            time.sleep(0.05)
            now = reader.snapshot("all")
            return after_cancel(plan, now), now
        if time.monotonic() >= ends:
            return check, now
        time.sleep(0.05)


@click.command("pooltest")
@click.option(
    "--pooled", required=True, metavar="DSN", help="The DSN the workers use (through the pooler)."
)
@click.option(
    "--direct", required=True, metavar="DSN", help="The same database, not through the pooler."
)
@click.option(
    "--key",
    "raw_key",
    default="1818977383,1",
    show_default=True,
    metavar="A,B",
    help="The reserved int4 pair to test with (B+1 is used too); never any other key.",
)
@click.option(
    "--timeout",
    **TIMEOUT,
    default="5s",
    show_default=True,
    help="Time limit of each connection and round trip, through the pool and direct (also the "
    "direct session's statement_timeout).",
)
@click.option(
    "--pgbouncer",
    "consoles",
    multiple=True,
    metavar="DSN",
    help="PgBouncer admin console: tells exactly which backends are the pool's server "
    "connections (else: the backends of the database connected from the pooler's address).",
)
@click.option(
    "--accept-losing-locks",
    is_flag=True,
    help="Run even when the pool's server connections hold advisory locks (evidence of a "
    "leak) that a scenario may release.",
)
@registry_option
@format_option
def pooltest_command(
    pooled: str,
    direct: str,
    raw_key: str,
    timeout: Timeout,
    consoles: tuple[str, ...],
    accept_losing_locks: bool,
    registry: str | None,
    fmt: str,
) -> None:
    """Run the two-worker lock test through a real pool and report what survives.

    Worker A takes a reserved test key through --pooled and ends in each way a worker can
    (commit, rollback, exception, cancel, disconnect), with session and transaction locks;
    worker B and a new client C try the key; --direct watches pg_locks. Exit 0 when every
    scenario behaved safely, 1 when an unsafe or inconclusive one was observed, 2 when it
    refused: advisory locks held by the pool's server connections (a leak's evidence) would
    be at risk.

    \b
    Examples:
      lockdiag pooltest --pooled "port=6432 dbname=app" --direct "dbname=app"
    """
    key = parse_numbers([raw_key])
    names = get_registry(registry)
    # the direct view of the server: the registry's names, never a pooler's console
    with Reader(Target.of(direct, timeout, names), read_poolers=False) as watcher:
        results, left = run(
            pooled, watcher.session, watcher.diagnose, key, consoles, accept_losing_locks
        )
    show(pooltest_output(results, left), fmt)
    sys.exit(EXIT_OK if all(r.ok for r in results) and not left else EXIT_NEGATIVE)
