"""A Celery-style task on SQLAlchemy: rebuild one tenant's summary, one worker per tenant.

    LOCKDIAG_REGISTRY=examples/lockdiag.toml \
        python examples/celery_sqlalchemy.py postgresql+psycopg://user@host/db 73 74

``rebuild_summary`` is written as a Celery task body would be (decorate it with
``@app.task`` in a real project); here it is called like one, once per tenant. Each call is one
short transaction (``session.begin()``): the tenant's transaction-level lock is tried first,
a busy tenant is skipped, and the lock ends with the commit, so it cannot leak into the
engine's pool. ``export_invoices`` shows a session lock on a pooled Connection: released by
the ``with`` block before the Connection goes back to the pool (QueuePool only rolls back on
return, it would not unlock).
"""

from __future__ import annotations

import sys

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from lockdiag.worker import PrometheusEvents, report_to, session_lock, work, xact_lock

engine: Engine | None = None  # set once per worker process, as a Celery worker would


def rebuild_summary(tenant: int) -> str:
    """The task: one transaction, the lock tried first."""
    assert engine is not None
    with Session(engine) as session, session.begin():
        if not xact_lock(session, "tenant_summary", tenant):
            return "busy"  # another worker has this tenant: skip it (or retry the task later)
        with work("tenant_summary"):
            session.execute(
                text(
                    "INSERT INTO tenant_summary (tenant, rebuilt) VALUES (:tenant, now()) "
                    "ON CONFLICT (tenant) DO UPDATE SET rebuilt = excluded.rebuilt"
                ),
                {"tenant": tenant},
            )
        return "rebuilt"


def export_invoices(batch: int) -> str:
    """A longer job that commits as it goes: a session lock, unlocked before the connection
    returns to the pool (the inner block ends first)."""
    assert engine is not None
    with engine.connect() as conn:
        with session_lock(conn, "invoice_export", batch) as taken:
            if not taken:
                return "busy"
            for step in range(3):  # each step its own transaction; the lock spans them
                conn.execute(text("SELECT :step"), {"step": step})
                conn.commit()
        return "exported"


def main(url: str, tenants: list[int]) -> None:
    global engine  # noqa: PLW0603 - the worker process's engine
    engine = create_engine(url)
    report_to(PrometheusEvents())
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS tenant_summary "
                "(tenant int PRIMARY KEY, rebuilt timestamptz)"
            )
        )
    for tenant in tenants:
        print(f"tenant {tenant}: {rebuild_summary(tenant)}")
    print(f"invoices 1: {export_invoices(1)}")
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], [int(t) for t in sys.argv[2:]] or [73, 74])
