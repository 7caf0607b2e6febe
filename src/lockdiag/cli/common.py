"""What every command shares: the common options, where the snapshot comes from, errors as exit
codes. Command modules are loaded only when their command runs (see :mod:`lockdiag.cli`), so
what they import costs nothing to ``--help`` and ``--version``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from click.shell_completion import CompletionItem

from lockdiag import plugins
from lockdiag.cli import COMMANDS
from lockdiag.cli.ending import keep
from lockdiag.core.model import Scope, Snapshot, extent_of
from lockdiag.durations import parse_duration
from lockdiag.errors import EXIT_SERVER, LockdiagError
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import (
    ENV_VAR,
    Registry,
    RegistryError,
    find_registry,
    load_registry,
)
from lockdiag.registry.discovery import WORKING_DIRECTORY, found_unnamed
from lockdiag.settings import Settings, SettingsError, load_settings

# the evidence room is loaded by the commands that read (`key` reads none), the renderers once
# there is something to show (an answer's views import them while the server works:
# lockdiag.evidence.overlap)
if TYPE_CHECKING:
    from lockdiag.evidence import Analysis, Reading, Source, Target
    from lockdiag.render import Output

F = TypeVar("F", bound=Callable[..., Any])
NUMBERS_SETTINGS = {"ignore_unknown_options": True}  # lets negative keys through: decode -5 7


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Click callback: ``90s``, ``5m``, ``250ms`` or a number of seconds."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None


DURATION: dict[str, Any] = {"callback": _duration, "metavar": "DURATION"}


def _timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> Timeout | None:
    """Click callback: a duration as a Timeout (statement_timeout, connect_timeout, the
    client's deadline and the exchange's budget, all of them)."""
    seconds = _duration(ctx, param, value)
    return None if seconds is None else Timeout(seconds)


TIMEOUT: dict[str, Any] = {"callback": _timeout, "metavar": "DURATION"}


class _AsLockdiag(logging.Handler):
    """A library's log record (psycopg's "query cancellation failed: ..." when a frozen
    server ignores a cancel) as one of lockdiag's lines, made inert: Python's last-resort
    handler printed it bare."""

    def emit(self, record: logging.LogRecord) -> None:
        from lockdiag.render import clean

        level = "error" if record.levelno >= logging.ERROR else "warning"
        message = clean(" ".join(self.format(record).split()))
        click.echo(f"lockdiag: {level}: {message}", err=True)


def libraries_speak_as_lockdiag() -> None:
    """psycopg's log records, from the commands that may talk to a server (this module is
    theirs: ``--help`` never loads it, nor logging)."""
    logger = logging.getLogger("psycopg")
    if not any(isinstance(handler, _AsLockdiag) for handler in logger.handlers):
        logger.addHandler(_AsLockdiag(logging.WARNING))
        logger.propagate = False


libraries_speak_as_lockdiag()


# -- common options ----------------------------------------------------------------------------


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a common option in the context, so commands need not pass it along."""
    ctx.meta[f"lockdiag.{param.name}"] = value
    return value


def _remember_timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    return _remember(ctx, param, _timeout(ctx, param, value))


def source() -> Source:
    """Where the command's evidence comes from: its common options, built once a command."""
    from lockdiag.evidence.source import Source

    meta = click.get_current_context().meta
    if "lockdiag.source" not in meta:
        meta["lockdiag.source"] = Source(**_source(meta))
    built: Source = meta["lockdiag.source"]
    return built


