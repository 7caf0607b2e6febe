"""The read commands: list, who-holds, blockers, snapshot."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lockdiag.cli.common import (
    DURATION,
    NUMBERS_SETTINGS,
    complete_namespace,
    connection_options,
    failures,
    fleet_exit,
    fleet_of,
    formats,
    get_readings,
    get_registry,
    get_snapshot,
    pooler_options,
    registry_option,
    show,
    source_options,
)
from lockdiag.core import snapshot_file
from lockdiag.core.model import Aggregated, Scope
from lockdiag.core.policy import CheckPolicy, Policy
from lockdiag.errors import EXIT_NEGATIVE, EXIT_OK, InputError
from lockdiag.evidence import Analysis
from lockdiag.keys import parse_lock

if TYPE_CHECKING:
    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.render import Output

# each answer's views: imported while the server works (lockdiag.evidence.overlap), not at load
LIST_VIEWS = ("lockdiag.core.expansion", "lockdiag.views.common", "lockdiag.views.listing")
WHO_HOLDS_VIEWS = ("lockdiag.views.common", "lockdiag.views.who_holds")
BLOCKERS_VIEWS = ("lockdiag.views.common", "lockdiag.views.blockers")


@click.command("list")
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
@formats("markdown", "csv")
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
    names = get_registry(registry)
    chosen = names.namespace(namespace) if namespace else None  # checked before any read
    policy = Policy(session_age=session_age)
    unfiltered = not (namespace or pids or waiting) and app is None and min_age is None
    # a terminal shows a screenful: read what it needs (uncontested locks as spans, shown as
    # one row each), analyse only the locks worth it (and count the rest, so that folded rows
    # say how many locks they stand for); a dump reads every lock, a backend's uncontested
    # ones as spans with their keys, written as their locks (core.expansion)
    from lockdiag.render import resolve

    form = resolve(fmt, sys.stdout)
    screenful = unfiltered and form == "table" and sys.stdout.isatty()
    rows = max(10, shutil.get_terminal_size().lines - 8) if screenful else 0
    scope: Scope = "all" if all_types else "advisory"
    analysis = Analysis(policy, rows=rows, all_types=all_types, imports=LIST_VIEWS)
    if screenful:
        scope = Aggregated(all_types=all_types)
    elif form != "table":
        scope = Aggregated(all_types=all_types, members=True)
    readings = get_readings(scope, names, analysis)
    from lockdiag.core.analysis import Filters  # imported meanwhile: see LIST_VIEWS
    from lockdiag.views.listing import fleet_list_output

    filters = Filters(chosen, frozenset(pids), app, waiting, min_age)
    fleet = fleet_of(readings)
    listings = [
        (r.label if fleet else None, r.diagnosis.listing(filters, all_types))
        for r in readings
        if r.diagnosis is not None
    ]
    failed = failures(readings)
    show(fleet_list_output(listings, failed), fmt)
    fleet_exit(failed)


@click.command("who-holds", context_settings=NUMBERS_SETTINGS)
@click.argument("namespace", required=False, shell_complete=complete_namespace)
@click.argument("resource", nargs=-1)
@click.option(
    "--key",
    "raw_key",
    metavar="NUMBERS",
    help="A raw key instead: '4102,73' (int4 pair), "
    "'-55037190' (bigint) or '4102,73,2' (classid,objid,objsubid from pg_locks; "
    "an extension's tag too: '0,822708183,10').",
)
@source_options
@registry_option
@formats("markdown")
def who_holds_command(
    namespace: str | None,
    resource: tuple[str, ...],
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
    names = get_registry(registry)
    if raw_key is not None:
        if namespace is not None:
            raise InputError("give either NAMESPACE RESOURCE or --key, not both")
        key = parse_lock([raw_key])
    elif namespace is None:
        raise InputError("give NAMESPACE RESOURCE (e.g. tenant_summary 73) or --key NUMBERS")
    else:
        key = names.key(namespace, *resource).triple
    # every lock type: the verdict places the holder in the incident, and a holder that waits
    # for a table lock is no root blocker; the key itself as a row, the rest as the findings
    # need it (spans of locks nobody waits for)
    readings = get_readings(Aggregated(key=key), names, Analysis(imports=WHO_HOLDS_VIEWS))
    from lockdiag.views.common import fleet_sections  # imported meanwhile: see WHO_HOLDS_VIEWS
    from lockdiag.views.who_holds import who_holds_output

    reports = [(r, r.diagnosis.who_holds(key) if r.diagnosis else None) for r in readings]
    parts = [
        (r.label, who_holds_output(held, r.snapshot) if held and r.snapshot else None, r.reason)
        for r, held in reports
    ]
    show(fleet_sections(parts), fmt)
    fleet_exit(failures(readings))
    sys.exit(EXIT_OK if any(r and r.held for _, r in reports) else EXIT_NEGATIVE)


@click.command("blockers")
@source_options
@registry_option
@formats("markdown")
def blockers_command(registry: str | None, fmt: str) -> None:
    """Wait-for chains of every lock type: a tree per root blocker, worst first.

    A root blocker blocks others and waits for nobody. Waiters only queued behind another
    waiter are shown as such; a cycle (a deadlock not yet broken) is shown once. A waiter
    held up by several sessions is shown in full once, elsewhere on a row that says where;
    a tree folds below 20 levels, saying how many sessions it folds (JSON has every edge).

    \b
    Examples:
      lockdiag blockers
      lockdiag blockers --format json | jq '.roots[0]'
    """
    names = get_registry(registry)
    # the backends in a wait, their other locks as spans (the bulk a blocker holds)
    readings = get_readings(Aggregated(), names, Analysis(imports=BLOCKERS_VIEWS))
    from lockdiag.views.common import fleet_sections  # imported meanwhile: see BLOCKERS_VIEWS

    parts = [(r.label, _blockers(r.diagnosis) if r.diagnosis else None, r.reason) for r in readings]
    show(fleet_sections(parts), fmt)
    fleet_exit(failures(readings))


def _blockers(diagnosis: Diagnosis) -> Output:
    """The chains in the incident's order, the one `check` gives (its default thresholds)."""
    from lockdiag.views.blockers import blockers_output  # imported meanwhile: BLOCKERS_VIEWS

    return blockers_output(diagnosis.incident(CheckPolicy()))


@click.command("snapshot")
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

    Every read command accepts --from FILE and gives the same answer offline: the file
    keeps the registry's namespaces and [known] names, so the keys keep their names where
    the registry file is not (--registry FILE still wins). It holds query texts and client
    addresses, never a password.

    \b
    Examples:
      lockdiag snapshot -o incident-$(date +%F-%H%M).json
      lockdiag list --from incident.json
    """
    names = get_registry(registry)
    # each backend's uncontested locks as a span with its keys, written as its locks
    taken = get_snapshot(Aggregated(all_types=not advisory_only, members=True), names)
    if output == "-":
        for piece in snapshot_file.pieces(taken, names):  # written as they are encoded
            click.echo(piece, nl=False)
        return
    snapshot_file.save(taken, Path(output), names)
    click.echo(
        f"saved {len(taken.locks)} lock(s) and {len(taken.sessions)} session(s) from "
        f"{taken.source} to {output}",
        err=True,
    )
