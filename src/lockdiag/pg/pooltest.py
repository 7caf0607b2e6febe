"""`lockdiag pooltest`: run the two-worker lock scenarios through a real pool, record what
happened.

Two workers take a reserved test key through the pooled DSN while one long-lived direct
session watches pg_locks (a diagnostic session the caller opened, and what analyses its
snapshots: :class:`lockdiag.evidence.Reader`'s). Each scenario is a script: A takes the key,
ends in one of the ways a worker ends (the ENDING table, one small function each), then B and
a new client C try the key. What happened is recorded as an Observation and judged by
:func:`lockdiag.core.pooltest.verdict`. Only the test keys are ever locked, only on
connections opened here, and every scenario ends by releasing what it took (unlocking through
the pool until the direct view shows the key free).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lockdiag.core.analysis import Decoded
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings.words import by_backend, listed, locks_in
from lockdiag.core.model import Snapshot
from lockdiag.core.pooltest import (
    ENDINGS,
    LockKind,
    Observation,
    Result,
    contention_verdict,
    independent_verdict,
    verdict,
)
from lockdiag.errors import InputError
from lockdiag.keys import LockTriple, from_pair
from lockdiag.pg import deadline, queries
from lockdiag.pg.connection import one_line
from lockdiag.pg.pgbouncer import read_console
from lockdiag.pg.raw_text import UTF8, Texts, codec
from lockdiag.pg.session import DiagnosticSession, server_error
from lockdiag.pg.timeout import Timeout


def _who_holds_args(decoded: Decoded) -> str:
    if decoded.namespace is not None:
        return f"{decoded.namespace.name} {decoded.resource}"
    triple = decoded.triple
    return f"--key {triple.classid},{triple.objid},{triple.objsubid}"


# "lkdg" in ASCII: a namespace nobody else is likely to use; resources 1 and 2
DEFAULT_KEY = from_pair(0x6C6B6467, 1)
APPLICATION_NAME = "lockdiag-pooltest"
EVIDENCE_SHOWN = 20  # lines of the locks at risk shown at most, then how many more
Connection = psycopg.Connection[Any]
Diagnose = Callable[[Snapshot], Diagnosis]  # the analysis of a snapshot of the direct session


# the rows of pooltest's queries (tests/test_query_rows.py checks each query's columns against
# these names)
class Holders(NamedTuple):
    """pooltest_holders.sql: backends holding the test key."""

    holders: int


class Answer(NamedTuple):
    """pooltest_lock.sql: what the lock or unlock function answered (NULL for one that waits)."""

    answer: bool | None


class PoolSide(NamedTuple):
    """pooltest_probe.sql: where a pooled client lands, as the server sees it: the pooler's
    address, the database's and role's names as their bytes, the database's encoding."""

    address: str | None
    database: str
    role: str
    encoding: str


def _commit(a: Connection) -> None:
    a.execute("COMMIT")


def _rollback(a: Connection) -> None:
    a.execute("ROLLBACK")


def _exception(a: Connection) -> None:
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        a.execute("SELECT 1 / 0")  # the application's error
    a.execute("ROLLBACK")


def _cancel(a: Connection) -> None:
    timer = threading.Timer(0.3, a.cancel_safe)
    timer.daemon = True
    timer.start()
    with contextlib.suppress(psycopg.errors.QueryCanceled):
        a.execute("SELECT pg_catalog.pg_sleep(30)")
    a.execute("ROLLBACK")


def _disconnect(a: Connection) -> None:
    a.close()


# how worker A ends once it holds the key, one function per way (keys: core.pooltest.ENDINGS)
ENDING: dict[str, Callable[[Connection], None]] = {
    "commit": _commit,
    "rollback": _rollback,
    "exception": _exception,
    "cancel": _cancel,
    "disconnect": _disconnect,
}
assert ENDING.keys() == ENDINGS.keys()