def _source(meta: dict[str, Any]) -> dict[str, Any]:
    """The Source's fields, as the options give them."""
    from lockdiag.evidence.source import read_targets

    given: dict[str, Any] = {
        name: meta[f"lockdiag.{name}"]
        for name in ("from_file", "pgbouncer", "pooler_addr")
        if meta.get(f"lockdiag.{name}") is not None
    }
    if meta.get("lockdiag.timeout") is not None:
        given["timeout"] = meta["lockdiag.timeout"]
    given_dsn = meta.get("lockdiag.dsn") or ()
    dsns = [given_dsn] if isinstance(given_dsn, str) else list(given_dsn)
    # --target from the settings file comes after LOCKDIAG_DSN (read by hand, below, so that
    # click's default_map cannot order it) and gives way to --from FILE as LOCKDIAG_DSN does
    named = meta.get("lockdiag.target") or ()
    from_settings = _source_of("target") is ParameterSource.DEFAULT_MAP
    if not from_settings:
        dsns += [_settings().target(name).dsn for name in named]
    targets = meta.get("lockdiag.targets")
    if targets is not None:
        dsns += read_targets(Path(targets))
    # an exported LOCKDIAG_DSN gives way to --from FILE; an explicit --dsn with --from does not
    if not dsns and os.environ.get("LOCKDIAG_DSN") and "from_file" not in given:
        dsns = [os.environ["LOCKDIAG_DSN"]]  # one DSN: click would split it on spaces
    if not dsns and from_settings and "from_file" not in given:
        dsns = [_settings().target(name).dsn for name in named]
    return {"dsns": tuple(dsns), **given}


def _source_of(name: str) -> ParameterSource | None:
    return click.get_current_context().get_parameter_source(name)


def _settings() -> Settings:
    """The settings file the root group read (a command run on its own reads it now)."""
    meta = click.get_current_context().meta
    if "lockdiag.settings" not in meta:
        meta["lockdiag.settings"] = load_settings(COMMANDS)
    settings: Settings = meta["lockdiag.settings"]
    return settings


def connection_options(command: F) -> F:
    """--dsn, --target and --timeout of a command that reads one server."""
    return _connection(command, fleet=False)


def fleet_options(command: F) -> F:
    """--dsn (repeatable), --target, --targets and --timeout of a command that reads many
    servers."""
    return _connection(command, fleet=True)


def server_options(what: str) -> Callable[[F], F]:
    """--dsn, --target and --timeout of a command that asks a server ``what`` only when one is
    named (`decode`): libpq's environment alone names none."""
    return lambda command: _connection(command, fleet=False, asks=what)


def _connection(command: F, fleet: bool, asks: str | None = None) -> F:
    command = click.option(
        "--timeout",
        callback=_remember_timeout,
        expose_value=False,
        metavar="DURATION",
        default="5s",
        show_default=True,
        help="Time limit of the command as a whole, connecting and every round trip included "
        "(of each refresh in watch and sample, each target's scrape in the exporter), plus a "
        "margin of a fifth (1s to 5s); also lockdiag's statement_timeout (e.g. 2s, 500ms).",
    )(command)
    if fleet:
        command = click.option(
            "--targets",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            callback=_remember,
            expose_value=False,
            help="Many servers: one DSN or libpq service name per line.",
        )(command)
    many = "; repeat it to read many servers" if fleet else ""
    dsn_help = (
        f"Connection string or URI [env LOCKDIAG_DSN]{many}. Default: libpq's "
        "environment (PGHOST, PGPORT, PGDATABASE, PGSERVICE, ~/.pgpass)."
    )
    if asks is not None:
        dsn_help = f"Connection string or URI of a server to ask {asks} [env LOCKDIAG_DSN]."
    command = click.option(
        "--target",
        multiple=True,
        metavar="NAME",
        callback=_remember,
        expose_value=False,
        shell_complete=complete_target,
        help=f"A server named in the settings file ([targets.NAME] dsn = ...){many}.",
    )(command)
    return click.option(
        "--dsn",
        multiple=True,  # a single-server command says "give a single --dsn" when repeated
        metavar="DSN",
        callback=_remember,
        expose_value=False,
        help=dsn_help,
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
    command = pooler_options(fleet_options(command))
    return click.option(
        "--from",
        "from_file",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        callback=_remember,
        expose_value=False,
        help="Read a snapshot file saved by `lockdiag snapshot` instead of a server.",
    )(command)


def registry_option(command: F) -> F:
    return click.option(
        "--registry",
        metavar="PATH",
        envvar=ENV_VAR,  # so click puts it above the settings file's registry = ...
        help="Registry file [env LOCKDIAG_REGISTRY; default ./lockdiag.toml, then "
        "~/.config/lockdiag/lockdiag.toml].",
    )(command)


def format_option(command: F) -> F:
    return formats()(command)


def formats(*extra: str) -> Callable[[F], F]:
    """--format: auto, table, plain, json, and the command's own (markdown, csv...)."""
    notes = {
        "markdown": "markdown: GitHub tables for tickets and chat",
        "csv": "csv: the table, every row",
        "nagios": "nagios: one status line with perfdata",
        "prometheus": "prometheus: text exposition format",
    }
    more = "; ".join(notes[name] for name in extra)
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["auto", "table", "plain", "json", *extra]),
        default="auto",
        show_default=True,
        help="auto: a table on a terminal, plain text when piped" + (f"; {more}." if more else "."),
    )


