"""An asyncpg worker: tenants rebuilt concurrently from a pool, one worker per tenant.

    LOCKDIAG_REGISTRY=examples/lockdiag.toml \
        python examples/asyncpg_worker.py postgresql://user@host/db 73 74

Each job acquires a connection from the pool and runs one transaction
(``conn.transaction()``): the tenant's transaction-level lock is tried first and ends with
the commit. Two jobs on the same tenant run at once here: one rebuilds, the other is told the
tenant is busy. A session lock on a pool's connection cannot outlive ``pool.acquire()``:
asyncpg runs ``pg_advisory_unlock_all()`` when the connection is released.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from lockdiag.worker import asession_lock, axact_lock, work


async def rebuild(pool: asyncpg.Pool, tenant: int, started: asyncio.Event) -> str:
    async with pool.acquire() as conn, conn.transaction():
        if not await axact_lock(conn, "tenant_summary", tenant):
            return "busy"
        started.set()
        with work("tenant_summary"):
            await conn.execute(
                "INSERT INTO tenant_summary (tenant, rebuilt) VALUES ($1, now()) "
                "ON CONFLICT (tenant) DO UPDATE SET rebuilt = excluded.rebuilt",
                tenant,
            )
            await asyncio.sleep(0.2)  # the work takes a while: the twin job finds it busy
        return "rebuilt"


async def twin(pool: asyncpg.Pool, tenant: int, started: asyncio.Event) -> str:
    await started.wait()
    return await rebuild(pool, tenant, asyncio.Event())


async def main(url: str, tenants: list[int]) -> None:
    async with asyncpg.create_pool(url, min_size=2, max_size=4) as pool:
        await pool.execute(
            "CREATE TABLE IF NOT EXISTS tenant_summary "
            "(tenant int PRIMARY KEY, rebuilt timestamptz)"
        )
        for tenant in tenants:
            started = asyncio.Event()
            first, second = await asyncio.gather(
                rebuild(pool, tenant, started), twin(pool, tenant, started)
            )
            print(f"tenant {tenant}: {first}, twin: {second}")
        async with pool.acquire() as conn, asession_lock(conn, "invoice_export", 1) as taken:
            print(f"invoices 1: {'exported' if taken else 'busy'}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], [int(t) for t in sys.argv[2:]] or [73, 74]))
