"""The settings file reaches click as the root context's ``default_map``, so click orders it:
the command line, then an option's environment variable, then the file, then the built-in
default. Every value is checked against the option it sets before the command runs: a file
that cannot be used stops the command with its line (see docs/guides/settings.md for why it
does not warn and go on as a broken registry does). Also `lockdiag settings init|show`.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from lockdiag.cli.group import LockdiagGroup
from lockdiag.errors import EXIT_UNKNOWN, InputError
from lockdiag.registry.discovery import found_unnamed, unnamed_candidates
from lockdiag.settings import (
    DEFAULTS,
    ENV_VAR,
    EVERY_COMMAND,
    SETTABLE,
    Settings,
    SettingsError,
    hide_password,
    load_settings,
    settings_path,
    suggestion,
)

HINT = f"fix it (lockdiag settings show checks it), or run without it: {ENV_VAR}= lockdiag ..."
UNKNOWN_ON_BAD_INPUT = {"check"}  # a monitoring plugin: bad input is UNKNOWN (3), not 2
SETTINGS_ERROR = "lockdiag.settings_error"  # for such a command to say in its own --format
ENVIRONMENT = {"registry": "LOCKDIAG_REGISTRY", "target": "LOCKDIAG_DSN"}


def use_settings(ctx: click.Context, name: str) -> None:
    """Read the settings file and give the command ``name`` its defaults from it."""
    assert isinstance(ctx.command, click.Group)
    try:
        settings = load_settings(ctx.command.list_commands(ctx))
        command = ctx.command.get_command(ctx, name)
        if command is not None:
            ctx.default_map = {name: command_defaults(settings, command, (name,))}
    except SettingsError as error:
        error.hint = HINT
        if name not in UNKNOWN_ON_BAD_INPUT:
            raise
        error.exit_code = EXIT_UNKNOWN
        ctx.meta[SETTINGS_ERROR] = error  # raised by the command, which knows its --format
        return
    ctx.meta["lockdiag.settings"] = settings
    warn_of_passwords(settings)


def warn_of_passwords(settings: Settings) -> None:
    if exposed := settings.exposed_passwords():
        click.echo(
            f"lockdiag: warning: settings file {settings.path} is readable by others and holds "
            f"a password (target {', '.join(exposed)}): chmod 600 it, or use ~/.pgpass",
            err=True,
        )


def command_defaults(settings: Settings, command: click.Command, path: tuple[str, ...]) -> Any:
    """The ``default_map`` of one command (a group's holds its subcommands'), every value
    checked against its option: the command's table over ``[defaults]``."""
    table = _table(settings, path)
    if isinstance(command, click.Group):
        context = click.Context(command, info_name=path[-1])
        names = command.list_commands(context)
        for key in table:
            if key not in names:
                raise settings.error(
                    f"{' '.join(path)} has no command {key!r}{suggestion(key, names)}", path, key
                )
        return {
            name: command_defaults(settings, sub, (*path, name))
            for name in names
            if (sub := command.get_command(context, name)) is not None
        }
    options = options_of(command)
    chosen: dict[str, tuple[Any, tuple[str, ...]]] = {
        key: (value, (DEFAULTS,)) for key, value in settings.defaults.items() if key in options
    }
    for key, value in table.items():
        if key not in options:
            settable = [name for name in options if name in SETTABLE]
            raise settings.error(
                f"{' '.join(path)} has no option --{key}{suggestion(key, settable)}", path, key
            )
        if key not in SETTABLE:
            reason = "a server is named under [targets]" if key == "dsn" else "give it each time"
            raise settings.error(f"--{key} is not a setting ({reason})", path, key)
        chosen[key] = (value, path)
    return {
        options[key].name: _checked(settings, command, options[key], key, value, where)
        for key, (value, where) in chosen.items()
    }


def options_of(command: click.Command) -> dict[str, click.Option]:
    """A command's options by their name on the command line, without the dashes."""
    return {
        name[2:]: param
        for param in command.params
        if isinstance(param, click.Option)
        for name in param.opts
        if name.startswith("--")
    }


def _table(settings: Settings, path: tuple[str, ...]) -> dict[str, Any]:
    table: Any = settings.commands
    for index, name in enumerate(path):
        table = table.get(name, {})
        if not isinstance(table, dict):
            where = " ".join(path[: index + 1])
            raise settings.error(f"{where} must be a table of its subcommands", path[:index], name)
    found: dict[str, Any] = table
    return found


