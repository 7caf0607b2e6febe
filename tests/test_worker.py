"""lockdiag.worker against a real server, with real concurrent workers, sync and async."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.registry import Registry, UnknownNamespace, load_registry
from lockdiag.worker import (
    Event,
    LockTimeout,
    NotInTransaction,
    PrometheusEvents,
    asession_lock,
    axact_lock,
    session_lock,
    work,
    xact_lock,
)

from helpers.registry import parsed_registry
from helpers.servers import Sessions, advisory_locks_of, held

ROOT = Path(__file__).resolve().parent.parent
TEXT = (
    '[namespaces.tenant_summary]\nid = 4102\n[namespaces.nightly_export]\nid = 7\nform = "bigint"\n'
)


@pytest.fixture
def registry() -> Registry:
    return parsed_registry(TEXT)


def test_two_workers_contend(cluster: Cluster, registry: Registry) -> None:
    events: list[Event] = []
    with psycopg.connect(cluster.dsn()) as first, psycopg.connect(cluster.dsn()) as second:
        with first.transaction():
            assert xact_lock(first, "tenant_summary", 1, registry=registry, events=events.append)
            with second.transaction():
                assert not xact_lock(second, "tenant_summary", 1, registry=registry,
                                     events=events.append)  # fmt: skip
        with second.transaction():  # the first committed: its lock is gone
            assert xact_lock(second, "tenant_summary", 1, registry=registry, events=events.append)
    assert [e.result for e in events] == ["acquired", "busy", "acquired"]


def test_a_transaction_lock_outside_a_transaction_is_refused(
    cluster: Cluster, registry: Registry
) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        with pytest.raises(NotInTransaction, match=r"conn\.transaction"):
            xact_lock(conn, "tenant_summary", 2, registry=registry)
        assert held(cluster, 2) == 0


def test_a_connection_not_in_autocommit_holds_the_lock_until_its_commit(
    cluster: Cluster, registry: Registry
) -> None:
    """psycopg begins the caller's transaction before the first statement: the lock is the
    caller's until it commits, and a wait that gives up leaves the connection as it was."""
    with psycopg.connect(cluster.dsn()) as conn, psycopg.connect(cluster.dsn()) as other:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert xact_lock(conn, "tenant_summary", 5, registry=registry)
        assert held(cluster, 5) == 1  # still held after the helper returned
        with other.transaction(), pytest.raises(LockTimeout):
            xact_lock(other, "tenant_summary", 5, wait=True, timeout=0.2, registry=registry)
        conn.commit()
        assert held(cluster, 5) == 0
        # nothing open, the key busy: the wait gives up...
        with pytest.raises(LockTimeout), other.transaction():
            xact_lock(other, "tenant_summary", 6, registry=registry)
            xact_lock(conn, "tenant_summary", 6, wait=True, timeout=0.2, registry=registry)
        # ...and the transaction it opened is gone: the connection is idle and usable
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_exception_releases_a_session_lock(cluster: Cluster, registry: Registry) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        with pytest.raises(RuntimeError), session_lock(conn, "tenant_summary", 3,
                                                       registry=registry) as taken:  # fmt: skip
            assert taken and held(cluster, 3) == 1
            raise RuntimeError("the job failed")
        assert held(cluster, 3) == 0
    with psycopg.connect(cluster.dsn()) as conn, conn.transaction():  # a failed statement
        with (
            pytest.raises(psycopg.errors.DivisionByZero),
            session_lock(conn, "tenant_summary", 4, registry=registry),
        ):
            conn.execute("SELECT 1 / 0")
        assert held(cluster, 4) == 0
        conn.execute("SELECT 1")  # the caller's transaction goes on


def test_a_session_lock_survives_rollback_and_is_released_on_exit(
    cluster: Cluster, registry: Registry
) -> None:
    with psycopg.connect(cluster.dsn()) as conn:
        with session_lock(conn, "tenant_summary", 5, registry=registry) as taken:
            assert taken
            conn.rollback()  # PostgreSQL's rule: a session lock ignores the transaction
            assert held(cluster, 5) == 1
        assert held(cluster, 5) == 0


