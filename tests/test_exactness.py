"""The rules that keep certainty exact on a busy server, on snapshots built by hand: the server
moves between the read of pg_locks and the read of pg_stat_activity inside one statement."""

from __future__ import annotations

from datetime import timedelta

from lockdiag.core.analysis import Flag
from lockdiag.core.diagnosis import Diagnosis

from helpers.registry import parsed_registry
from helpers.snapshots import advisory, session, snapshot

REGISTRY = parsed_registry('[namespaces.tenant_summary]\nid = 4102\nexpect = "xact"\n')


def test_idle_since_before_the_statement_is_a_certain_session_lock() -> None:
    idle = session(10, "idle", -timedelta(minutes=7))
    (entry,) = Diagnosis(snapshot([idle], [advisory(10, 73)]), REGISTRY).advisory
    assert entry.lifetime == "session"
    assert entry.held_at_least == 7 * 60
    assert Flag.EXPECT_XACT in entry.flags


def test_idle_only_since_the_statement_started_proves_nothing() -> None:
    """It held a transaction lock when pg_locks was read and committed a moment later."""
    committed = session(10, "idle", timedelta(milliseconds=2))
    (entry,) = Diagnosis(snapshot([committed], [advisory(10, 73)]), REGISTRY).advisory
    assert entry.lifetime == "unknown"
    assert entry.held_at_least is None
    assert entry.flags == ()


def test_idle_in_transaction_since_the_statement_started_is_no_stuck_owner() -> None:
    busy = session(10, "idle in transaction", timedelta(milliseconds=1), in_transaction=True)
    waiter = session(11, "active", -timedelta(seconds=1))
    locks = [advisory(10, 73), advisory(11, 73, granted=False, blocked_by=(10,))]
    holder = Diagnosis(snapshot([busy, waiter], locks), REGISTRY).advisory[0]
    assert holder.blocks == (11,)
    assert holder.held_at_least is None and Flag.STUCK_OWNER not in holder.flags
    stuck = session(10, "idle in transaction", -timedelta(minutes=2), in_transaction=True)
    holder = Diagnosis(snapshot([stuck, waiter], locks), REGISTRY).advisory[0]
    assert holder.held_at_least == 120 and Flag.STUCK_OWNER in holder.flags


def test_a_blocker_with_no_lock_in_the_snapshot_gets_no_edge() -> None:
    """pg_blocking_pids() runs after pg_locks was copied: it may name a pid that took the
    lock, or queued for it, only since."""
    holder = session(10, "active", -timedelta(seconds=1))
    waiter = session(11, "active", -timedelta(seconds=1))
    newcomer = session(12, "active", timedelta(milliseconds=1))
    locks = [advisory(10, 73), advisory(11, 73, granted=False, blocked_by=(10, 12))]
    diagnosis = Diagnosis(snapshot([holder, waiter, newcomer], locks), REGISTRY)
    waiting = diagnosis.advisory[1]
    assert waiting.waits_for == (10,) and waiting.queued_behind == ()
    assert {(e.waiter, e.blocker) for e in diagnosis.graph.edges} == {(11, 10)}