class PoolTest:
    """The scenarios, through the pool ``pooled``, watched on ``direct`` (its --timeout bounds
    every connection opened here too), whose snapshots ``diagnose`` analyses."""

    def __init__(
        self, pooled: str, direct: DiagnosticSession, diagnose: Diagnose, key: LockTriple
    ) -> None:
        if key.form != "pair":
            raise InputError("the pooltest key must be an int4 pair, e.g. --key 1818977383,1")
        self.pooled, self.direct, self.diagnose = pooled, direct, diagnose
        self.timeout: Timeout = direct.timeout
        self.key = key
        self.other = from_pair(key.pair[0], key.pair[1] + 1)
        self._open: list[Connection] = []

    # -- connections -------------------------------------------------------------------------

    def connect(self) -> Connection:
        """A worker's connection through the pool, each statement under the client-side
        deadline of the timeout."""
        info = make_conninfo(self.pooled, application_name=APPLICATION_NAME)
        # prepare_threshold=None: no server-side prepared statements through a pooler
        connection = deadline.connect(
            info, self.timeout, peer="the pool", autocommit=True, prepare_threshold=None
        )
        self._open.append(connection)
        return connection

    def close(self, connection: Connection) -> None:
        connection.close()
        with contextlib.suppress(ValueError):
            self._open.remove(connection)

    def holders(self, key: LockTriple | None = None) -> int:
        """Backends holding the key, seen directly in pg_locks (not through the pool)."""
        key = key or self.key
        params = {"classid": key.classid, "objid": key.objid, "objsubid": key.objsubid}
        row = self.direct.fetch("pooltest_holders", params)
        return Holders._make(row).holders if row else 0

    def evidence(self, consoles: tuple[str, ...]) -> list[str]:
        """Advisory locks a scenario could destroy: those held by the pool's server
        connections (the console's servers of this database and role when a console is
        given, else every backend of the database connected from the pooler's address), and
        any lock in the test keys' namespace. Each as "pid N holds LABEL (lockdiag who-holds
        ...)"."""
        probe = self.connect()
        try:
            row = probe.execute(queries.query("pooltest_probe").encode()).fetchone()
        finally:
            self.close(probe)
        side = PoolSide._make(row) if row else None
        address = side.address if side else None
        texts = Texts()  # the names as their bytes, with the database's encoding (raw_text.py)
        database = texts.decoded(side.database, UTF8, codec(side.encoding)) if side else None
        role = texts.decoded(side.role, UTF8, codec(side.encoding)) if side else None
        snapshot = self.direct.snapshot("advisory")
        servers: set[int] = set()
        for console_dsn in consoles:
            console = read_console(console_dsn, self.timeout)
            servers |= {
                int(s["remote_pid"])
                for s in console.servers
                if s.get("database") == database and s.get("user") == role
            }
        if not consoles:
            servers = {
                pid
                for pid, s in snapshot.sessions.items()
                if s.database == database and address and s.client_addr == address.split("/")[0]
            }
        at_risk = []
        for entry in self.diagnose(snapshot).advisory:
            triple = entry.decoded.triple if entry.decoded else None
            neighbour = (
                triple is not None
                and triple.form == "pair"
                and (triple.pair[0] == self.key.pair[0])
            )
            if entry.lock.granted and (entry.lock.pid in servers or neighbour):
                at_risk.append(entry)
        # a line per backend and namespace, as list folds them: 20,000 locks of one pooled
        # connection were 20,000 lines
        found = []
        for group in by_backend(at_risk, by_namespace=True):
            first = group[0].decoded
            assert first is not None
            count = locks_in(group)
            what = first.label if count == 1 else f"{count} locks{listed(group)}"
            found.append(
                f"pid {group[0].lock.pid} holds {what} "
                f"(lockdiag who-holds {_who_holds_args(first)})"
            )
        if len(found) > EVIDENCE_SHOWN:
            found[EVIDENCE_SHOWN:] = [f"and {len(found) - EVIDENCE_SHOWN} more such line(s)"]
        return found

    def holders_once_settled(self, within: float = 1.0) -> int:
        """Holders of the key after a client left: a pooler resets the server connection
        (DISCARD ALL in session pooling) a moment after the client goes, so a safe pool
        reaches 0 within ``within`` seconds; a leaked lock stays. A busy machine settles more
        slowly: the window grows with the time one look takes (50 looks' worth, 5 s at most)."""
        started = time.monotonic()
        held = self.holders()
        deadline = started + min(5.0, max(within, 50 * (time.monotonic() - started)))
        while held and time.monotonic() < deadline:
            time.sleep(0.02)
            held = self.holders()
        return held

    def lock(self, connection: Connection, function: str, key: LockTriple | None = None) -> bool:
        """``function`` (a lock or unlock function of the test key) through the pool."""
        a, b = (key or self.key).pair
        statement = sql.SQL(queries.query("pooltest_lock")).format(
            function=sql.Identifier(function)
        )
        row = connection.execute(statement, {"a": a, "b": b}).fetchone()
        return row is not None and Answer._make(row).answer is not False

    def release(self, key: LockTriple | None = None) -> int:
        """Unlock the test key through the pool until the server shows it free; returns how
        many holders remain (0 when clean). Each unlock only undoes one of our own takes.

        In transaction pooling a client has a server connection only during a transaction,
        and an idle one is handed out first: unlocks are sent from more and more clients at
        once, each inside a transaction, until one of them lands on the connection that holds
        the key."""
        key = key or self.key
        for width in (1, 1, 2, 2, 4, 4, 8, 8, 16, 16):
            if self.holders(key) == 0:
                return 0
            clients = [self.connect() for _ in range(width)]
            try:
                for client in clients:
                    client.execute("BEGIN")
                    self.lock(client, "pg_advisory_unlock", key)
            finally:
                for client in clients:
                    with contextlib.suppress(psycopg.Error):
                        client.execute("COMMIT")
                    self.close(client)
        return self.holders(key)

    def cleanup(self) -> int:
        for connection in list(self._open):
            with contextlib.suppress(psycopg.Error):
                self.close(connection)
        return self.release(self.key) + self.release(self.other)

    # -- scenarios ---------------------------------------------------------------------------

    def contention(self) -> Result:
        """A holds a session lock and stays connected; B tries the same key."""
        a = self.connect()
        try:
            took, error = self.lock(a, "pg_try_advisory_lock"), None
        except psycopg.Error as failure:
            took, error = False, one_line(str(failure))
        b = self.connect()
        b_got = took and self.lock(b, "pg_try_advisory_lock")
        self.close(b)
        self.close(a)
        self.release()
        return contention_verdict(took, b_got, error)

    def ending(self, kind: LockKind, how: str) -> Result:
        """A takes the key (inside a transaction, except a session lock before a disconnect),
        ends it ``how``; B tries while A's client is still connected; then A's client leaves
        and a new client C tries."""
        a = self.connect()
        took, error = False, None
        try:
            if how != "disconnect" or kind == "xact":
                a.execute("BEGIN")
            # a try: a key still held by a leak makes the scenario inconclusive, never a hang
            function = "pg_try_advisory_lock" if kind == "session" else "pg_try_advisory_xact_lock"
            took = self.lock(a, function)
            ENDING[how](a)
        except psycopg.Error as failure:
            error = one_line(str(failure))
        if how == "disconnect":
            self.close(a)
            # the pooler rolls back (or resets) the server connection a moment after its
            # client went: B tries once that has settled, or a busy machine reads as a leak
            held_after_end = self.holders_once_settled()
        else:
            held_after_end = self.holders()
        b_got = self._try_and_undo()
        if how != "disconnect":
            self.close(a)
        held_after_gone = self.holders_once_settled()
        c_got = self._try_and_undo()
        self.release()
        seen = Observation(kind, how, took, error, held_after_end, b_got, held_after_gone, c_got)
        return verdict(seen)

    def _try_and_undo(self) -> bool:
        """A new worker tries the key, and gives back what it got."""
        worker = self.connect()
        try:
            got = self.lock(worker, "pg_try_advisory_lock")
            if got:
                self.lock(worker, "pg_advisory_unlock")
            return got
        finally:
            self.close(worker)

    def independent_keys(self) -> Result:
        """Two different keys, both in transactions at once, must both be granted."""
        a, b = self.connect(), self.connect()
        try:
            a.execute("BEGIN")
            b.execute("BEGIN")
            a_got = self.lock(a, "pg_try_advisory_xact_lock")
            b_got = self.lock(b, "pg_try_advisory_xact_lock", self.other)
            a.execute("COMMIT")
            b.execute("COMMIT")
        except psycopg.Error as failure:
            return independent_verdict(False, False, one_line(str(failure)))
        finally:
            self.close(a)
            self.close(b)
        return independent_verdict(a_got, b_got)

    def scenarios(self) -> Iterator[Callable[[], Result]]:
        yield self.contention
        for kind in ("session", "xact"):
            for how in ENDINGS:
                yield lambda kind=kind, how=how: self.ending(kind, how)  # type: ignore[misc]
        yield self.independent_keys


