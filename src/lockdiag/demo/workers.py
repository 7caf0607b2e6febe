"""The demo's workers: real sessions that hold and wait on locks until they are told to stop.

Run as ``python -m lockdiag.demo.workers DSN``. Prints ``ready`` once every lock situation is in
place, then keeps them until SIGTERM or SIGINT, and closes its connections on the way out.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import zlib
from typing import Any

import psycopg

RAILS_SALT = 2053462845  # Rails' MIGRATOR_SALT: the key is this times crc32(database name)


def connect(dsn: str, name: str, autocommit: bool = True) -> psycopg.Connection[Any]:
    return psycopg.connect(f"{dsn} application_name={name}", autocommit=autocommit)


def wait_in_background(dsn: str, name: str, sql: str, keep: list[Any]) -> int:
    """A session that blocks on ``sql`` in a thread; returns its pid."""
    connection = connect(dsn, name)
    keep.append(connection)
    threading.Thread(target=lambda: _quietly(connection, sql), daemon=True).start()
    return connection.info.backend_pid


def _quietly(connection: psycopg.Connection[Any], sql: str) -> None:
    with contextlib.suppress(psycopg.Error):  # ended by the demo's cleanup
        connection.execute(sql.encode())


def wait_until_waiting(dsn: str, pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND pid = ANY(%s)",
                (pids,),
            ).fetchone()
            if row and row[0] == len(pids):
                return
            time.sleep(0.05)
    raise SystemExit("demo workers: the waiters did not start waiting")


def main(dsn: str) -> None:
    keep: list[Any] = []
    # a leader elected for days: an expected session lock, never an alert
    scheduler = connect(dsn, "scheduler")
    scheduler.execute("SELECT pg_advisory_lock(1, 1)")
    # a worker that finished its export and went idle, keeping its session locks
    billing = connect(dsn, "billing-worker")
    billing.execute("SELECT pg_advisory_lock(4102, 73)")
    billing.execute("SELECT pg_advisory_lock((7::bigint << 32) | 2041)")
    # a lock of an unregistered namespace
    etl = connect(dsn, "etl-nightly")
    etl.execute("SELECT pg_advisory_lock(-5, 7)")
    # a Rails migration that never finished
    rails = connect(dsn, "rails-migrate")
    database = rails.info.dbname
    rails.execute("SELECT pg_try_advisory_lock(%s)", (RAILS_SALT * zlib.crc32(database.encode()),))
    # a tenant-summary worker holding its transaction lock, idle in transaction: a stuck owner
    stuck = connect(dsn, "summary-worker", autocommit=False)
    stuck.execute("SELECT pg_advisory_xact_lock(4102, 74)")
    # a tenant-summary worker busy in its transaction
    busy = connect(dsn, "report-api", autocommit=False)
    busy.execute("SELECT pg_advisory_xact_lock(4102, 80)")
    keep += [scheduler, billing, etl, rails, stuck, busy]
    busy_thread = threading.Thread(
        target=lambda: _quietly(busy, "SELECT pg_sleep(86400)"), daemon=True
    )
    busy_thread.start()
    waiters = [
        wait_in_background(dsn, "summary-worker", "SELECT pg_advisory_xact_lock(4102, 74)", keep),
        wait_in_background(dsn, "summary-worker", "SELECT pg_advisory_xact_lock(4102, 74)", keep),
        wait_in_background(dsn, "summary-worker", "SELECT pg_advisory_xact_lock(4102, 73)", keep),
    ]
    wait_until_waiting(dsn, waiters)
    print("ready", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for connection in keep:
        with contextlib.suppress(Exception):  # best effort on the way out
            connection.cancel_safe(timeout=2)
    for connection in keep:
        connection.close()


if __name__ == "__main__":
    main(sys.argv[1])