def test_a_waiting_lock_gives_up_in_time(cluster: Cluster, registry: Registry) -> None:
    owner, waiter = psycopg.connect(cluster.dsn()), psycopg.connect(cluster.dsn())
    with owner, waiter, owner.transaction():
        xact_lock(owner, "tenant_summary", 6, registry=registry)
        with waiter.transaction():
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                xact_lock(waiter, "tenant_summary", 6, wait=True, timeout=0.3,
                              registry=registry)  # fmt: skip
            assert time.monotonic() - started < 3
            assert waiter.execute("SELECT 1").fetchone() == (1,)  # still usable


def test_counters_show_acquired_and_busy(cluster: Cluster, registry: Registry) -> None:
    collector = CollectorRegistry()
    events = PrometheusEvents(collector)
    with psycopg.connect(cluster.dsn()) as a, psycopg.connect(cluster.dsn()) as b:
        with a.transaction(), b.transaction():
            xact_lock(a, "tenant_summary", 7, registry=registry, events=events)
            xact_lock(b, "tenant_summary", 7, registry=registry, events=events)
        with pytest.raises(RuntimeError), work("tenant_summary", events=events):
            raise RuntimeError("the job failed")

    def value(name: str, **labels: str) -> float:
        found = collector.get_sample_value(name, labels)
        return found if found is not None else 0.0

    attempts = "lockdiag_worker_lock_attempts_total"
    assert value(attempts, namespace="tenant_summary", kind="xact", result="acquired") == 1
    assert value(attempts, namespace="tenant_summary", kind="xact", result="busy") == 1
    assert value("lockdiag_worker_work_total", namespace="tenant_summary", outcome="error") == 1
    count = "lockdiag_worker_lock_wait_seconds_count"
    assert value(count, namespace="tenant_summary", kind="xact") == 2


def test_an_unlock_that_finds_nothing_is_counted(cluster: Cluster, registry: Registry) -> None:
    events: list[Event] = []
    conn = psycopg.connect(cluster.dsn(), autocommit=True)
    with conn, session_lock(conn, "nightly_export", 1, registry=registry, events=events.append):
        conn.execute("SELECT pg_advisory_unlock((7::bigint << 32) | 1)")  # someone else's code
    assert [e.result for e in events if e.what == "release"] == ["not-held"]


def test_the_cli_errors_for_bad_names_and_resources(registry: Registry) -> None:
    with pytest.raises(UnknownNamespace, match="did you mean tenant_summary"):
        registry.key("tenant_sumary", 1)
    with pytest.raises(InputError, match="resource"):
        registry.key("tenant_summary", 2**40)


def test_the_async_variants(cluster: Cluster, registry: Registry) -> None:
    async def scenario() -> list[Any]:
        results: list[Any] = []
        dsn = cluster.dsn()
        first = await psycopg.AsyncConnection.connect(dsn)
        second = await psycopg.AsyncConnection.connect(dsn)
        auto = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with first, second, auto:
            async with first.transaction():
                results.append(await axact_lock(first, "tenant_summary", 8, registry=registry))
                async with second.transaction():
                    results.append(await axact_lock(second, "tenant_summary", 8, registry=registry))
                    with pytest.raises(LockTimeout):
                        await axact_lock(second, "tenant_summary", 8, wait=True, timeout=0.2,
                                         registry=registry)  # fmt: skip
            with pytest.raises(NotInTransaction):
                await axact_lock(auto, "tenant_summary", 9, registry=registry)
            with pytest.raises(RuntimeError):
                async with asession_lock(auto, "tenant_summary", 10, registry=registry) as taken:
                    results.append(taken)
                    results.append(held(cluster, 10))
                    raise RuntimeError("the job failed")
            results.append(held(cluster, 10))

            async def cancelled() -> None:
                async with asession_lock(auto, "tenant_summary", 11, registry=registry):
                    await asyncio.sleep(30)

            task = asyncio.create_task(cancelled())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            results.append(held(cluster, 11))
        return results

    assert asyncio.run(scenario()) == [True, False, True, 1, 0, 0]


def test_the_example_worker_runs(cluster: Cluster) -> None:
    environment = {**os.environ, "LOCKDIAG_REGISTRY": str(ROOT / "examples" / "lockdiag.toml")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "worker.py"), cluster.dsn(), "73", "74"],
        env=environment, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["tenant 73: rebuilt", "tenant 74: rebuilt"]