def run(
    pooled: str,
    direct: DiagnosticSession,
    diagnose: Diagnose,
    key: LockTriple = DEFAULT_KEY,
    consoles: tuple[str, ...] = (),
    accept_losing_locks: bool = False,
) -> tuple[list[Result], int]:
    """Every scenario, through ``pooled``, watched on ``direct``; returns the results and how
    many test-key holders could not be released (0 when nothing is left behind). It refuses
    (InputError) when the pool's server connections hold advisory locks a scenario could
    destroy, unless ``accept_losing_locks``. A pool that cannot be used at all is a
    ServerError, with the same messages as any other server."""
    try:
        return _run(PoolTest(pooled, direct, diagnose, key), consoles, accept_losing_locks)
    except psycopg.Error as error:
        raise server_error(error, pooled, direct.timeout) from None


def _run(
    test: PoolTest, consoles: tuple[str, ...], accept_losing_locks: bool
) -> tuple[list[Result], int]:
    results: list[Result] = []
    if test.holders() or test.holders(test.other):
        raise InputError(
            f"the test key {test.key.describe()} is already held on the server: pick another "
            "with --key"
        )
    evidence = test.evidence(consoles)
    if evidence and not accept_losing_locks:
        raise InputError(
            "refusing to run: advisory locks are held that a scenario could release "
            "(PgBouncer closes a server connection whose client leaves in the middle of a "
            "transaction, and its session locks go with it):\n"
            + "\n".join(f"  {line}" for line in evidence),
            hint="look at them first; --accept-losing-locks runs anyway and may destroy them",
        )
    try:
        for scenario in test.scenarios():
            results.append(scenario())
    finally:
        left = test.cleanup()
    return results, left
