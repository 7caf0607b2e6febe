"""One adapter per driver family, and which one takes a given connection.

An adapter says where the connection is (:class:`~lockdiag.worker.rules.State`), runs one
statement, makes a savepoint, and commits or rolls back a transaction the helper itself began;
the rules decide what to do with that. Each family's module imports its driver only when an
adapter is made: none is imported with this package.

It may import ``lockdiag.worker.rules`` and ``lockdiag.worker.errors``; each driver
module only its own driver family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from lockdiag.worker.drivers.asyncpg import Asyncpg
from lockdiag.worker.drivers.django import Django
from lockdiag.worker.drivers.psycopg import AsyncPsycopg, Psycopg
from lockdiag.worker.drivers.psycopg2 import Psycopg2
from lockdiag.worker.drivers.sqlalchemy import AsyncSQLAlchemy, SQLAlchemy
from lockdiag.worker.errors import UnsupportedConnection
from lockdiag.worker.rules import Facts, State


class Adapter(Facts, Protocol):
    def state(self) -> State: ...
    def run(self, statement: str) -> object: ...  # first column of the first row
    def savepoint(self) -> AbstractContextManager[object]: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...


class AsyncAdapter(Facts, Protocol):
    async def state(self) -> State: ...
    async def run(self, statement: str) -> object: ...
    def savepoint(self) -> AbstractAsyncContextManager[object]: ...
    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...


# (top-level module, class name) of the objects each adapter takes; the object's class and its
# bases are looked at, so a subclass (asyncpg's connection_class, say) is recognised too.
_SYNC: dict[tuple[str, str], Callable[[Any], Adapter]] = {
    ("psycopg", "Connection"): Psycopg,
    ("psycopg2", "connection"): Psycopg2,
    ("sqlalchemy", "Connection"): lambda conn: SQLAlchemy(conn, session=False),
    ("sqlalchemy", "Session"): lambda conn: SQLAlchemy(conn, session=True),
    ("django", "ConnectionProxy"): Django,
    ("django", "BaseDatabaseWrapper"): Django,
}
_ASYNC: dict[tuple[str, str], Callable[[Any], AsyncAdapter]] = {
    ("psycopg", "AsyncConnection"): AsyncPsycopg,
    ("sqlalchemy", "AsyncConnection"): lambda conn: AsyncSQLAlchemy(conn, session=False),
    ("sqlalchemy", "AsyncSession"): lambda conn: AsyncSQLAlchemy(conn, session=True),
    ("asyncpg", "Connection"): Asyncpg,
    ("asyncpg", "PoolConnectionProxy"): Asyncpg,
}


def _kinds(conn: object) -> Iterator[tuple[str, str]]:
    for cls in type(conn).__mro__:
        yield cls.__module__.split(".")[0], cls.__name__


def _unknown(conn: object, api: str) -> UnsupportedConnection:
    name = f"{type(conn).__module__}.{type(conn).__name__}"
    return UnsupportedConnection(f"{api}: {name} is not a connection lockdiag knows")


def adapter(conn: object, api: str) -> Adapter:
    """The adapter of a blocking connection; an asyncio one is pointed to API's async twin."""
    for kind in _kinds(conn):
        if kind in _SYNC:
            return _SYNC[kind](conn)
        if kind in _ASYNC:
            raise UnsupportedConnection(f"{api} got an asyncio connection: use a{api}")
    raise _unknown(conn, api)


def async_adapter(conn: object, api: str) -> AsyncAdapter:
    """The adapter of an asyncio connection; a blocking one is pointed to API's sync twin."""
    for kind in _kinds(conn):
        if kind in _ASYNC:
            return _ASYNC[kind](conn)
        if kind in _SYNC:
            raise UnsupportedConnection(f"{api} got a blocking connection: use {api[1:]}")
    raise _unknown(conn, api)