PARTS = """\
[namespaces.tenant_period]
id = 4103
resource = ["tenant:int", "period:text"]
values = [[73, "2026-11"]]
expected_resources = 50000
"""


def sha256_v1(*values: object) -> int:
    """The documented derivation, written again from its description."""
    encoded = b""
    for value in values:
        data = str(value).encode()
        encoded += (b"i" if isinstance(value, int) else b"t") + len(data).to_bytes(4, "big") + data
    return int.from_bytes(hashlib.sha256(encoded).digest()[:4], "big", signed=True)


def test_resources_of_several_parts(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "lockdiag.toml").write_text(PARTS)
    registry = load_registry(str(tmp_path / "lockdiag.toml"))
    key = registry.key("tenant_period", 73, "2026-11")
    assert key.triple.pair == (4103, sha256_v1(73, "2026-11"))
    assert registry.key("tenant_period", "73", "2026-11") == key  # typed on a command line
    with pytest.raises(InputError, match="2 part"):
        registry.key("tenant_period", 73)
    env = ["--registry", str(tmp_path / "lockdiag.toml")]
    shown = CliRunner().invoke(cli, ["key", "tenant_period", "73", "2026-11", *env])
    assert "sha256-v1 of the parts" in shown.stdout and str(key.triple.pair[1]) in shown.stdout
    worker = psycopg.connect(cluster.dsn(application_name="period-worker"))
    with worker, worker.transaction():
        assert xact_lock(worker, "tenant_period", 73, "2026-11", registry=registry)
        assert xact_lock(worker, "tenant_period", 74, "2026-12", registry=registry)
        who = CliRunner().invoke(
            cli, ["who-holds", "tenant_period", "73", "2026-11", "--dsn", cluster.dsn(), *env]
        )
        assert who.exit_code == 0 and "tenant_period 73 2026-11" in who.stdout
        listed = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(), *env])
        unlisted = f"#{registry.key('tenant_period', 74, '2026-12').resource & 0xFFFFFFFF:08x}"
        assert f"tenant_period {unlisted}" in listed.stdout  # its parts are not listed
    checked = CliRunner().invoke(cli, ["registry", "check", *env])
    assert "with 50000 resources alive at once, two share a key with probability 0.25" in (
        checked.stdout
    )


def test_registry_check_reports_listed_values_that_collide(tmp_path: Path) -> None:
    seen: dict[int, int] = {}
    for tenant in range(300_000):  # the birthday bound: a collision is expected near 77,000
        number = sha256_v1(tenant, "p")
        if number in seen:
            pair = (seen[number], tenant)
            break
        seen[number] = tenant
    else:
        pytest.fail("no collision among 300,000 values")
    (tmp_path / "lockdiag.toml").write_text(
        '[namespaces.t]\nid = 1\nresource = ["tenant:int", "period:text"]\n'
        f'values = [[{pair[0]}, "p"], [{pair[1]}, "p"]]\n'
    )
    checked = CliRunner().invoke(cli, ["registry", "check", "--registry",
                                       str(tmp_path / "lockdiag.toml")])  # fmt: skip
    assert checked.exit_code == 0  # a warning, not an error
    assert f"[{pair[0]}, 'p'] and [{pair[1]}, 'p'] share the key" in checked.stdout


# -- the caller's settings: what a helper touches it puts back -------------------------------
#
# Every scenario is written once, as async code, and runs against both APIs: a Caller drives
# the sync helpers on a Connection or the async ones on an AsyncConnection. The caller's
# settings are read on its own connection (no other session can read them); what it holds and
# what it waits for are read from a separate connection, in pg_locks.

T = 0.2  # the helper's timeout
HOLD = 3 * T  # how long the caller's next statement then waits on a row lock
RESOURCES = itertools.count(1000)  # a key of its own for every scenario
Settings = tuple[str, str]  # (lock_timeout, statement_timeout)
SESSION: Settings = ("7s", "8s")  # SET at session level, before the transaction
LOCAL: Settings = ("3s", "4s")  # SET LOCAL in the caller's transaction (over SESSION)
DEFAULT: Settings = ("0", "0")
IN_TRANSACTION = {"default": DEFAULT, "session": SESSION, "local": LOCAL}
AFTER = {"default": DEFAULT, "session": SESSION, "local": SESSION}


