"""What the registry's ``[poolers]`` say about this connection: a session lock is refused
through a PgBouncer in transaction or statement pooling. A console's answer is kept for a while,
so a worker does not read it for every lock."""

from __future__ import annotations

import logging
import time

from lockdiag.errors import LockdiagError
from lockdiag.registry import Registry
from lockdiag.worker.errors import PooledSession

log = logging.getLogger("lockdiag.worker")

_CONSOLE_TTL = 30.0  # seconds a console's answer (or a connection it does not list) is reused
_consoles: dict[str, tuple[float, str, dict[tuple[str, int], str]]] = {}
_not_listed: dict[tuple[str, str, int], float] = {}  # (console, addr, port): when last missed


def _pool_modes(dsn: str) -> tuple[str, dict[tuple[str, int], str]]:
    """One PgBouncer's label (host:port, never the DSN: it may hold a password) and the pool
    mode of each of its server connections, by (local_addr, local_port)."""
    from lockdiag.pg.pgbouncer import read_console

    console = read_console(dsn)  # within --timeout's default
    modes = {
        (p.get("database"), p.get("user")): str(p.get("pool_mode") or "") for p in console.pools
    }
    return console.label, {
        (str(s.get("local_addr")), int(s.get("local_port") or 0)): modes.get(
            (s.get("database"), s.get("user")), ""
        )
        for s in console.servers
    }


def _listed(dsn: str, address: tuple[str, int], fresh: bool) -> tuple[str, str] | None:
    """(label, mode) when console DSN lists ADDRESS as one of its server connections."""
    now = time.monotonic()
    cached = _consoles.get(dsn)
    if fresh or cached is None or now - cached[0] > _CONSOLE_TTL:
        label, modes = _pool_modes(dsn)
        cached = _consoles[dsn] = (now, label, modes)
    return (cached[1], cached[2][address]) if address in cached[2] else None


def _pooler_mode(registry: Registry, address: str | None) -> tuple[str, str] | None:
    """(pooler, pool mode) when ADDRESS ("addr port" of this session's server connection, as
    the server sees it) is a server connection of a PgBouncer in the registry, or comes from
    one of its pooler addresses (mode ""); None when no known pooler is in the way."""
    if not address:
        return None  # a Unix socket: no pooler
    host, _, port = address.partition(" ")
    where = (host, int(port))
    for dsn in registry.poolers.pgbouncer:
        missed = _not_listed.get((dsn, *where))
        if missed is not None and time.monotonic() - missed < _CONSOLE_TTL:
            continue  # a direct connection, seen lately: no console read per lock
        try:
            # read again on a miss: a server connection opened since the last read
            found = _listed(dsn, where, fresh=False) or _listed(dsn, where, fresh=True)
        except LockdiagError as error:
            log.warning("lockdiag: cannot tell the pool mode: %s", error)
            continue
        if found is not None:
            return found
        _not_listed[(dsn, *where)] = time.monotonic()
    if host in registry.poolers.addresses:
        return host, ""
    return None


def check_pooler(registry: Registry, namespace: str, address: str | None) -> None:
    """Refuse a session lock through transaction or statement pooling; warn when the mode
    cannot be known."""
    found = _pooler_mode(registry, address)
    if found is None:
        return
    pooler, mode = found
    if mode in ("transaction", "statement"):
        raise PooledSession(
            f"session_lock {namespace}: this connection goes through PgBouncer {pooler} in "
            f"{mode} pooling, which hands its server session to other clients between "
            "transactions: a session lock would outlive this worker's transaction and be "
            "inherited (re-entrantly) by the next client; use xact_lock inside a transaction, "
            "or route this worker through session pooling"
        )
    if not mode:
        log.warning(
            "lockdiag: session_lock %s: the connection comes from pooler %s, whose pool mode is "
            "unknown: in transaction pooling the lock can outlive the worker",
            namespace,
            pooler,
        )
