"""psycopg2 begins a transaction before the first statement unless in autocommit mode; it has
no savepoint helper, so the adapter names its own."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lockdiag.worker.rules import State

_savepoints = itertools.count(1)


class Psycopg2:
    driver, how_to_begin = "psycopg2", "set conn.autocommit = False (or run BEGIN) first"
    if_unlock_failed = ""

    def __init__(self, conn: Any) -> None:
        import psycopg2

        self.conn = conn
        self.errors: tuple[type[BaseException], ...] = (psycopg2.Error,)

    def state(self) -> State:
        from psycopg2.extensions import TRANSACTION_STATUS_IDLE

        if self.conn.get_transaction_status() == TRANSACTION_STATUS_IDLE:
            return State.AUTOCOMMIT if self.conn.autocommit else State.IDLE
        return State.OPEN

    def run(self, statement: str) -> object:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    @contextmanager
    def savepoint(self) -> Iterator[object]:
        name = f"lockdiag_{next(_savepoints)}"
        self.run(f"SAVEPOINT {name}")
        try:
            yield None
        except BaseException:
            if not self.conn.closed and self.state() is State.OPEN:
                self.run(f"ROLLBACK TO SAVEPOINT {name}")
                self.run(f"RELEASE SAVEPOINT {name}")
            raise
        if self.state() is State.OPEN:  # the block may have ended the transaction
            self.run(f"RELEASE SAVEPOINT {name}")

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
