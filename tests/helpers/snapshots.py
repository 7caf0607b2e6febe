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
    """A snapshot taken at STARTED of these sessions and advisory lock rows (and PgBouncer
    links), on a PostgreSQL 15 server whose database 5 is "app"."""
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


def idle(pid: int, held: float, application: str = "w") -> Session:
    """Idle outside a transaction for ``held`` seconds: its locks are certain session locks."""
    return session(pid, "idle", -timedelta(seconds=held), application=application)


def idle_in_transaction(pid: int, held: float) -> Session:
    """Idle in a transaction for ``held`` seconds: its locks may be transaction locks."""
    return session(pid, "idle in transaction", -timedelta(seconds=held), in_transaction=True)


def active(pid: int, application: str = "w") -> Session:
    """Running a statement for a second."""
    return session(pid, "active", -timedelta(seconds=1), application=application)


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


def generated(locks: int = 10_000) -> Snapshot:
    """A table of ``locks`` granted advisory locks (tenant_summary pairs and bigints in turn)
    of 40 idle backends, and one waiter: for the fast paths, checked against the slow ones."""
    now = STARTED
    sessions = [
        Session(
            pid,
            "app",
            "worker",
            f"w{pid}" if pid % 2 else "50% \\u0000 done",  # a template's marks, as text
            "10.0.0.1",
            5000 + pid,
            now - timedelta(hours=1),
            None,
            None,
            now - timedelta(minutes=pid),
            "idle",
            None,
            None,
            "client backend",
            None,
            "select 1",
        )
        for pid in range(100, 140)
    ]
    rows = [
        LockRow(
            "advisory",
            5,
            None,
            None,
            None,
            None,
            None,
            4102 if n % 2 else 0,
            n,
            2 if n % 2 else 1,
            f"{100 + n % 40}/0",
            100 + n % 40,
            "ExclusiveLock",
            True,
        )
        for n in range(locks)
    ]
    waiter = Session(200, "app", "worker", "waiting \u00e9", None, None, now, now, now, now,
                     "active", "Lock", "advisory", "client backend", None, "select 2")  # fmt: skip
    rows.append(LockRow("advisory", 5, None, None, None, None, None, 4102, 1, 2, "7/1", 200,
                        "ExclusiveLock", False, now - timedelta(seconds=3), (101,)))  # fmt: skip
    server = ServerInfo(150000, now, "postgres", 1, False, True, {5: "app"}, "app")
    return Snapshot(server, "generated", "advisory",
                    {s.pid: s for s in [*sessions, waiter]}, rows)  # fmt: skip