def _checked(
    settings: Settings,
    command: click.Command,
    option: click.Option,
    key: str,
    value: Any,
    table: tuple[str, ...],
) -> Any:
    """The value as click takes it from ``default_map``, checked as click would check it
    on the command line (its type and callback), the file's line in the error."""
    shown = f"{key} = {json.dumps(value, ensure_ascii=False, default=str)}"  # as TOML writes it
    if option.is_flag:
        if not isinstance(value, bool):
            raise settings.error(f"{shown}: give true or false", table, key)
        return value
    items = value if option.multiple and isinstance(value, list) else [value]
    if any(isinstance(item, bool) or not isinstance(item, str | int | float) for item in items):
        many = " or a list of them" if option.multiple else ""
        raise settings.error(f"{shown}: give a string{many}", table, key)
    texts = [
        str(Path(str(item)).expanduser()) if key == "registry" else str(item) for item in items
    ]
    if key == "target":
        for name in texts:
            if name not in settings.targets:
                raise settings.error(
                    f"{shown}: no [targets.{name}]{suggestion(name, settings.targets)}",
                    table,
                    key,
                )
    given: Any = texts if option.multiple else texts[0]
    try:  # in a context of its own: the callbacks that remember a value remember it there
        option.process_value(click.Context(command, info_name=command.name), given)
    except click.BadParameter as error:
        raise settings.error(f"{shown}: {error.message}", table, key) from None
    return given


# -- lockdiag settings init | show -------------------------------------------------------------


@click.group("settings", cls=LockdiagGroup)
def settings_group() -> None:
    """Defaults for the options you repeat, and named servers (settings.toml).

    \b
    Examples:
      lockdiag settings init
      lockdiag settings show
      LOCKDIAG_SETTINGS= lockdiag list      # without the settings file
    """


@settings_group.command("init")
def settings_init() -> None:
    """Write a commented settings file: every setting, commented out, with its default.

    An existing file is never overwritten.

    \b
    Example:
      lockdiag settings init && $EDITOR ~/.config/lockdiag/settings.toml
    """
    path = settings_path()
    if path is None:
        raise InputError(f"{ENV_VAR} is set empty (no settings file): unset it or name a path")
    text = template()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: refused, never overwritten, even when a file appears meanwhile
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InputError(f"settings file {path} exists: not overwritten") from None
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    click.echo(f"lockdiag: wrote {path}", err=True)


@settings_group.command("show")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "table", "plain", "json"]),
    default="auto",
    show_default=True,
    help="auto: a table on a terminal, plain text when piped.",
)
def settings_show(fmt: str) -> None:
    """Every setting as a command would use it now, and where it comes from.

    Reading the whole file checks it: every table and option, against every command.

    \b
    Example:
      lockdiag settings show --format json
    """
    # not at load: every command loads this module
    from lockdiag.render import Output, Table, render

    root = _root_group()
    context = click.Context(root, info_name="lockdiag")
    settings = load_settings(root.list_commands(context))
    warn_of_passwords(settings)
    rows = [row for path, command in _leaves(root) for row in _effective(settings, command, path)]
    targets = [[name, hide_password(t.dsn), t.description] for name, t in settings.targets.items()]
    where = f"none ({ENV_VAR} is empty)" if settings.path is None else str(settings.path)
    if settings.path is not None and not settings.read:
        where += " (absent: lockdiag settings init writes one)"
    render(
        Output(
            lambda: [
                Table(
                    ["COMMAND", "OPTION", "VALUE", "FROM"], rows, title=f"settings file: {where}"
                ),
                Table(["TARGET", "DSN", "DESCRIPTION"], targets, title="targets"),
            ],
            lambda: {
                "path": str(settings.path) if settings.path else None,
                "settings": [
                    dict(zip(("command", "option", "value", "from"), row, strict=True))
                    for row in rows
                ],
                "targets": [
                    dict(zip(("name", "dsn", "description"), t, strict=True)) for t in targets
                ],
            },
        ),
        fmt,
    )


def _root_group() -> click.Group:
    from lockdiag.cli import cli

    return cli


