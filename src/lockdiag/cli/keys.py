"""The registry's names and numbers: registry check|show, key, decode. No server is read, but
by `decode` when one is named (hashtext() computed there)."""

from __future__ import annotations

import sys

import click

from lockdiag.cli.common import (
    NUMBERS_SETTINGS,
    complete_namespace,
    format_option,
    get_registry,
    registry_file,
    registry_option,
    server_options,
    show,
    source,
)
from lockdiag.cli.group import LockdiagGroup
from lockdiag.core.analysis import decode
from lockdiag.core.catalogue import build_catalogue, collisions, hashed_names
from lockdiag.errors import EXIT_NEGATIVE, InputError
from lockdiag.keys import AdvisoryTag, InvalidKey, LockTriple, parse_lock
from lockdiag.registry import Registry, check_file
from lockdiag.views.keys import (
    check_output,
    decode_output,
    key_output,
    registry_output,
    tag_output,
)


@click.group("registry", cls=LockdiagGroup)
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
    path = registry_file(registry)
    if path is None:
        raise InputError(
            "no registry file found: give --registry PATH, set LOCKDIAG_REGISTRY, or create "
            "./lockdiag.toml"
        )
    parsed, problems = check_file(path, collisions)
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
    show(registry_output(get_registry(registry, strict=True)), fmt)


@click.command("key", context_settings=NUMBERS_SETTINGS)
@click.argument("namespace", shell_complete=complete_namespace)
@click.argument("resource", nargs=-1)
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
    metavar="FUNCTION",
    help="The SQL function to show: pg_[try_]advisory_[xact_]lock[_shared], or "
    "pg_advisory_unlock[_shared].",
)
@registry_option
@format_option
def key_command(
    namespace: str, resource: tuple[str, ...], function: str, registry: str | None, fmt: str
) -> None:
    """The pg_locks numbers and the SQL that takes NAMESPACE RESOURCE.

    A namespace of one key (key = ... in the registry) takes no RESOURCE.

    \b
    Examples:
      lockdiag key tenant_summary 73
      lockdiag key tenant_summary 73 --function pg_advisory_lock
      lockdiag key tenant_period 73 2026-11      # a resource of two parts
    """
    key = get_registry(registry, strict=True).key(namespace, *resource)
    show(key_output(key, resource, function), fmt)


@click.command("decode", context_settings=NUMBERS_SETTINGS)
@click.argument("numbers", nargs=-1, required=True)
@click.option(
    "--database",
    metavar="NAME",
    help="Also try keys that software derives from this database name (Rails, sqlx, ...).",
)
@server_options(
    "for names computed by its hashtext() (pg_partman, pgmq, [known] hashtext; read-only, one "
    "query): none is asked without it"
)
@registry_option
@format_option
def decode_command(
    numbers: tuple[str, ...],
    database: str | None,
    registry: str | None,
    fmt: str,
) -> None:
    """Turn numbers back into a name.

    One number is a bigint key, two are a signed int4 pair, three are classid objid objsubid
    as pg_locks shows them (unsigned). An objsubid other than 1 or 2 is an extension's
    advisory tag (pg_auto_failover, Citus): said so, never named. A server named (--dsn,
    --target, LOCKDIAG_DSN) is asked for the names only its hashtext() computes, within
    --timeout.

    \b
    Examples:
      lockdiag decode 4102 73 2
      lockdiag decode 4102 73
      lockdiag decode -55037190
      lockdiag decode 204970145 1222811995 1 --database shop_test
      lockdiag decode -1738207498 --dsn postgresql://monitor@db1/app
    """
    names = get_registry(registry)
    key = _numbers(numbers, names)
    if isinstance(key, AdvisoryTag):
        show(tag_output(key), fmt)
        return
    strings = hashed_names(names.candidates)
    asked = source()
    derived = []
    if asked.dsns:
        from lockdiag.evidence import Reader

        # one query: no names from well-known software's tables, no pooler's console
        with Reader(asked.target(names), enrich=False, read_poolers=False) as reader:
            derived = reader.session.hashtext_keys(strings)
    catalogue = build_catalogue(names.candidates, [database] if database else [], derived)
    untried = [] if asked.dsns else strings
    decoded = decode(names, catalogue, key, database)
    show(decode_output(decoded, untried, no_database=database is None), fmt)


def _numbers(numbers: tuple[str, ...], names: Registry) -> LockTriple | AdvisoryTag:
    """The key (or an extension's tag); a name typed where a number goes points to `key`,
    which goes the other way."""
    try:
        return parse_lock(numbers)
    except InvalidKey:
        if not numbers[0][:1].isalpha():
            raise
        typed = " ".join(numbers) if numbers[0] in names.namespaces else "NAMESPACE RESOURCE"
        raise InvalidKey(
            f"decode turns numbers into a name, and {numbers[0]!r} is not a number",
            hint=f"the numbers of a name: lockdiag key {typed}",
        ) from None