class Caller:
    """The caller's connection and the helpers it calls, sync or async, awaited alike."""

    def __init__(self, registry: Registry, pid: int) -> None:
        self.registry = registry
        self.pid = pid
        self.events: list[Event] = []
        self.rows = itertools.cycle(range(1, 11))  # a row of its own for each wait in a transaction

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractAsyncContextManager[object]:
        raise NotImplementedError

    async def xact(self, resource: int, timeout: float | None) -> bool:
        raise NotImplementedError

    def session(self, resource: int, timeout: float | None) -> AbstractAsyncContextManager[bool]:
        raise NotImplementedError

    async def settings(self) -> Settings:
        lock = await self.run("SHOW lock_timeout")
        statement = await self.run("SHOW statement_timeout")
        return lock[0][0], statement[0][0]

    async def set_session(self, setting: str) -> None:
        if setting != "default":
            await self.run(f"SET lock_timeout = '{SESSION[0]}'")
            await self.run(f"SET statement_timeout = '{SESSION[1]}'")

    async def set_local(self, setting: str) -> None:
        if setting == "local":
            await self.run(f"SET LOCAL lock_timeout = '{LOCAL[0]}'")
            await self.run(f"SET LOCAL statement_timeout = '{LOCAL[1]}'")

    def attempts(self) -> list[str]:
        return [event.result for event in self.events if event.what == "attempt"]


class SyncCaller(Caller):
    def __init__(self, conn: psycopg.Connection[Any], registry: Registry) -> None:
        super().__init__(registry, conn.info.backend_pid)
        self.conn = conn

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        cursor = self.conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description else []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[object]:
        with self.conn.transaction() as transaction:
            yield transaction

    async def xact(self, resource: int, timeout: float | None) -> bool:
        return xact_lock(self.conn, "tenant_summary", resource, wait=True, timeout=timeout,
                         registry=self.registry, events=self.events.append)  # fmt: skip

    @asynccontextmanager
    async def session(self, resource: int, timeout: float | None) -> AsyncIterator[bool]:
        with session_lock(self.conn, "tenant_summary", resource, wait=True, timeout=timeout,
                          registry=self.registry, events=self.events.append) as taken:  # fmt: skip
            yield taken


class AsyncCaller(Caller):
    def __init__(self, conn: psycopg.AsyncConnection[Any], registry: Registry) -> None:
        super().__init__(registry, conn.info.backend_pid)
        self.conn = conn

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(statement.encode())
        return await cursor.fetchall() if cursor.description else []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[object]:
        async with self.conn.transaction() as transaction:
            yield transaction

    async def xact(self, resource: int, timeout: float | None) -> bool:
        return await axact_lock(self.conn, "tenant_summary", resource, wait=True,
                                timeout=timeout, registry=self.registry,
                                events=self.events.append)  # fmt: skip

    @asynccontextmanager
    async def session(self, resource: int, timeout: float | None) -> AsyncIterator[bool]:
        async with asession_lock(self.conn, "tenant_summary", resource, wait=True,
                                 timeout=timeout, registry=self.registry,
                                 events=self.events.append) as taken:  # fmt: skip
            yield taken


@asynccontextmanager
async def connected(api: str, cluster: Cluster, registry: Registry) -> AsyncIterator[Caller]:
    """The caller, in autocommit mode: its transactions are its own ``transaction()`` blocks."""
    dsn = cluster.dsn(application_name="caller")
    if api == "sync":
        with psycopg.connect(dsn, autocommit=True) as conn:
            yield SyncCaller(conn, registry)
    else:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            yield AsyncCaller(aconn, registry)


async def attempt(caller: Caller, kind: str, resource: int, timeout: float | None) -> None:
    """A waiting lock that is expected to fail (its block is never reached)."""
    if kind == "xact":
        await caller.xact(resource, timeout)
    else:
        async with caller.session(resource, timeout):
            pytest.fail("the session lock was taken")


