"""A client borrows the leaking pooled connection (a real PgBouncer, transaction pooling, a
pool of one): the leak stays a leak in every view, and terminate --yes refuses to end the
borrower's transaction.

The queue rule behind it (core.analysis.older_than_transaction), checked here on the real
server: a waiter that began waiting before the holder's current transaction started proves
the holder's lock older than that transaction; a holder queued ahead of the waiter and
granted after it began is in the transaction it waited in, and proves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.demo.cluster import Bouncer, Cluster, start_pgbouncer
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Registry
from lockdiag.registry.model import Poolers

from helpers.cli import run
from helpers.pooler import leak
from helpers.servers import Sessions

KEY = 737373


@pytest.fixture
def pool_of_one(cluster: Cluster) -> Iterator[Bouncer]:
    """Transaction pooling with one server connection: the next client gets the leaky one."""
    bouncer = start_pgbouncer(cluster, "transaction", {"default_pool_size": "1"})
    yield bouncer
    bouncer.stop()


def borrow(bouncer: Bouncer, backend: int) -> psycopg.Connection[Any]:
    """Client B, in a transaction on the same server connection (attached while it lasts)."""
    borrower = psycopg.connect(
        bouncer.dsn(application_name="borrower"), autocommit=False, prepare_threshold=None
    )
    assert borrower.execute("SELECT pg_backend_pid()").fetchone() == (backend,)
    return borrower


@pytest.fixture
def borrowed(
    cluster: Cluster, pool_of_one: Bouncer, sessions: Sessions
) -> Iterator[tuple[int, psycopg.Connection[Any], int]]:
    """The leaked lock, a waiter queued for it, then client B borrowing the connection."""
    backend = leak(pool_of_one, KEY)
    waiter = sessions.open("waiting-worker")
    waiter.start(f"SELECT pg_advisory_lock({KEY})")
    sessions.waiting(waiter)
    borrower = borrow(pool_of_one, backend)
    try:
        yield backend, borrower, waiter.pid
    finally:
        borrower.close()
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))


def test_a_borrowed_leak_is_still_a_leak_in_every_view(
    cluster: Cluster, pool_of_one: Bouncer, borrowed: tuple[int, psycopg.Connection[Any], int]
) -> None:
    backend, borrower, waiter = borrowed
    pooler = ("--dsn", cluster.dsn(), "--pgbouncer", pool_of_one.console_dsn())
    for moment in ("borrowed", "taken again by the borrower"):
        listed = run("list", *pooler, "--format", "json")
        (lock,) = [lock for lock in json.loads(listed.stdout)["locks"] if lock["pid"] == backend]
        assert lock["pool"]["client"] is not None, moment  # the POOL column sees the borrower
        assert lock["lifetime"] == "session", moment
        assert "outlived-client" in lock["flags"], moment

        checked = run("check", *pooler, "--format", "json")
        assert checked.exit_code == 2, checked.output
        first = json.loads(checked.stdout)["findings"][0]
        assert (first["kind"], first["severity"], first["pid"]) == (
            "outlived-client", "critical", backend
        ), moment  # fmt: skip
        text = " ".join(run("check", *pooler).stdout.split())
        assert "lent to client 127.0.0.1:" in text, text
        assert f"pid {waiter} has waited for it since before the current transaction" in text
        assert "proven" in text, text

        held = run("who-holds", "--key", str(KEY), *pooler)
        summary = " ".join(held.stdout.split())
        assert "the lock outlived the client that took it" in summary, summary
        assert "lifetime unknown" not in summary, summary
        # B takes the same key again: re-entrant, one row, the waiter still waits
        assert borrower.execute("SELECT pg_try_advisory_lock(%s)", (KEY,)).fetchone() == (True,)


def test_terminate_yes_refuses_to_end_the_borrowers_transaction(
    cluster: Cluster, pool_of_one: Bouncer, borrowed: tuple[int, psycopg.Connection[Any], int]
) -> None:
    backend, borrower, _ = borrowed
    args = ["terminate", str(backend), "--dsn", cluster.dsn(),
            "--pgbouncer", pool_of_one.console_dsn()]  # fmt: skip
    for extra in ((), ("--format", "json")):
        result = run(*args, "--yes", *extra)
        assert result.exit_code == 2, result.output
        refusal = " ".join(result.stderr.split())
        assert "is attached to it now" in refusal and "--end-attached-client" in refusal
        assert "nothing done" in refusal
    # the borrower's transaction goes on, on the same backend
    assert borrower.execute("SELECT pg_backend_pid()").fetchone() == (backend,)
    borrower.commit()


def test_terminate_ends_the_borrowers_work_when_told_to(
    cluster: Cluster, pool_of_one: Bouncer, borrowed: tuple[int, psycopg.Connection[Any], int]
) -> None:
    backend, borrower, _ = borrowed
    result = run("terminate", str(backend), "--dsn", cluster.dsn(), "--pgbouncer",
                      pool_of_one.console_dsn(), "--yes", "--end-attached-client")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"pid {backend} ended" in result.output
    with pytest.raises(psycopg.OperationalError):
        borrower.execute("SELECT 1")


def test_reads_over_time_remember_the_connection_seen_without_a_client(
    cluster: Cluster, pool_of_one: Bouncer
) -> None:
    """No waiter: one read of the borrowed connection proves nothing, but a session that read
    it earlier with no client attached remembers the leak while the backend holds the lock."""
    backend = leak(pool_of_one, KEY)
    poolers = Poolers((pool_of_one.console_dsn(),))
    registry = Registry()

    def flags(session: DiagnosticSession) -> list[tuple[str, ...]]:
        entries = Diagnosis(session.snapshot("advisory"), registry).entries
        return [tuple(map(str, e.flags)) for e in entries if e.lock.pid == backend]

    borrower = None
    try:
        with DiagnosticSession(cluster.dsn(), 5, registry, poolers) as over_time:
            assert "outlived-client" in flags(over_time)[0]  # no client attached
            borrower = borrow(pool_of_one, backend)
            assert "outlived-client" in flags(over_time)[0]  # remembered
            with DiagnosticSession(cluster.dsn(), 5, registry, poolers) as fresh:
                assert "outlived-client" not in flags(fresh)[0]  # one read alone cannot tell
            borrower.execute("SELECT pg_advisory_unlock(%s)", (KEY,))
            borrower.execute("SELECT pg_advisory_lock(%s)", (KEY + 1,))
            assert flags(over_time) == [("unregistered",)]  # B's own lock, B attached
    finally:
        if borrower is not None:
            borrower.close()
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))


def test_a_holder_granted_after_the_waiter_began_proves_nothing(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A holds, X and W wait, A ends: X is granted after W began waiting, inside the
    transaction X waited in (its xact_start is before W's wait start): nothing is proven.
    Once X commits and opens a new transaction, its lock is older than that one: session."""
    first = sessions.open("first")
    first.run(f"SELECT pg_advisory_lock({KEY})")
    ahead = sessions.open("ahead", autocommit=False)
    ahead.start(f"SELECT pg_advisory_lock({KEY})")
    sessions.waiting(ahead)
    behind = sessions.open("behind")
    behind.start(f"SELECT pg_advisory_lock({KEY})")
    sessions.waiting(behind)
    first.run(f"SELECT pg_advisory_unlock({KEY})")
    assert ahead.done()

    def lifetime() -> str:
        listed = run("list", "--dsn", cluster.dsn(), "--format", "json")
        (lock,) = [lock for lock in json.loads(listed.stdout)["locks"] if lock["pid"] == ahead.pid]
        return str(lock["lifetime"])

    assert lifetime() == "unknown"  # it may be a transaction-level lock of this transaction
    ahead.connection.commit()
    ahead.run("SELECT 1")  # a new transaction, the lock still held: it survived a commit
    assert lifetime() == "session"
    ahead.connection.rollback()
