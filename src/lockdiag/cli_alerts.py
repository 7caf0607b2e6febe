"""Commands that alert and act: blockers, check, terminate, pooltest."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from lockdiag.cli_common import (
    DURATION,
    F,
    cli,
    connection_options,
    fleet_exit,
    format_option,
    get_captures,
    get_registry,
    get_snapshot,
    pooler_options,
    registry_option,
    show,
    source,
    source_options,
)
from lockdiag.errors import EXIT_NEGATIVE, EXIT_OK, EXIT_UNKNOWN, InputError, LockdiagError


@cli.command("blockers")
@source_options
@registry_option
@format_option
def blockers_command(registry: str | None, fmt: str) -> None:
    """Wait-for chains of every lock type: a tree per root blocker, worst first.

    A root blocker blocks others and waits for nobody. Waiters only queued behind another
    waiter are shown as such; a cycle (a deadlock not yet broken) is shown once.

    \b
    Examples:
      lockdiag blockers
      lockdiag blockers --format json | jq '.roots[0]'
    """
    from lockdiag.graph import blockers
    from lockdiag.views_alerts import blockers_output

    names = get_registry(registry)
    captures = get_captures("all", names)
    if captures is not None:
        from lockdiag.views import fleet_sections

        parts = [
            (
                c.target,
                blockers_output(blockers(c.snapshot, names)) if c.snapshot else None,
                c.error,
            )
            for c in captures
        ]
        show(fleet_sections(parts), fmt)
        fleet_exit([(c.target, c.error or "") for c in captures if c.snapshot is None])
        return
    snapshot = get_snapshot("all", names)
    show(blockers_output(blockers(snapshot, names)), fmt)


def _threshold(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """WARN or WARN,CRIT: durations (``30s,5m``) or, for counts, integers (``5,20``)."""
    if value is None:
        return None
    from lockdiag.durations import parse_duration
    from lockdiag.findings import Threshold

    parts = [part.strip() for part in value.split(",")]
    if len(parts) > 2:
        raise click.BadParameter("give WARN or WARN,CRIT", ctx, param)
    try:
        levels = [parse_duration(part) for part in parts]
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None
    if len(levels) == 2 and levels[1] < levels[0]:
        raise click.BadParameter("the critical level is below the warning level", ctx, param)
    return Threshold(*levels)


class UnknownStatus(LockdiagError):
    """`check` could not decide: the monitoring-plugin UNKNOWN."""

    exit_code = EXIT_UNKNOWN


class CheckCommand(click.Command):
    """Monitoring-plugin exit codes: bad arguments are UNKNOWN (3), not click's usual 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as error:
            raise _UnknownUsage(error.format_message(), error.ctx) from None


class _UnknownUsage(click.UsageError):
    exit_code = EXIT_UNKNOWN


def threshold_option(name: str, default: str, text: str) -> Callable[[F], F]:
    return click.option(
        name, callback=_threshold, default=default, show_default=True, metavar="WARN[,CRIT]",
        help=text,
    )  # fmt: skip


@cli.command("check", cls=CheckCommand)
@threshold_option("--session-age", "5m,1h", "A certain session-level advisory lock held this long.")
@threshold_option("--wait-age", "30s,5m", "A session waiting for a lock this long.")
@threshold_option("--idle-age", "1m,10m", "A holder idle in transaction while others wait.")
@threshold_option("--max-blocked", "5,20", "More than N sessions behind one root blocker.")
@click.option("--no-unregistered", is_flag=True, help="Do not report unregistered namespaces.")
@source_options
@registry_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "table", "plain", "json", "nagios", "prometheus"]),
    default="auto",
    show_default=True,
    help="nagios: one status line with perfdata; prometheus: text exposition format.",
)
def check_command(
    session_age: Any,
    wait_age: Any,
    idle_age: Any,
    max_blocked: Any,
    no_unregistered: bool,
    registry: str | None,
    fmt: str,
) -> None:
    """Findings against thresholds, for cron and alerting.

    Exit codes follow the monitoring-plugin convention: 0 OK, 1 WARNING, 2 CRITICAL,
    3 UNKNOWN (could not connect, bad registry, bad arguments). Namespaces in the registry
    add their own critical limits (max_hold, max_wait); expect = "session" namespaces never
    raise a session-lock finding.

    \b
    Examples:
      lockdiag check
      lockdiag check --wait-age 10s,1m --format nagios
      lockdiag check --format prometheus > /var/lib/node_exporter/lockdiag.prom
    """
    from lockdiag.findings import CheckPolicy, check
    from lockdiag.views_alerts import NAGIOS_EXIT, STATUS_EXIT, check_output, fleet_check_output

    policy = CheckPolicy(session_age, wait_age, idle_age, max_blocked, not no_unregistered)
    machine = fmt in ("nagios", "prometheus")
    try:
        names = get_registry(registry)
        captures = get_captures("all", names)
        if captures is not None:
            results = [
                (c.target, check(c.snapshot, names, policy) if c.snapshot else None, c.error)
                for c in captures
            ]
            output, status = fleet_check_output(results, fmt, policy)
            show(output, "plain" if machine else fmt)
            sys.exit(STATUS_EXIT[status])
        snapshot = get_snapshot("all", names)
    except LockdiagError as error:
        if fmt == "nagios":
            click.echo(f"LOCKDIAG UNKNOWN - {str(error).splitlines()[0]}")
        raise UnknownStatus(str(error), error.hint) from None
    report = check(snapshot, names, policy)
    show(check_output(report, fmt, policy), "plain" if machine else fmt)
    sys.exit(NAGIOS_EXIT[report.status])