def get_targets(registry: Registry) -> list[Target]:
    """The servers the options name (:meth:`Source.targets`)."""
    return source().targets(registry)


def get_target(registry: Registry) -> Target:
    """The one server of a single-server command (``watch``, ``sample``, ``terminate``...)."""
    return source().target(registry)


def get_readings(
    scope: Scope, registry: Registry, analysis: Analysis | None = None
) -> list[Reading]:
    """A reading of every target, with all its evidence (concurrently when several), each
    analysed as ``analysis`` asks (by default: every lock, default thresholds); or of --from
    FILE. A single server's error is raised whole, as any command's; a fleet's are kept in
    their readings, to be reported after every answer."""
    from lockdiag.evidence import WHOLE

    where = source()
    if where.from_file is not None and not where.dsns:
        _note_advisory_only(where, scope)
    readings = where.read(scope, registry, analysis or WHOLE)
    if len(readings) == 1 and readings[0].error is not None:
        raise readings[0].error
    keep(readings)  # not freed lock by lock at the end (see cli.ending)
    return readings


def fleet_of(readings: list[Reading]) -> bool:
    """Whether the answer names its targets: more than one server was read."""
    return len(readings) > 1


def failures(readings: list[Reading]) -> list[tuple[str, str]]:
    return [(r.label, r.reason or "failed") for r in readings if r.error is not None]


def fleet_exit(failed: list[tuple[str, str]]) -> None:
    """After printing every answer: exit 3 when a target could not be read."""
    if failed:
        for name, error in failed:
            click.echo(f"lockdiag: error: {name}: {error}", err=True)
        sys.exit(EXIT_SERVER)


def get_snapshot(scope: Scope, registry: Registry) -> Snapshot:
    """The one snapshot of a single-server command (``snapshot``)."""
    get_target(registry)  # one server: "give a single --dsn" otherwise
    (read,) = get_readings(scope, registry)
    assert read.snapshot is not None  # a single server's error was raised
    return read.snapshot


def _note_advisory_only(where: Source, scope: Scope) -> None:
    assert where.from_file is not None
    loaded, _ = where.saved
    if extent_of(scope) == "all" and loaded.scope != "all":
        click.echo(
            f"lockdiag: note: {where.from_file} holds advisory locks only (saved with "
            "--advisory-only)",
            err=True,
        )


def get_registry(path: str | None, strict: bool = False) -> Registry:
    """The registry; a broken or missing one stops only the commands that need it (``strict``):
    the others say why on stderr and go on with raw keys and well-known software's keys (an
    incident is no time to be stopped by a mistyped --registry).

    Reading a snapshot file (--from) that carries the registry it was taken with, that one
    is used unless a registry is named (--registry, LOCKDIAG_REGISTRY, the settings file),
    and a note says which."""
    context = click.get_current_context(silent=True)
    from_file = context.meta.get("lockdiag.from_file") if context else None
    saved = source().saved[1] if from_file is not None else None
    if saved is not None and path is None:
        taken = f" (taken with {saved[1]})" if saved[1] else ""
        _note(f"names from the registry saved in {from_file}{taken}; --registry FILE for another")
        return saved[0]
    found = registry_file(path, strict)
    if saved is not None and found is not None:
        _note(f"names from {found}, not from the registry saved in {from_file}")
    if found is None:
        return Registry()
    try:
        registry = plugins.registry_first(load_registry(str(found)))  # plugin clashes: told
    except RegistryError as error:
        if strict:
            raise
        _registry_not_used(str(error).splitlines())
        return Registry()
    where = _found_in(path, found)
    return registry if where is None or saved is not None else _implicit(registry, found, where)


