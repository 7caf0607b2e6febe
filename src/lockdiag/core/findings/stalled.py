"""pg_repack stalled: waiting for transactions older than its own, which no threshold on its
locks can see (its lock's holder polls)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from lockdiag.core.catalogue import Known
from lockdiag.core.findings.model import Finding, Kind
from lockdiag.core.model import Session, Snapshot
from lockdiag.core.policy import CheckPolicy
from lockdiag.durations import format_duration

# pg_repack's main connection, step 4 (bin/pg_repack.c, repack_one_table): it applies its log
# (repack.repack_apply) and polls SQL_XID_ALIVE once a second until the transactions open at
# its snapshot have ended, printing "Waiting for N transactions to finish. First PID: ..."
REPACK_POLLS = ("virtualtransaction = ANY", "repack.repack_apply")
VACUUM = ("vacuum ", "autovacuum: ")  # pg_repack ignores these (its SQL_XID_SNAPSHOT)


def stalled_repacks(
    snapshot: Snapshot, software: dict[int, Known], policy: CheckPolicy
) -> Iterator[Finding]:
    """pg_repack waiting for older transactions: its lock's holder polls, so its lower bound
    never passes a second and no threshold on it can fire. The transactions it waits for are
    at least those of its database opened before its own first one (its table lock's, taken
    before its snapshot); the oldest is named. Fires with how long it has been at the table."""
    now = snapshot.server.now
    for pid, known in software.items():
        session = snapshot.session(pid)
        if known.software != "pg_repack" or session is None or session.hidden:
            continue
        if not any(poll in (session.query or "") for poll in REPACK_POLLS):
            continue
        own = {
            s.pid: s
            for s in snapshot.sessions.values()
            if s.database == session.database and s.application_name == session.application_name
        }
        # its table lock's transaction (step 1, before its snapshot), else its connection's
        began = min(
            (s.xact_start for s in own.values() if s.xact_start), default=session.backend_start
        )
        if began is None:
            continue
        others = snapshot.sessions.values()
        older = sorted(
            (s for s in others if s.pid not in own and _waited_for(s, session.database, began)),
            key=lambda s: s.xact_start or now,
        )
        at_it = (now - began).total_seconds()
        severity = policy.wait_age.severity(at_it)
        if not older or severity is None:
            continue
        yield Finding(
            Kind.STALLED,
            severity,
            pid,
            known.label,
            f"pg_repack (pid {pid}) has been at {known.meaning.removeprefix('repack of ')} for "
            f"{format_duration(at_it)} and waits for older transactions to finish (its "
            f"output: 'Waiting for N transactions to finish'), at least {len(older)} opened "
            f"before it began; the oldest: {_transaction(older[0], now)}",
            f"pg_repack goes on by itself once pid {older[0].pid}'s transaction ends: ask its "
            "program to commit or roll back (it is not pg_repack's); leave pg_repack running "
            "(stopped mid-run it leaves its trigger and its repack.log_<oid> table behind)",
            None,
            at_it,
        )


def _waited_for(other: Session, database: str | None, began: datetime) -> bool:
    """A transaction pg_repack waits for: in its database, opened before its own first."""
    start, query = other.xact_start, (other.query or "").lstrip().lower()
    return (
        start is not None
        and start < began
        and other.database == database
        and not query.startswith(VACUUM)
    )


def _transaction(session: Session, now: datetime) -> str:
    """``pid 7 (old-transaction), idle in transaction, its transaction open since
    2026-...+00:00 (3m10s), last query: SELECT ...``."""
    start = session.xact_start
    assert start is not None
    app = f" ({session.application_name})" if session.application_name else ""
    verb = "running" if session.state == "active" else "last query"
    query = " ".join((session.query or "").split())
    query = query[:120] + ("…" if len(query) > 120 else "")
    age = format_duration((now - start).total_seconds())
    return (
        f"pid {session.pid}{app}, {session.state or 'state unknown'}, its transaction open "
        f"since {start.isoformat(timespec='seconds')} ({age})"
        + (f", {verb}: {query}" if query else "")
    )
