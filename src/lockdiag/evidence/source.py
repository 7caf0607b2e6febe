"""Where a command's evidence comes from: the :class:`Source` its common options name.

A Source is built once from the options (the CLI's ``source()``): the servers (--dsn, repeated,
LOCKDIAG_DSN, --target NAME from the settings file, --targets FILE), --timeout, the poolers
(--pgbouncer, --pooler-addr), or the snapshot file read instead (--from FILE). It makes the
:class:`~lockdiag.evidence.target.Target` of each server (one server is a fleet of one), and
reads them one-off (:meth:`Source.read`): a :class:`~lockdiag.evidence.reading.Reading` each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from lockdiag.core import snapshot_file
from lockdiag.core.model import Scope, Snapshot
from lockdiag.errors import InputError
from lockdiag.evidence.reader import read_all
from lockdiag.evidence.reading import WHOLE, Analysis, Reading, diagnose
from lockdiag.evidence.target import Target, label
from lockdiag.pg.timeout import DEFAULT_TIMEOUT, Timeout
from lockdiag.registry import Registry
from lockdiag.registry.reading import read_text

TARGETS_LIMIT = 1 << 20  # bytes: a list of DSNs, never more than this
MAX_TARGETS = 1000  # servers one command reads (MAX_PARALLEL at a time): a larger fleet is split

# a snapshot file read once, and the registry it carries (and where that registry was read)
Saved = tuple[Snapshot, tuple[Registry, str | None] | None]


@dataclass(frozen=True)
class Source:
    """The common options of a command: the servers it reads, or the snapshot file instead."""

    dsns: tuple[str, ...] = ()
    timeout: Timeout = DEFAULT_TIMEOUT
    from_file: str | None = None
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

    def targets(self, registry: Registry) -> list[Target]:
        """The servers named (a fleet of one for a single server: libpq's environment when
        none is named), each with the registry's poolers and those of --pgbouncer and
        --pooler-addr; the same server named twice is told apart by its place."""
        dsns: list[str | None] = [*self.dsns] or [None]
        targets: list[Target] = []
        for dsn in dsns:
            name = label(dsn)
            if any(target.label == name for target in targets):  # the same server twice
                name = f"{name}#{len(targets) + 1}"
            targets.append(
                Target.of(dsn, self.timeout, registry, self.pgbouncer, self.pooler_addr, name)
            )
        return targets

    def target(self, registry: Registry) -> Target:
        """The one server of a single-server command (``watch``, ``sample``, ``terminate``...)."""
        if self.fleet:
            raise InputError("this command reads one server: give a single --dsn")
        (target,) = self.targets(registry)
        return target

    @cached_property
    def saved(self) -> Saved:
        """The snapshot file (--from) and the registry it carries, read once."""
        assert self.from_file is not None
        return snapshot_file.load_with_registry(Path(self.from_file))

    def read(self, scope: Scope, registry: Registry, analysis: Analysis = WHOLE) -> list[Reading]:
        """A reading of every target (concurrently when several), or of --from FILE."""
        if self.from_file is None:
            return read_all(self.targets(registry), scope, analysis)
        if self.dsns:
            raise InputError("give either --from FILE or --dsn, not both")
        started = time.monotonic()
        snapshot = self.saved[0]
        diagnosis = diagnose(snapshot, registry, analysis)
        return [Reading(self.from_file, snapshot, diagnosis, None, time.monotonic() - started)]


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
