"""`lockdiag log FILE...`: lock waits, deadlocks and lock timeouts from PostgreSQL's own log."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import IO

import click

from lockdiag.cli.common import (
    DURATION,
    connection_options,
    formats,
    get_registry,
    registry_option,
    show,
    source,
)
from lockdiag.errors import InputError
from lockdiag.keys import AdvisoryTag, InvalidKey, LockTriple, parse_lock
from lockdiag.logs import (
    CHUNK,
    LogLines,
    LogReader,
    Names,
    Tally,
    relation_oids,
    report,
)
from lockdiag.registry import Registry
from lockdiag.views.log import log_output

TIMES = [
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d",
]


def _open(name: str) -> IO[bytes]:
    """A file or FIFO by name, or standard input ('-'): read as a stream, in bounded chunks.
    A device is refused: /dev/zero or /dev/urandom never end, and no log is one."""
    if name == "-":
        return sys.stdin.buffer
    path = Path(name)
    if path.is_char_device() or path.is_block_device():
        raise InputError(f"{name}: a device, not a log file: give a file, a FIFO or '-'")
    try:
        return path.open("rb", buffering=CHUNK)
    except OSError as error:
        raise InputError(f"{name}: cannot read: {error.strerror or error}") from None


def _when(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    for pattern in TIMES:
        try:
            return datetime.strptime(value, pattern)
        except ValueError:
            continue
    raise click.BadParameter("give a time like '2026-05-01 03:10' (the log's own time zone)")


def _timeline_key(value: str | None, names: Registry) -> LockTriple | AdvisoryTag | None:
    """``--key``: numbers ('4102,73', '-55037190', '4102,73,2', an extension's tag
    '0,822708183,10') or 'NAMESPACE RESOURCE'."""
    if value is None:
        return None
    words = value.replace(",", " ").split()
    try:
        return parse_lock(words)
    except InvalidKey:
        if not words or words[0].lstrip("-").isdigit():
            raise
    return names.key(words[0], *words[1:]).triple


def _server_names(tally: Tally, registry: Registry) -> Names:
    """With --dsn: database names, and the names of this database's relations in the log
    (read from the catalog pg_class only)."""
    where = source()
    if not where.dsns:
        return Names()
    from lockdiag.evidence import Reader

    wanted = sorted(set(relation_oids(tally)))[:10_000]
    # the catalog alone: no names from well-known software's tables, no pooler's console
    with Reader(where.target(registry), enrich=False, read_poolers=False) as reader:
        here, databases, named = reader.session.names(sorted({r for _, r in wanted}))
    # an OID names a table only in its own database: the others' are left as numbers
    relations = {(d, r): named[r] for d, r in wanted if d == here and r in named}
    return Names(databases, relations)


@click.command("log")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option(
    "--prefix",
    metavar="PREFIX",
    help="The server's log_line_prefix, for stderr logs (default: detected among the "
    "common layouts), e.g. '%m [%p] %q%u@%d/%a '.",
)
@click.option(
    "--key",
    "key_text",
    metavar="KEY",
    help="Also a timeline of one advisory key: '4102,73', '-55037190', '4102,73,2' "
    "(classid,objid,objsubid) or 'NAMESPACE RESOURCE' ('tenant_summary 73').",
)
@click.option("--since", callback=_when, metavar="TIME", help="Only entries from this time on.")
@click.option("--until", callback=_when, metavar="TIME", help="Only entries up to this time.")
@click.option(
    "--gap",
    **DURATION,
    default="1m",
    show_default=True,
    help="Waits on one key further apart than this are separate episodes.",
)
@connection_options
@registry_option
@formats("markdown", "csv")
def log_command(
    files: tuple[str, ...],
    prefix: str | None,
    key_text: str | None,
    since: datetime | None,
    until: datetime | None,
    gap: float,
    registry: str | None,
    fmt: str,
) -> None:
    """Lock waits, deadlocks and timeouts from the server's log.

    The incident after it ended. Reads stderr (any common log_line_prefix), csvlog and
    jsonlog, plain or gzip, '-' for standard input; several files are read in order as one
    log. Needs log_lock_waits = on: PostgreSQL logs a wait once it passes deadlock_timeout.
    Advisory keys are named by the registry and the catalogue of well-known software; --dsn
    adds database and table names. --since and --until are in the log's own time zone.
    Nothing is written anywhere.

    \b
    Examples:
      lockdiag log /var/log/postgresql/postgresql-16-main.log
      lockdiag log postgresql.csv.1.gz postgresql.csv --since '2026-05-01 03:00'
      zcat postgresql-*.log.gz | lockdiag log - --key 'tenant_summary 73'
      lockdiag log postgresql.json --format markdown > incident.md
    """
    names = get_registry(registry)
    timeline = _timeline_key(key_text, names)
    tally = Tally(since, until, gap, timeline)
    for name in files:
        raw = _open(name)
        lines = LogLines(raw, name)
        try:
            tally.read(LogReader(lines, name, prefix))
        except OSError as error:
            raise InputError(f"{name}: cannot read: {error.strerror or error}") from None
        finally:
            if raw is not sys.stdin.buffer:
                raw.close()
        if lines.damage.truncated:
            click.echo(
                f"lockdiag: warning: {name}: compressed data ends early (or is damaged): "
                "read up to there",
                err=True,
            )
    show(log_output(report(tally, names, _server_names(tally, names))), fmt)
