"""A :class:`Target`: one server to read, and everything that completes its snapshots.

There is one Target type in lockdiag: the commands, `watch`, `sample` and the exporter read the
same thing (the exporter keeps what each target's scrapes said beside it, in its own
``TargetState``; the settings file's ``[targets.NAME]`` tables are ``TargetEntry`` records).
"""

from __future__ import annotations

from dataclasses import dataclass

from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Poolers, Registry


@dataclass(frozen=True)
class Target:
    """One server to read, and everything that completes its snapshots: --timeout, the registry
    (names of well-known keys computed on the server) and the poolers in front of it (which
    backends are whose server connections). Built by :meth:`of`, so that no entry point
    forgets the registry's ``[poolers]``."""

    label: str  # host:port/dbname, never a password
    dsn: str | None
    timeout: Timeout
    registry: Registry
    poolers: Poolers

    @classmethod
    def of(
        cls,
        dsn: str | None,
        timeout: Timeout,
        registry: Registry,
        pgbouncer: tuple[str, ...] = (),
        addresses: tuple[str, ...] = (),
        name: str | None = None,
    ) -> Target:
        """The target of ``dsn``: the registry's poolers and those given as options
        (--pgbouncer, --pooler-addr), merged; named ``name``, else by :func:`label`."""
        poolers = registry.poolers.merged(pgbouncer, addresses)
        return cls(name or label(dsn), dsn, timeout, registry, poolers)


def label(dsn: str | None) -> str:
    """``host:port/dbname`` (or ``service=name``) for a DSN, never its password."""
    if dsn is None:
        return "default (libpq environment)"
    # here, not at the top: a command that reads a file never imports the driver
    from lockdiag.pg.connection import dsn_label

    return dsn_label(dsn)
