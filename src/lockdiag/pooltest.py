"""`lockdiag pooltest`: can this pooled DSN be trusted with advisory locks?

Two workers take a reserved test key through the pooled DSN while a direct connection watches
pg_locks. Each scenario says what a safe setup gives and what was observed. Only the test keys
are ever locked, only on connections opened here, and every scenario ends by releasing what
it took (unlocking through the pool until the direct view shows the key free).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lockdiag.errors import InputError
from lockdiag.keys import LockTriple, from_pair

if TYPE_CHECKING:
    import psycopg

# "lkdg" in ASCII: a namespace nobody else is likely to use; resources 1 and 2
DEFAULT_KEY = from_pair(0x6C6B6467, 1)
APPLICATION_NAME = "lockdiag-pooltest"
Kind = Literal["session", "xact"]
ENDINGS = {
    "commit": "commits",
    "rollback": "rolls back",
    "exception": "raises an exception",
    "cancel": "is cancelled",
    "disconnect": "disconnects without unlocking",
}


@dataclass(frozen=True)
class Result:
    scenario: str
    safe: str  # what a safe setup gives
    observed: str
    ok: bool


class PoolTest:
    def __init__(self, pooled: str, direct: str, key: LockTriple, timeout: float) -> None:
        if key.form != "pair":
            raise InputError("the pooltest key must be an int4 pair, e.g. --key 1818977383,1")
        self.pooled, self.direct, self.timeout = pooled, direct, timeout
        self.key = key
        self.other = from_pair(key.pair[0], key.pair[1] + 1)
        self._open: list[psycopg.Connection[Any]] = []

    # -- connections -------------------------------------------------------------------------

    def connect(self, pooled: bool = True) -> psycopg.Connection[Any]:
        import psycopg
        from psycopg.conninfo import make_conninfo

        info = make_conninfo(
            self.pooled if pooled else self.direct,
            application_name=APPLICATION_NAME,
            connect_timeout=str(max(2, int(self.timeout))),
        )
        # prepare_threshold=None: no server-side prepared statements through a pooler
        connection = psycopg.connect(info, autocommit=True, prepare_threshold=None)
        self._open.append(connection)
        return connection

    def close(self, connection: psycopg.Connection[Any]) -> None:
        connection.close()
        with contextlib.suppress(ValueError):
            self._open.remove(connection)

    def holders(self, key: LockTriple | None = None) -> int:
        """Backends holding the key, seen directly in pg_locks (not through the pool)."""
        key = key or self.key
        with self.connect(pooled=False) as direct:
            row = direct.execute(
                "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' "
                "AND granted AND classid = %s AND objid = %s AND objsubid = %s "
                "AND database = (SELECT oid FROM pg_catalog.pg_database "
                "WHERE datname = pg_catalog.current_database())",
                (key.classid, key.objid, key.objsubid),
            ).fetchone()
        return int(row[0]) if row else 0

    def try_lock(self, connection: psycopg.Connection[Any], key: LockTriple | None = None) -> bool:
        a, b = (key or self.key).pair
        row = connection.execute(
            "SELECT pg_catalog.pg_try_advisory_lock(%s, %s)", (a, b)
        ).fetchone()
        return bool(row and row[0])

    def release(self, key: LockTriple | None = None) -> int:
        """Unlock the test key through the pool until the server shows it free; returns how
        many holders remain (0 when clean). Each unlock only undoes one of our own takes."""
        key = key or self.key
        a, b = key.pair
        for _ in range(100):
            if self.holders(key) == 0:
                return 0
            connection = self.connect()
            try:
                connection.execute("SELECT pg_catalog.pg_advisory_unlock(%s, %s)", (a, b))
            finally:
                self.close(connection)
        return self.holders(key)

    def cleanup(self) -> int:
        for connection in list(self._open):
            with contextlib.suppress(Exception):
                self.close(connection)
        return self.release(self.key) + self.release(self.other)

    # -- scenarios ---------------------------------------------------------------------------

    def contention(self) -> Result:
        """A holds a session lock and stays connected; B tries the same key."""
        a = self.connect()
        took = self.try_lock(a)
        b = self.connect()
        b_got = self.try_lock(b)
        self.close(b)
        self.close(a)
        self.release()
        return Result(
            "session lock, A connected: B tries the same key",
            "B gets false (contention seen)",
            f"A got {str(took).lower()}, B got {str(b_got).lower()}"
            + (" (re-entered A's server connection)" if b_got else ""),
            took and not b_got,
        )

    def ending(self, kind: Kind, how: str) -> Result:
        """A takes the key inside a transaction, ends it ``how``; B tries while A's client is
        still connected; then A's client leaves and a new client C tries."""
        import psycopg

        a = self.connect()
        a_pairs = self.key.pair
        function = "pg_advisory_lock" if kind == "session" else "pg_advisory_xact_lock"
        with contextlib.suppress(psycopg.Error):
            if how != "disconnect" or kind == "xact":
                a.execute("BEGIN")  # a session lock before a disconnect: taken outside one
            a.execute(f"SELECT pg_catalog.{function}(%s, %s)", a_pairs)
            if how == "commit":
                a.execute("COMMIT")
            elif how == "rollback":
                a.execute("ROLLBACK")
            elif how == "exception":
                with contextlib.suppress(psycopg.Error):
                    a.execute("SELECT 1 / 0")  # the application's error
                a.execute("ROLLBACK")
            elif how == "cancel":
                _cancel_soon(a, 0.3)
                with contextlib.suppress(psycopg.Error):
                    a.execute("SELECT pg_catalog.pg_sleep(30)")
                a.execute("ROLLBACK")
        if how == "disconnect":
            self.close(a)
        held_after_end = self.holders()
        b = self.connect()
        b_got = self.try_lock(b)
        if b_got:
            b.execute("SELECT pg_catalog.pg_advisory_unlock(%s, %s)", a_pairs)
        self.close(b)
        if how != "disconnect":
            self.close(a)
        held_after_gone = self.holders()
        c = self.connect()
        c_got = self.try_lock(c)
        false_success = c_got and held_after_gone > 0
        if c_got:
            c.execute("SELECT pg_catalog.pg_advisory_unlock(%s, %s)", a_pairs)
        self.close(c)
        self.release()

        client_still_there = how != "disconnect"
        if kind == "session" and client_still_there:
            safe = "B gets false (A's session still owns it); freed once A's client leaves"
            ok = not b_got and held_after_gone == 0 and not false_success
        else:
            safe = "B gets true (released); nothing held once A's client leaves"
            ok = b_got and held_after_gone == 0 and not false_success
        observed = (
            f"held after A's {how}: {held_after_end}; B got {str(b_got).lower()}; "
            f"held after A left: {held_after_gone}"
            + (
                "; new client C got a false success (re-entered the leaked lock)"
                if false_success
                else ""
            )
        )
        return Result(f"{kind} lock, A {ENDINGS[how]}", safe, observed, ok)

    def independent_keys(self) -> Result:
        """Two different keys, both in transactions at once, must both be granted."""
        a, b = self.connect(), self.connect()
        a.execute("BEGIN")
        b.execute("BEGIN")
        a_row = a.execute(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(%s, %s)", self.key.pair
        ).fetchone()
        b_row = b.execute(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(%s, %s)", self.other.pair
        ).fetchone()
        a.execute("COMMIT")
        b.execute("COMMIT")
        self.close(a)
        self.close(b)
        both = bool(a_row and a_row[0] and b_row and b_row[0])
        return Result(
            "two different keys at once (transaction locks)",
            "both granted",
            "both granted" if both else f"A {a_row}, B {b_row}",
            both,
        )

    def scenarios(self) -> Iterator[Callable[[], Result]]:
        yield self.contention
        for kind in ("session", "xact"):
            for how in ENDINGS:
                yield lambda kind=kind, how=how: self.ending(kind, how)  # type: ignore[misc]
        yield self.independent_keys


