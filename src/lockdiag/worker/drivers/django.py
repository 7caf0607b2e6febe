"""Django's connection: an ``atomic()`` block is a transaction (a nested one a savepoint);
outside one, Django's default autocommit runs each statement on its own."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from lockdiag.worker.errors import UnsupportedConnection
from lockdiag.worker.rules import State


class Django:
    driver, how_to_begin = "django", "use `with transaction.atomic():`"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        from django.db import Error

        self.conn = conn
        self.errors: tuple[type[BaseException], ...] = (Error,)
        if conn.vendor != "postgresql":
            raise UnsupportedConnection(f"Django database {conn.alias!r} is not PostgreSQL")

    def state(self) -> State:
        if self.conn.in_atomic_block:
            return State.OPEN
        return State.AUTOCOMMIT if self.conn.get_autocommit() else State.IDLE

    def run(self, statement: str) -> object:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    def savepoint(self) -> AbstractContextManager[object]:
        from django.db import transaction

        atomic: AbstractContextManager[object] = transaction.atomic(using=self.conn.alias)
        return atomic

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()
