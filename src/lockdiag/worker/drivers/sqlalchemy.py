"""SQLAlchemy 2, blocking and asyncio: a ``Connection`` or an ORM ``Session`` (``target``),
where autobegin is the IDLE state and ``begin_nested()`` a savepoint."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from lockdiag.worker.errors import UnsupportedConnection
from lockdiag.worker.rules import State

_QUEUE_POOL = (
    " (if the connection went back to SQLAlchemy's pool inside the block, the lock is still "
    "held there: QueuePool only rolls back on return; release before returning it)"
)


def _errors() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    return (SQLAlchemyError,)


def _state(sync_connection: Any, in_transaction: bool) -> State:
    """SQLAlchemy's AUTOCOMMIT isolation sets the DBAPI connection's autocommit: then even
    ``conn.begin()`` opens no transaction on the server."""
    if getattr(sync_connection.connection.dbapi_connection, "autocommit", False):
        return State.AUTOCOMMIT
    return State.OPEN if in_transaction else State.IDLE


def _postgresql(dialect: Any) -> None:
    if dialect.name != "postgresql":
        raise UnsupportedConnection(
            f"this SQLAlchemy connection is on {dialect.name}: advisory locks need PostgreSQL"
        )


class SQLAlchemy:
    driver, how_to_begin = "sqlalchemy", "use `with conn.begin():` (or session.begin())"
    if_unlock_failed = _QUEUE_POOL

    def __init__(self, target: Any, session: bool) -> None:
        from sqlalchemy import text

        self.target, self.session, self.text = target, session, text
        self.errors = _errors()
        _postgresql((target.get_bind() if session else target).dialect)

    def state(self) -> State:
        began = self.target.in_transaction()
        # a Session's connection (autobegins the Session's transaction: no SQL is sent)
        sync = self.target.connection() if self.session else self.target
        return _state(sync, began)

    def run(self, statement: str) -> object:
        return self.target.execute(self.text(statement)).scalar()

    def savepoint(self) -> AbstractContextManager[object]:
        return self.target.begin_nested()  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.target.commit()

    def rollback(self) -> None:
        self.target.rollback()


class AsyncSQLAlchemy:
    """A SQLAlchemy AsyncConnection or AsyncSession."""

    driver = "sqlalchemy"
    how_to_begin = "use `async with conn.begin():` (or session.begin())"
    if_unlock_failed = _QUEUE_POOL

    def __init__(self, target: Any, session: bool) -> None:
        from sqlalchemy import text

        self.target, self.session, self.text = target, session, text
        self.errors = _errors()
        _postgresql((target.sync_session.get_bind() if session else target.sync_engine).dialect)

    async def state(self) -> State:
        began = self.target.in_transaction()
        connection = await self.target.connection() if self.session else self.target
        return _state(connection.sync_connection, began)

    async def run(self, statement: str) -> object:
        """SQLAlchemy invalidates a connection whose statement is interrupted by a
        cancellation (the whole transaction then needs a rollback): the statement runs in a
        task of its own, and a cancellation of the caller cancels it on the server instead
        (pg_cancel_backend from another connection of the engine); it then ends with the
        server's QueryCanceled, the connection intact, and the CancelledError goes on."""
        connection = await self.target.connection() if self.session else self.target
        running = asyncio.ensure_future(connection.execute(self.text(statement)))
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            if not running.done():
                await self._cancel_on_server(connection)
                await asyncio.wait([running])
                if not running.cancelled():
                    running.exception()  # the server's QueryCanceled, retrieved: expected
            raise
        return result.scalar()

    async def _cancel_on_server(self, connection: Any) -> None:
        raw = (await connection.get_raw_connection()).driver_connection
        pid = raw.get_server_pid() if hasattr(raw, "get_server_pid") else raw.info.backend_pid
        async with connection.engine.connect() as other:
            await other.execute(self.text(f"SELECT pg_catalog.pg_cancel_backend({int(pid)})"))

    def savepoint(self) -> AbstractAsyncContextManager[object]:
        return self.target.begin_nested()  # type: ignore[no-any-return]

    async def commit(self) -> None:
        await self.target.commit()

    async def rollback(self) -> None:
        await self.target.rollback()