def _leaves(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        elif command is not None and any(key in SETTABLE for key in options_of(command)):
            yield (*path, name), command


def _effective(
    settings: Settings, command: click.Command, path: tuple[str, ...]
) -> list[list[str]]:
    """What click would take for each settable option, given no option on the command line."""
    defaults = command_defaults(settings, command, path)
    context = command.make_context(path[-1], [], default_map=defaults, resilient_parsing=True)
    rows = []
    for key, option in options_of(command).items():
        if key not in SETTABLE:
            continue
        source = context.get_parameter_source(option.name or key)
        value, origin = _origin(settings, path, key, option, defaults, source)
        rows.append([" ".join(path), key, value, origin])
    return rows


def _origin(
    settings: Settings,
    path: tuple[str, ...],
    key: str,
    option: click.Option,
    defaults: dict[str, Any],
    source: ParameterSource | None,
) -> tuple[str, str]:
    variable = ENVIRONMENT.get(key)
    if key == "target" and os.environ.get("LOCKDIAG_DSN"):  # read by hand: see common.source
        return hide_password(os.environ["LOCKDIAG_DSN"]), f"environment ({variable})"
    if source is ParameterSource.ENVIRONMENT and variable:
        return os.environ[variable], f"environment ({variable})"
    if source is ParameterSource.DEFAULT_MAP:
        table = path if key in _table(settings, path) else (DEFAULTS,)
        line = settings.lines.find(table, key) if settings.lines else None
        return _text(defaults[option.name or key]), f"settings file line {line} [{'.'.join(table)}]"
    if key == "target":
        return "", "default (libpq's environment: PGHOST, PGSERVICE...)"
    if key == "registry":
        return _found_registry()
    return _text(option.default is True if option.is_flag else option.default), "default"


def _found_registry() -> tuple[str, str]:
    """The registry file a command would find with none named, and where it was found."""
    found = found_unnamed()
    if found is not None:
        return str(found[0]), f"default (found in {found[1]})"
    looked = ", ".join(str(path) for path, _ in unnamed_candidates())
    return "", f"default (none found: {looked})"


def _text(value: Any) -> str:
    """A value as the file writes it, without quotes; nothing for no default."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value) if isinstance(value, str | int | float) else ""


# -- the commented template ----------------------------------------------------------------------

HEADER = f"""\
# lockdiag settings: defaults for the options you would otherwise type every time, and names
# for your servers. Every setting is commented out and shows lockdiag's built-in default, and
# so is every table: uncomment a table's [header] with the settings you set under it, or add
# the table anywhere in the file (each table once).
#
# Precedence: the command line, then the environment (LOCKDIAG_DSN, LOCKDIAG_REGISTRY), then
# this file, then the built-in defaults. Keys are option names as on the command line.
# A table per command; [defaults] applies to every command that has the option, and a
# command's own table may set those too (e.g. format = "nagios" under [check]).
#
# lockdiag settings show      what each command would use now, and where it comes from
# {ENV_VAR}= lockdiag ...     run without this file
# Documentation: docs/guides/settings.md

# [defaults]
# The server when no --dsn, --target or LOCKDIAG_DSN is given: a name under [targets].
# No default: libpq's environment (PGHOST, PGPORT, PGDATABASE, PGSERVICE, ~/.pgpass).
# target = "prod"

# statement_timeout and connect timeout of lockdiag's session.
# timeout = "5s"

# The registry file (~ is expanded). No default: ./lockdiag.toml, then
# ~/.config/lockdiag/lockdiag.toml.
# registry = "~/ops/lockdiag.toml"

# auto: a table on a terminal, plain text when piped; also table, plain, json (and a
# command's own formats in its table: markdown, csv, nagios, prometheus).
# format = "auto"

# Named servers: lockdiag list --target prod. Never a password here: put it in ~/.pgpass
# or use a libpq service (dsn = "service=prod", see pg_service.conf).
#   [targets.prod]
#   dsn = "postgresql://monitor@db1.example.com/app"
#   description = "the production primary"
"""


def template() -> str:
    """The commented settings file: [defaults], then each command's own settings, generated
    from the commands' options so that it cannot drift from them."""
    sections = [HEADER]
    for path, command in _leaves(_root_group()):
        lines = [
            line
            for key, option in options_of(command).items()
            if key in SETTABLE and key not in EVERY_COMMAND
            for line in _commented(key, option)
        ]
        if lines:
            sections.append("\n".join([f"# [{'.'.join(path)}]", *lines]))
    return "\n".join(sections)


def _commented(key: str, option: click.Option) -> list[str]:
    default = option.default
    if isinstance(default, bool) or option.is_flag:
        value = "true" if default is True else "false"
    elif isinstance(default, str | int | float):
        value = _toml_string(str(default))
    else:
        value = '""  # no default'
    help_lines = textwrap.wrap(" ".join((option.help or "").split()), 94)
    return [*(f"# {line}" for line in help_lines), f"# {key} = {value}", ""]


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