@cli.command("terminate")
@click.argument("pid", type=int)
@click.option(
    "--cancel", is_flag=True, help="Cancel the running query instead of ending the session."
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@click.option(
    "--wait",
    **DURATION,
    default="5s",
    show_default=True,
    help="How long to wait for the backend to exit.",
)
@pooler_options
@connection_options
@registry_option
@format_option
def terminate_command(
    pid: int, cancel: bool, yes: bool, wait: float, registry: str | None, fmt: str
) -> None:
    """End one session (or cancel its query) after showing what that releases.

    The only command that changes server state. It acts on exactly one pid, after a preview of
    the locks it holds and the sessions waiting behind it, and asks first (--yes for scripts).
    It refuses lockdiag's own session, non-client backends and sessions that hold no lock.

    \b
    Exit codes: 0 done; 1 not done (declined, or the pid already gone); 2 refused;
    3 server error or missing privilege (pg_signal_backend, or membership in the owner's role).

    \b
    Examples:
      lockdiag terminate 812
      lockdiag terminate 812 --cancel --yes
    """
    from lockdiag.connect import complete, connect, describe, server_errors
    from lockdiag.snapshot import capture
    from lockdiag.terminate import act, preview
    from lockdiag.views_alerts import terminate_preview_output

    names = get_registry(registry)
    where = source()
    poolers = names.poolers.merged(where.pgbouncer, where.pooler_addr)
    connection = connect(where.dsn, where.timeout)
    try:
        with server_errors(where.dsn, where.timeout):
            snapshot = capture(connection, describe(connection), "all")
            snapshot = complete(connection, snapshot, names, poolers, where.timeout)
            plan = preview(snapshot, names, pid)
            show(
                terminate_preview_output(plan, snapshot, cancel), fmt if fmt != "json" else "plain"
            )
            verb = "cancel the query of" if cancel else "terminate"
            if not yes:
                if not sys.stdin.isatty():
                    raise InputError(
                        f"not confirmed: run with --yes to {verb} pid {pid} without a prompt"
                    )
                if not click.confirm(f"{verb} pid {pid}?", default=False, err=True):
                    click.echo("nothing done", err=True)
                    sys.exit(EXIT_NEGATIVE)
            outcome = act(connection, pid, cancel, wait)
    finally:
        connection.close()
    click.echo(outcome.message, err=not outcome.done)
    sys.exit(EXIT_OK if outcome.done else EXIT_NEGATIVE)


@cli.command("pooltest")
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
@click.option("--timeout", **DURATION, default="5s", show_default=True, help="Connect timeout.")
@format_option
def pooltest_command(pooled: str, direct: str, raw_key: str, timeout: float, fmt: str) -> None:
    """Run the two-worker lock test through a real pool and report what survives.

    Worker A takes a reserved test key through --pooled and ends in each way a worker can
    (commit, rollback, exception, cancel, disconnect), with session and transaction locks;
    worker B and a new client C try the key; --direct watches pg_locks. Exit 0 when every
    scenario behaved safely, 1 when an unsafe behaviour was observed.

    \b
    Examples:
      lockdiag pooltest --pooled "host=pgbouncer port=6432 dbname=app" --direct "host=db dbname=app"
    """
    from lockdiag.connect import server_errors
    from lockdiag.keys import parse_numbers
    from lockdiag.pooltest import run
    from lockdiag.views_alerts import pooltest_output

    key = parse_numbers([raw_key])
    with server_errors(pooled, timeout):
        results, left = run(pooled, direct, key, timeout)
    show(pooltest_output(results, left), fmt)
    sys.exit(EXIT_OK if all(r.ok for r in results) and not left else EXIT_NEGATIVE)
