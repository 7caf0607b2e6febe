"""Snapshots built by hand: a server, its sessions and advisory lock rows at one instant.

Every time is relative to STARTED, the snapshot statement's start, so a test's ages come from
the snapshot's own clock and never from the wall clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from lockdiag.core.analysis import Decoded, LockEntry
from lockdiag.core.catalogue import Known
from lockdiag.core.model import LockRow, PoolLink, ServerInfo, Session, Snapshot
from lockdiag.keys import from_bigint

STARTED = datetime(2026, 12, 1, 3, 0, 0, tzinfo=timezone.utc)  # the snapshot statement's start


def snapshot(
    sessions: list[Session], locks: list[LockRow], pool: dict[int, PoolLink] | None = None
) -> Snapshot:
    server = ServerInfo(150000, STARTED, "postgres", 1, False, True, {5: "app"}, "app")
    return Snapshot(
        server, "test", "advisory", {s.pid: s for s in sessions}, locks, pool=pool or {}
    )


def advisory(
    pid: int,
    key: int,
    granted: bool = True,
    blocked_by: tuple[int, ...] = (),
    namespace: int = 4102,
    waited: float = 0.0,
) -> LockRow:
    """A pair-form advisory lock (namespace, key); a waiter has waited ``waited`` seconds."""
    waitstart = None if granted else STARTED - timedelta(seconds=waited)
    return LockRow(
        "advisory", 5, None, None, None, None, None, namespace, key, 2, f"{pid}/0", pid,
        "ExclusiveLock", granted, waitstart, blocked_by if not granted else None,
    )  # fmt: skip


def session(
    pid: int, state: str, changed: timedelta, in_transaction: bool = False, application: str = "w"
) -> Session:
    """A client backend whose state changed at STARTED + ``changed``."""
    return Session(
        pid, "app", "worker", application, backend_start=STARTED - timedelta(hours=1),
        xact_start=STARTED - timedelta(minutes=10) if in_transaction else None,
        state_change=STARTED + changed, state=state, backend_type="client backend", query="q",
    )  # fmt: skip


def known_lock(
    known: Known, holder: Session, others: tuple[Session, ...] = (), key: int = 5
) -> tuple[LockEntry, Snapshot]:
    """``holder`` holding a key named ``known`` (the bigint ``key``), analysed as the analysis
    would: a session lock where the holder is idle, else of unknown lifetime."""
    triple = from_bigint(key)
    row = LockRow(
        "advisory", 5, None, None, None, None, None, triple.classid, triple.objid,
        triple.objsubid, f"{holder.pid}/0", holder.pid, "ExclusiveLock", True,
    )  # fmt: skip
    idle = holder.certainly_outside_transaction(STARTED)
    entry = LockEntry(
        row, holder, holder.database, Decoded(triple, known=known),
        "session" if idle else "unknown", 60.0 if idle else None, None,
    )  # fmt: skip
    return entry, snapshot([holder, *others], [row])
