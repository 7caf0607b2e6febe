"""Command line: options in, one core call, one render, errors out as messages and exit codes.

The read commands live here; ``cli_alerts`` (blockers, check, terminate, pooltest) and
``cli_live`` (watch, sample, demo, completion) add theirs to the same group.
"""

from __future__ import annotations

import gc
import shutil
import sys
from typing import TYPE_CHECKING

import click

from lockdiag.cli_common import (
    DURATION,
    NUMBERS_SETTINGS,
    LockdiagGroup,
    cli,
    complete_namespace,
    connection_options,
    fleet_exit,
    format_option,
    get_captures,
    get_registry,
    get_snapshot,
    pooler_options,
    registry_option,
    show,
    source_options,
)
from lockdiag.errors import EXIT_NEGATIVE, EXIT_OK, InputError

if TYPE_CHECKING:
    from lockdiag.snapshot import Scope

# -- commands ----------------------------------------------------------------------------------


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
    type=click.Path(dir_okay=False),
    required=True,
    help="File to write ('-' for standard output).",
)
@click.option("--advisory-only", is_flag=True, help="Save advisory locks only (smaller file).")
@pooler_options
@connection_options
@registry_option
def snapshot_command(output: str, advisory_only: bool, registry: str | None) -> None:
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
    if output == "-":
        click.echo(snapshot.dumps(taken), nl=False)
        return
    from pathlib import Path

    snapshot.save(taken, Path(output))
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


from lockdiag import cli_alerts, cli_live  # noqa: E402 - they add their commands to `cli`
from lockdiag.cli_live import completion_script  # noqa: E402

__all__ = ["cli", "cli_alerts", "cli_live", "completion_script", "main"]


def main() -> None:
    # A one-shot command builds many small acyclic objects (a hundred thousand locks make
    # several hundred thousand); the cycle collector would rescan them all, again and again,
    # for nothing: it halved `list` at 100k locks. The long-running commands (watch, sample)
    # run it themselves now and then (observe.collect_now_and_then).
    gc.disable()
    cli(prog_name="lockdiag")