def _found_in(path: str | None, found: Path) -> str | None:
    """Where a registry file nobody named was found (the working directory, the config
    directory), or None when --registry, LOCKDIAG_REGISTRY or the settings file named it."""
    if _registry_given(path) is not None or os.environ.get(ENV_VAR):
        return None
    unnamed = found_unnamed()
    return unnamed[1] if unnamed is not None and unnamed[0] == found else None


def _implicit(registry: Registry, found: Path, where: str) -> Registry:
    """A registry file found, not named, says so at every run: its names, max_hold and
    expectations shape the advice (terminate included). A file in the working directory may
    be anyone's (a clone, a shared folder): the PgBouncer consoles it names are not connected
    to (a planted DSN would collect a password from ~/.pgpass) unless the file is named."""
    _note(f"registry {found} (found in {where}; --registry FILE to name one)")
    consoles = registry.poolers.pgbouncer
    if where != WORKING_DIRECTORY or not consoles:
        return registry
    _note(
        f"its [poolers] PgBouncer console(s) not read ({len(consoles)}): lockdiag connects to "
        "no server named only by a file found in the working directory; name the file "
        f"(--registry {found} or {ENV_VAR}) to read them"
    )
    return replace(registry, poolers=replace(registry.poolers, pgbouncer=()))


def _note(message: str) -> None:
    click.echo(f"lockdiag: note: {message}", err=True)


def registry_file(path: str | None, strict: bool = True) -> Path | None:
    """Where the registry is (:func:`find_registry`). A file named by --registry,
    LOCKDIAG_REGISTRY or the settings file that is not there is an error saying which named
    it when ``strict``, else a warning and None (the defaults are used only when present)."""
    path = _registry_given(path)
    found = find_registry(path, missing_ok=True)
    if found is None or found.is_file():
        return found
    named = _registry_named(path)
    if strict:
        what = "is not a file" if found.exists() else "does not exist"
        raise RegistryError(f"registry file {found} (from {named}) {what}")
    reason = "not a file" if found.exists() else "no such file"
    _registry_not_used([f"{found}: {reason} (from {named})"])
    return None


def _registry_given(path: str | None) -> str | None:
    """--registry's value, unless click took it from LOCKDIAG_REGISTRY (find_registry reads
    that variable itself)."""
    return None if _registry_source() is ParameterSource.ENVIRONMENT else path


def _registry_named(path: str | None) -> str:
    if path and _registry_source() is ParameterSource.DEFAULT_MAP:
        return "the settings file"
    return "--registry" if path else ENV_VAR


def _registry_source() -> ParameterSource | None:
    context = click.get_current_context(silent=True)
    return context.get_parameter_source("registry") if context else None


def _registry_not_used(reasons: list[str]) -> None:
    for line in reasons:
        click.echo(f"lockdiag: warning: registry not used: {line}", err=True)
    click.echo(
        "lockdiag: warning: going on with raw keys and well-known software's keys "
        "(lockdiag registry check lists every problem)",
        err=True,
    )


def complete_namespace(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Namespace names from the registry (quietly nothing when it cannot be read)."""
    try:
        names = load_registry(ctx.params.get("registry"))
    except LockdiagError:
        return []
    return [
        CompletionItem(name, help=namespace.description or None)
        for name, namespace in sorted(names.namespaces.items())
        if name.startswith(incomplete)
    ]


def complete_target(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Target names from the settings file (quietly nothing when it cannot be read)."""
    try:
        targets = load_settings(COMMANDS).targets
    except SettingsError:
        return []
    return [
        CompletionItem(name, help=target.description or None)
        for name, target in sorted(targets.items())
        if name.startswith(incomplete)
    ]


def show(output: Output, fmt: str) -> None:
    from lockdiag.render import render

    render(output, fmt)
