"""An example job worker: rebuild each tenant's summary, one worker per tenant at a time.

    LOCKDIAG_REGISTRY=examples/lockdiag.toml python examples/worker.py "host=... dbname=..."

Each job is a short transaction: take the tenant's transaction-level lock with a try (a busy
tenant is skipped, never worked on anyway), do the work on the same connection in the same
transaction, record the outcome. The lock ends with the transaction, so nothing can leak
through a connection pool. The durable result (the summary row, its unique key) is what makes
the work happen once; the lock only keeps two workers off the same tenant at the same time.
"""

from __future__ import annotations

import sys

import psycopg

from lockdiag.worker import PrometheusEvents, report_to, work, xact_lock


def rebuild(conn: psycopg.Connection[object], tenant: int) -> str:
    with conn.transaction():
        if not xact_lock(conn, "tenant_summary", tenant):
            return "busy"  # another worker has this tenant: skip it, do not wait
        with work("tenant_summary"):
            conn.execute(
                "INSERT INTO tenant_summary (tenant, rebuilt) VALUES (%s, now()) "
                "ON CONFLICT (tenant) DO UPDATE SET rebuilt = excluded.rebuilt",
                (tenant,),
            )
        return "rebuilt"


def main(dsn: str, tenants: list[int]) -> None:
    report_to(PrometheusEvents())  # attempts, waits and outcomes, for prometheus_client
    with psycopg.connect(dsn, application_name="summary-worker") as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tenant_summary "
            "(tenant int PRIMARY KEY, rebuilt timestamptz)"
        )
        conn.commit()
        for tenant in tenants:
            print(f"tenant {tenant}: {rebuild(conn, tenant)}")


if __name__ == "__main__":
    main(sys.argv[1], [int(t) for t in sys.argv[2:]] or [73, 74, 75])
