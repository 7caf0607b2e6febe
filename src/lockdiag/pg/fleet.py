"""The one evidence path: a :class:`Target` (a server and all that completes its snapshots),
the only place a diagnostic session is opened (:func:`open_session`), one snapshot of a target
(:func:`capture`) and of many (:func:`capture_all`). One server is a fleet of one.

With many servers the snapshots are taken concurrently, each with its own timeout: a failing
target is reported with its error and does not stop the others; twenty targets take about as
long as the slowest one, not the sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lockdiag.core.model import Scope, Snapshot
from lockdiag.errors import InputError, LockdiagError
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Poolers, Registry
from lockdiag.registry.reading import read_text

if TYPE_CHECKING:  # the driver is imported where a server is contacted: reading a file needs none
    from lockdiag.pg.session import DiagnosticSession

MAX_PARALLEL = 32


@dataclass(frozen=True)
class Target:
    """One server to read, and everything that completes its snapshots: the registry (names of
    well-known keys computed on the server) and the poolers in front of it (which backends are
    whose server connections). Built by :func:`target` alone, so that no entry point forgets
    the registry's ``[poolers]``."""

    label: str  # host:port/dbname, never a password
    dsn: str | None
    timeout: Timeout
    registry: Registry
    poolers: Poolers


def target(
    dsn: str | None,
    timeout: Timeout,
    registry: Registry,
    pgbouncer: tuple[str, ...] = (),
    addresses: tuple[str, ...] = (),
    name: str | None = None,
) -> Target:
    """The target of ``dsn``: the registry's poolers and those given as options, merged."""
    poolers = registry.poolers.merged(pgbouncer, addresses)
    return Target(name or label(dsn), dsn, timeout, registry, poolers)


def open_session(
    server: Target, *, enrich: bool = True, read_poolers: bool = True
) -> DiagnosticSession:
    """The diagnostic session of ``server``, its snapshots completed with every evidence the
    target has, but what the caller skips on purpose: names from well-known software's tables
    (``enrich``), the pooler consoles and addresses (``read_poolers``)."""
    from lockdiag.pg.session import DiagnosticSession

    return DiagnosticSession(
        server.dsn,
        server.timeout,
        server.registry,
        server.poolers if read_poolers else None,
        enrich=enrich,
    )


@dataclass(frozen=True)
class Capture:
    """One target's snapshot, or the error that kept it (whole: its hint too)."""

    target: str  # a label without any password
    snapshot: Snapshot | None
    error: LockdiagError | None
    seconds: float

    @property
    def reason(self) -> str | None:
        """The error in one line, for a report of many targets."""
        return str(self.error).splitlines()[0] if self.error is not None else None


TARGETS_LIMIT = 1 << 20  # bytes: a list of DSNs, never more than this
MAX_TARGETS = 1000  # servers one command reads (MAX_PARALLEL at a time): a larger fleet is split


def read_targets(path: Path) -> list[str]:
    """One DSN, URI or libpq service name per line; blank lines and # comments are skipped."""
    try:
        lines = read_text(path, TARGETS_LIMIT, "targets file").splitlines()
    except InputError as error:
        raise InputError(f"{path}: {error}") from None
    except OSError as error:
        raise InputError(f"cannot read targets file {path}: {error.strerror or error}") from None
    targets: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if len(targets) == MAX_TARGETS:
            raise InputError(
                f"{path}: names more than {MAX_TARGETS} servers, the most one command reads"
            )
        is_dsn = "=" in text or text.startswith(("postgres://", "postgresql://"))
        targets.append(text if is_dsn else f"service={text}")
    if not targets:
        raise InputError(f"targets file {path} names no server")
    return targets


def label(dsn: str | None) -> str:
    """``host:port/dbname`` (or ``service=name``) for a DSN, never its password."""
    if dsn is None:
        return "default (libpq environment)"
    import psycopg  # here, not at the top: a command that reads a file never imports the driver
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # an invalid DSN still needs a name in the report
        return "invalid DSN"
    if parts.get("service") and not parts.get("host"):
        return f"service={parts['service']}"
    host = parts.get("host") or "localhost"
    where = f"{host}:{parts['port']}" if parts.get("port") else str(host)
    return f"{where}/{parts['dbname']}" if parts.get("dbname") else where


def capture(server: Target, scope: Scope) -> Capture:
    """Connect, take one snapshot with all its evidence, disconnect."""
    started = time.monotonic()
    try:
        with open_session(server) as session:
            taken = session.snapshot(scope)
    except LockdiagError as error:
        return Capture(server.label, None, error, time.monotonic() - started)
    return Capture(server.label, taken, None, time.monotonic() - started)


def capture_all(servers: list[Target], scope: Scope) -> list[Capture]:
    """One capture per target, concurrently (no thread for a single one)."""
    if len(servers) == 1:
        return [capture(servers[0], scope)]
    from concurrent.futures import ThreadPoolExecutor  # with logging: only a fleet needs them

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(servers))) as pool:
        return list(pool.map(lambda server: capture(server, scope), servers))