def _cancel_soon(connection: psycopg.Connection[Any], delay: float) -> None:
    timer = threading.Timer(delay, connection.cancel_safe)
    timer.daemon = True
    timer.start()


ADVICE = [
    "Use transaction-level locks (pg_advisory_xact_lock, pg_try_advisory_xact_lock) behind a "
    "transaction pooler: they end with the transaction that took them.",
    "Or route lock-taking workers through session pooling (pool_mode = session), where "
    "DISCARD ALL releases session locks when the client leaves.",
    "Or set server_reset_query_always = 1 in transaction pooling: session locks are then "
    "released at every transaction end (so they no longer protect anything beyond one).",
]


def run(
    pooled: str, direct: str, key: LockTriple = DEFAULT_KEY, timeout: float = 5.0
) -> tuple[list[Result], int]:
    """Every scenario; returns the results and how many test-key holders could not be
    released (0 when nothing is left behind)."""
    test = PoolTest(pooled, direct, key, timeout)
    results: list[Result] = []
    try:
        if test.holders() or test.holders(test.other):
            raise InputError(
                f"the test key {key.describe()} is already held on the server: pick another "
                "with --key"
            )
        for scenario in test.scenarios():
            results.append(scenario())
    finally:
        left = test.cleanup()
    return results, left