def waits_for_a_lock(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
    ).fetchone()
    return bool(row and row[0])


@contextmanager
def meanwhile(
    sessions: Sessions, pid: int, action: Callable[[], object], after: float = 0.0
) -> Iterator[None]:
    """While the block runs: once backend PID waits for a lock (seen in pg_locks from another
    connection) and AFTER more seconds have passed, ACTION runs, in a thread. It runs even
    when the wait is never seen, so that nothing stays locked; then the thread's error is
    raised, unless the block raised its own."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            sessions.until(lambda admin: waits_for_a_lock(admin, pid), 10,
                           f"pid {pid} to wait for a lock")  # fmt: skip
            time.sleep(after)
        except BaseException as error:  # raised in the test's thread below
            errors.append(error)
        finally:
            action()

    thread = threading.Thread(target=target, daemon=True, name="meanwhile")
    thread.start()
    try:
        yield
    finally:
        thread.join(15)
    if errors:
        raise errors[0]


def cancel(cluster: Cluster, pid: int) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_cancel_backend(%s)", (pid,))


async def unchanged(caller: Caller, expected: Settings, sessions: Sessions) -> None:
    """The caller's next statement that waits on a row lock for longer than T is not cut
    short by a lock timeout, and SHOW gives back the caller's own settings."""
    row, holder = next(caller.rows), sessions.open("row-holder")
    holder.run("BEGIN")
    holder.run(f"SELECT id FROM items WHERE id = {row} FOR UPDATE NOWAIT")
    started = time.monotonic()
    with meanwhile(sessions, caller.pid, lambda: holder.run("COMMIT"), after=HOLD):
        assert await caller.run(f"SELECT id FROM items WHERE id = {row} FOR UPDATE") == [(row,)]
    assert time.monotonic() - started >= HOLD
    assert await caller.settings() == expected
    assert await caller.run("SELECT 1") == [(1,)]  # the transaction is usable


APIS = pytest.mark.parametrize("api", ["sync", "async"])
KINDS = pytest.mark.parametrize("kind", ["xact", "session"])


@APIS
@KINDS
@pytest.mark.parametrize("setting", ["default", "session", "local"])
def test_a_taken_lock_leaves_the_callers_settings(
    cluster: Cluster, sessions: Sessions, registry: Registry, api: str, kind: str, setting: str
) -> None:
    resource, expected = next(RESOURCES), IN_TRANSACTION[setting]

    async def scenario() -> None:
        async with connected(api, cluster, registry) as caller:
            await caller.set_session(setting)
            async with caller.transaction():
                await caller.set_local(setting)
                assert await caller.settings() == expected
                if kind == "xact":
                    assert await caller.xact(resource, T)
                    assert held(cluster, resource) == 1
                    await unchanged(caller, expected, sessions)
                else:
                    async with caller.session(resource, T) as taken:
                        assert taken and held(cluster, resource) == 1
                        await unchanged(caller, expected, sessions)
                    assert held(cluster, resource) == 0
                    await unchanged(caller, expected, sessions)  # after the block too
            assert await caller.settings() == AFTER[setting]
            assert caller.attempts() == ["acquired"]

    asyncio.run(scenario())


@APIS
@KINDS
@pytest.mark.parametrize("setting", ["session", "local"])
def test_a_timed_out_wait_leaves_the_callers_settings(
    cluster: Cluster, sessions: Sessions, registry: Registry, api: str, kind: str, setting: str
) -> None:
    resource, expected = next(RESOURCES), IN_TRANSACTION[setting]
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock(4102, {resource})")

    async def scenario() -> None:
        async with connected(api, cluster, registry) as caller:
            await caller.set_session(setting)
            async with caller.transaction():
                await caller.set_local(setting)
                started = time.monotonic()
                with pytest.raises(LockTimeout):
                    await attempt(caller, kind, resource, T)
                assert T <= time.monotonic() - started < 3
                assert advisory_locks_of(cluster, caller.pid) == 0
                await unchanged(caller, expected, sessions)
            assert await caller.settings() == AFTER[setting]
            assert caller.attempts() == ["timeout"]

    asyncio.run(scenario())


