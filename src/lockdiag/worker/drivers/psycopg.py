"""psycopg 3, blocking and asyncio: ``conn.transaction()`` is a transaction, or a savepoint
inside one."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from lockdiag.worker.rules import State


def _state(conn: Any) -> State:
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status == TransactionStatus.IDLE:
        return State.AUTOCOMMIT if conn.autocommit else State.IDLE
    return State.OPEN


def _errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)


class Psycopg:
    driver, how_to_begin, if_unlock_failed = "psycopg", "use `with conn.transaction():`", ""

    def __init__(self, conn: Any) -> None:
        self.conn, self.errors = conn, _errors()

    def state(self) -> State:
        return _state(self.conn)

    def run(self, statement: str) -> object:
        row = self.conn.execute(statement.encode()).fetchone()
        return row[0] if row else None

    def savepoint(self) -> AbstractContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        if not self.conn.broken:
            self.conn.rollback()


class AsyncPsycopg:
    driver, how_to_begin = "psycopg", "use `async with conn.transaction():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        self.conn, self.errors = conn, _errors()

    async def state(self) -> State:
        return _state(self.conn)

    async def run(self, statement: str) -> object:
        row = await (await self.conn.execute(statement.encode())).fetchone()
        return row[0] if row else None

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        if not self.conn.broken:
            await self.conn.rollback()
