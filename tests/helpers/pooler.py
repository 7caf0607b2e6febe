"""A real PgBouncer as the tests use it (the ``transaction_pool`` fixture starts one): a worker
that leaves a session lock on a pooled server connection."""

from __future__ import annotations

import psycopg

from lockdiag.demo.cluster import Bouncer


def leak(bouncer: Bouncer, key: int) -> int:
    """A worker ("leaky-worker") takes session lock ``key`` through the pool and leaves without
    unlocking; the pid of the server connection that keeps the lock."""
    with psycopg.connect(
        bouncer.dsn(application_name="leaky-worker"), autocommit=True, prepare_threshold=None
    ) as worker:
        row = worker.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (key,)).fetchone()
        assert row is not None and row[0] is True
        return int(row[1])