@APIS
@KINDS
def test_a_cancelled_wait_leaves_the_callers_settings(
    cluster: Cluster, sessions: Sessions, registry: Registry, api: str, kind: str
) -> None:
    """pg_cancel_backend from another connection while the helper waits: QueryCanceled,
    raised inside the helper's savepoint."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock(4102, {resource})")

    async def scenario() -> None:
        async with connected(api, cluster, registry) as caller:
            await caller.set_session("local")
            async with caller.transaction():
                await caller.set_local("local")
                with (
                    meanwhile(sessions, caller.pid, lambda: cancel(cluster, caller.pid)),
                    pytest.raises(psycopg.errors.QueryCanceled),
                ):
                    await attempt(caller, kind, resource, 30)
                assert advisory_locks_of(cluster, caller.pid) == 0
                await unchanged(caller, LOCAL, sessions)
            assert await caller.settings() == SESSION
            assert caller.attempts() == ["error"]

    asyncio.run(scenario())


@KINDS
def test_a_cancelled_task_leaves_the_callers_settings(
    cluster: Cluster, sessions: Sessions, registry: Registry, kind: str
) -> None:
    """asyncio's cancellation of the waiting task (psycopg cancels the query on the server)."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock(4102, {resource})")

    async def scenario() -> None:
        async with connected("async", cluster, registry) as caller:
            await caller.set_session("local")
            async with caller.transaction():
                await caller.set_local("local")
                task = asyncio.create_task(attempt(caller, kind, resource, 30))
                await asyncio.to_thread(sessions.until,
                                        lambda admin: waits_for_a_lock(admin, caller.pid), 10,
                                        "the helper to wait")  # fmt: skip
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert advisory_locks_of(cluster, caller.pid) == 0
                await unchanged(caller, LOCAL, sessions)
            assert await caller.settings() == SESSION
            assert caller.attempts() == ["error"]

    asyncio.run(scenario())


@APIS
@pytest.mark.parametrize("setting", ["default", "session"])
def test_a_session_lock_outside_a_transaction_leaves_the_callers_settings(
    cluster: Cluster, sessions: Sessions, registry: Registry, api: str, setting: str
) -> None:
    """Autocommit, no transaction: taken, then timed out, then cancelled."""
    resource, expected = next(RESOURCES), IN_TRANSACTION[setting]

    async def scenario() -> None:
        async with connected(api, cluster, registry) as caller:
            await caller.set_session(setting)
            async with caller.session(resource, T) as taken:
                assert taken and held(cluster, resource) == 1
                await unchanged(caller, expected, sessions)
            assert held(cluster, resource) == 0
            await unchanged(caller, expected, sessions)
            sessions.open("key-holder").run(f"SELECT pg_advisory_lock(4102, {resource})")
            with pytest.raises(LockTimeout):
                await attempt(caller, "session", resource, T)
            await unchanged(caller, expected, sessions)
            with (
                meanwhile(sessions, caller.pid, lambda: cancel(cluster, caller.pid)),
                pytest.raises(psycopg.errors.QueryCanceled),
            ):
                await attempt(caller, "session", resource, 30)
            await unchanged(caller, expected, sessions)
            assert advisory_locks_of(cluster, caller.pid) == 0
            assert caller.attempts() == ["acquired", "timeout", "error"]

    asyncio.run(scenario())


@APIS
@KINDS
def test_a_wait_cut_short_by_the_callers_own_lock_timeout(
    cluster: Cluster, sessions: Sessions, registry: Registry, api: str, kind: str
) -> None:
    """wait=True without a timeout: the caller's lock_timeout applies, and running out of it
    is a LockTimeout too (it was a TypeError, formatting the missing timeout)."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock(4102, {resource})")

    async def scenario() -> None:
        async with connected(api, cluster, registry) as caller:
            await caller.run("SET lock_timeout = '200ms'")
            async with caller.transaction():
                with pytest.raises(LockTimeout, match="within the caller's lock_timeout"):
                    await attempt(caller, kind, resource, None)
                assert await caller.settings() == ("200ms", "0")
                assert await caller.run("SELECT 1") == [(1,)]
            assert caller.attempts() == ["timeout"]

    asyncio.run(scenario())
