"""asyncpg runs each statement on its own unless inside ``conn.transaction()``; a nested
``transaction()`` is a savepoint. A pool's connection runs pg_advisory_unlock_all() when
released (Connection.get_reset_query), so no session lock outlives ``pool.acquire()``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from lockdiag.worker.rules import State


class Asyncpg:
    driver, how_to_begin = "asyncpg", "use `async with conn.transaction():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        import asyncpg

        self.conn = conn
        self.errors: tuple[type[BaseException], ...] = (
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
        )

    async def state(self) -> State:
        return State.OPEN if self.conn.is_in_transaction() else State.AUTOCOMMIT

    async def run(self, statement: str) -> object:
        return await self.conn.fetchval(statement)

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    async def commit(self) -> None:  # never IDLE: there is no transaction of the helper's
        raise AssertionError("asyncpg has no implicit transaction")

    async def rollback(self) -> None:
        raise AssertionError("asyncpg has no implicit transaction")
