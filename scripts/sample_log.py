"""Write examples/postgresql.log: a real PostgreSQL server's log of an incident on the keys of
examples/lockdiag.toml, read by the log guide's transcript (docs/guides/log.md).

    python scripts/sample_log.py        # starts a throwaway server, about 5 seconds

The server runs with log_lock_waits = on, deadlock_timeout = 100ms and the guide's
log_line_prefix. The story: two summary workers queue behind billing-worker on
tenant_summary 73; billing-worker waits for export-worker's invoice_export 2041; a book-closing
job waits on tenant_period 73 2026-11; two summary workers deadlock on tenant_summary 74 and 75;
a second scheduler gives up on leader 1 after its lock_timeout.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from lockdiag.demo.cluster import Cluster, create_cluster

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "examples" / "postgresql.log"
PREFIX = "%m [%p] %q%u@%d/%a "
INVOICE_2041 = 7 << 32 | 2041  # invoice_export 2041: bigint form
PERIOD = "4103, 1487755217"  # tenant_period 73 2026-11 (lockdiag key tenant_period 73 2026-11)


def logged(cluster: Cluster, text: str, timeout: float = 10.0) -> None:
    """Wait until the server's log says ``text``."""
    log = cluster.data / "log" / "postgresql.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.02)
    raise SystemExit(f"the server did not log {text!r} within {timeout}s")


def background(connection: psycopg.Connection[Any], sql: str) -> threading.Thread:
    """Run ``sql`` in a thread; an error (the deadlock's victim, a lock timeout) is expected."""

    def run() -> None:
        with contextlib.suppress(psycopg.Error):
            connection.execute(sql.encode())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def story(cluster: Cluster) -> None:
    def connect(name: str) -> psycopg.Connection[Any]:
        return psycopg.connect(cluster.dsn(dbname="shop", application_name=name), autocommit=True)

    billing, summary_a, summary_b, export, closing, leader_a, leader_b = map(connect, (
        "billing-worker", "summary-worker", "summary-worker", "export-worker", "books-close",
        "scheduler", "scheduler",
    ))  # fmt: skip

    def pid(connection: psycopg.Connection[Any]) -> int:
        return connection.info.backend_pid

    database = leader_a.execute(
        "SELECT oid FROM pg_database WHERE datname = current_database()"
    ).fetchone()[0]  # type: ignore[index]
    leader_a.execute("SELECT pg_advisory_lock(1, 1)")  # leader 1: held for days by design

    billing.execute("BEGIN")
    billing.execute("SELECT pg_advisory_xact_lock(4102, 73)")
    waits = [background(c, "SELECT pg_advisory_xact_lock(4102, 73)") for c in (summary_a,)]
    logged(cluster, f"process {pid(summary_a)} still waiting")
    waits.append(background(summary_b, "SELECT pg_advisory_xact_lock(4102, 73)"))
    logged(cluster, f"process {pid(summary_b)} still waiting")
    time.sleep(0.3)
    billing.execute("COMMIT")
    for thread in waits:
        thread.join(10)

    export.execute(f"SELECT pg_advisory_lock({INVOICE_2041})")
    waiting = background(billing, f"SELECT pg_advisory_xact_lock({INVOICE_2041})")
    logged(cluster, f"process {pid(billing)} still waiting")
    time.sleep(0.2)
    export.execute(f"SELECT pg_advisory_unlock({INVOICE_2041})")
    waiting.join(10)

    export.execute("BEGIN")
    export.execute(f"SELECT pg_advisory_xact_lock({PERIOD})")
    waiting = background(closing, f"SELECT pg_advisory_xact_lock({PERIOD})")
    logged(cluster, f"process {pid(closing)} still waiting")
    time.sleep(0.1)
    export.execute("COMMIT")
    waiting.join(10)

    summary_a.execute("BEGIN")
    summary_b.execute("BEGIN")
    summary_a.execute("SELECT pg_advisory_xact_lock(4102, 74)")
    summary_b.execute("SELECT pg_advisory_xact_lock(4102, 75)")
    first = background(summary_a, "SELECT pg_advisory_xact_lock(4102, 75)")
    logged(
        cluster,
        f"process {pid(summary_a)} still waiting for ExclusiveLock on advisory lock "
        f"[{database},4102,75,2]",
    )
    second = background(summary_b, "SELECT pg_advisory_xact_lock(4102, 74)")
    first.join(10)
    second.join(10)
    summary_a.execute("ROLLBACK")
    summary_b.execute("ROLLBACK")

    leader_b.execute("SET lock_timeout = '400ms'")
    background(leader_b, "SELECT pg_advisory_lock(1, 1)").join(10)
    for connection in (billing, summary_a, summary_b, export, closing, leader_a, leader_b):
        connection.close()
    time.sleep(0.5)  # the backends end before the server is stopped: no FATAL for them


def main() -> None:
    cluster = create_cluster(start=False)
    cluster.settings.update({
        "log_lock_waits": "on", "deadlock_timeout": "100ms", "lc_messages": "C",
        "logging_collector": "on", "log_destination": "stderr", "log_directory": "log",
        "log_filename": "postgresql.log", "log_line_prefix": PREFIX,
    })  # fmt: skip
    try:
        cluster.start()
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE shop")
        story(cluster)
        cluster.stop()  # the collector flushes the file
        shutil.copy(cluster.data / "log" / "postgresql.log", TARGET)
    finally:
        cluster.destroy()
    print(f"wrote {TARGET.relative_to(ROOT)} ({TARGET.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
