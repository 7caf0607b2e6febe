"""Many servers in one command: snapshots taken concurrently, each with its own timeout.

A failing target is reported with its error and does not stop the others; twenty targets take
about as long as the slowest one, not the sum.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from lockdiag.core.model import Scope, Snapshot
from lockdiag.errors import InputError, LockdiagError
from lockdiag.pg.session import take_snapshot
from lockdiag.registry import Poolers, Registry
from lockdiag.registry.validation import read_text

MAX_PARALLEL = 32


@dataclass(frozen=True)
class Capture:
    target: str  # a label without any password
    snapshot: Snapshot | None
    error: str | None
    seconds: float


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


def label(dsn: str) -> str:
    """``host:port/dbname`` (or ``service=name``) for a DSN, never its password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # an invalid DSN still needs a name in the report
        return "invalid DSN"
    if parts.get("service") and not parts.get("host"):
        return f"service={parts['service']}"
    host = parts.get("host") or "localhost"
    where = f"{host}:{parts['port']}" if parts.get("port") else str(host)
    return f"{where}/{parts['dbname']}" if parts.get("dbname") else where


def capture_all(
    dsns: list[str],
    timeout: float,
    scope: Scope,
    registry: Registry,
    poolers: Poolers | None = None,
) -> list[Capture]:
    def one(dsn: str) -> Capture:
        started = time.monotonic()
        try:
            taken = take_snapshot(dsn, timeout, scope, registry, poolers)
        except LockdiagError as error:
            return Capture(label(dsn), None, str(error).splitlines()[0], time.monotonic() - started)
        return Capture(label(dsn), taken, None, time.monotonic() - started)

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(dsns))) as pool:
        return list(pool.map(one, dsns))
