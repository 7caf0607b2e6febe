"""lockdiag.worker on every driver it takes, against a real server: the rules are written
once, as async scenarios, and each runs on each driver (a Caller drives the sync helpers on a
blocking connection, the async ones on an asyncio connection). What a caller holds is read
from a separate connection, in pg_locks."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from lockdiag.demo.cluster import Cluster
from lockdiag.registry import Registry
from lockdiag.worker import (
    Event,
    LockTimeout,
    NotInTransaction,
    PrometheusEvents,
    UnsupportedConnection,
    asession_lock,
    axact_lock,
    session_lock,
    xact_lock,
)

from helpers.registry import parsed_registry
from helpers.servers import Sessions, advisory_locks_of, held, url

TEXT = "[namespaces.tenant_summary]\nid = 4102\n[namespaces.nightly_export]\nid = 7\n"
RESOURCES = itertools.count(5000)  # a key of its own for every scenario
T = 0.2  # the helper's timeout
LOCKDIAG = 4102
QUERY_CANCELED = "57014"


@pytest.fixture
def registry() -> Registry:
    return parsed_registry(TEXT + 'form = "bigint"\n')


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE under a driver's error and its wrappers (SQLAlchemy, Django)."""
    seen: BaseException | None = error
    while seen is not None:
        for name in ("sqlstate", "pgcode"):
            if isinstance(getattr(seen, name, None), str):
                return str(getattr(seen, name))
        inner = getattr(seen, "orig", None)
        seen = inner if isinstance(inner, BaseException) else seen.__cause__
    return None


# -- callers: one per driver -----------------------------------------------------------------


class Caller:
    """A worker's connection and the helpers it calls, sync or async, awaited alike."""

    asynchronous = False

    def __init__(self, conn: Any, registry: Registry, events: Callable[[Event], None]) -> None:
        self.conn, self.registry, self.events = conn, registry, events

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractAsyncContextManager[object]:
        raise NotImplementedError

    async def xact(self, resource: int, timeout: float | None = None, wait: bool = False) -> bool:
        options: dict[str, Any] = {"registry": self.registry, "events": self.events}
        wait = wait or timeout is not None
        if self.asynchronous:
            return await axact_lock(self.conn, "tenant_summary", resource, wait=wait,
                                    timeout=timeout, **options)  # fmt: skip
        return xact_lock(self.conn, "tenant_summary", resource, wait=wait, timeout=timeout,
                         **options)  # fmt: skip

    @asynccontextmanager
    async def session(self, resource: int, timeout: float | None = None) -> AsyncIterator[bool]:
        options: dict[str, Any] = {"registry": self.registry, "events": self.events}
        wait = timeout is not None
        if self.asynchronous:
            async with asession_lock(self.conn, "tenant_summary", resource, wait=wait,
                                     timeout=timeout, **options) as taken:  # fmt: skip
                yield taken
        else:
            with session_lock(self.conn, "tenant_summary", resource, wait=wait,
                              timeout=timeout, **options) as taken:  # fmt: skip
                yield taken

    async def pid(self) -> int:
        return int((await self.run("SELECT pg_backend_pid()"))[0][0])

    async def settings(self) -> tuple[str, str]:
        lock = await self.run("SHOW lock_timeout")
        statement = await self.run("SHOW statement_timeout")
        return str(lock[0][0]), str(statement[0][0])


@asynccontextmanager
async def sync_block(manager: Any) -> AsyncIterator[object]:
    with manager as entered:
        yield entered


class Psycopg(Caller):
    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        cursor = self.conn.execute(statement.encode())
        return list(cursor.fetchall()) if cursor.description else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return sync_block(self.conn.transaction())


class AsyncPsycopg(Caller):
    asynchronous = True

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(statement.encode())
        return list(await cursor.fetchall()) if cursor.description else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]


class Psycopg2(Caller):
    """Not in autocommit mode (psycopg2's default); ``with conn:`` commits its transaction."""

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return sync_block(self.conn)


class SQLAlchemy(Caller):
    """A Connection or a Session: ``begin()`` is the transaction (autobegin otherwise)."""

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        from sqlalchemy import text

        result = self.conn.execute(text(statement))
        return [tuple(row) for row in result] if result.returns_rows else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return sync_block(self.conn.begin())


class AsyncSQLAlchemy(Caller):
    asynchronous = True

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        from sqlalchemy import text

        result = await self.conn.execute(text(statement))
        return [tuple(row) for row in result] if result.returns_rows else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self.conn.begin()  # type: ignore[no-any-return]


class Asyncpg(Caller):
    asynchronous = True

    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.conn.fetch(statement)]

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self.conn.transaction()  # type: ignore[no-any-return]


class Django(Caller):
    async def run(self, statement: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

    def transaction(self) -> AbstractAsyncContextManager[object]:
        from django.db import transaction

        return sync_block(transaction.atomic(using=self.conn.alias))


Opener = Callable[[bool], Awaitable[Caller]]  # autocommit -> a new caller
DRIVERS = [
    "psycopg", "psycopg-async", "psycopg2", "sqlalchemy+psycopg2", "sqlalchemy+psycopg",
    "sqlalchemy-session", "sqlalchemy-async+asyncpg", "sqlalchemy-async+psycopg",
    "sqlalchemy-asyncsession+asyncpg", "asyncpg", "asyncpg-pool", "django",
]  # fmt: skip
ASYNC_DRIVERS = [d for d in DRIVERS if "async" in d or d.startswith("asyncpg")]


def django_settings(cluster: Cluster) -> None:
    """Django configured once per process: two aliases on the test cluster (two workers)."""
    import django
    from django.conf import settings

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the scenarios run in an event loop
    if not settings.configured:
        database = {"ENGINE": "django.db.backends.postgresql", "HOST": "127.0.0.1",
                    "PORT": str(cluster.port), "NAME": "postgres", "USER": "postgres"}  # fmt: skip
        settings.configure(DATABASES={"default": database, "other": dict(database)},
                           USE_TZ=True)  # fmt: skip
        django.setup()


@asynccontextmanager
async def callers(
    driver: str, cluster: Cluster, registry: Registry, events: Callable[[Event], None]
) -> AsyncIterator[Opener]:
    """Opens callers of DRIVER (each on a connection of its own), closed on the way out."""
    async with AsyncExitStack() as stack:
        opened = itertools.count()

        async def opener(autocommit: bool) -> Caller:
            conn = await connect(driver, cluster, stack, autocommit, next(opened))
            kind = CALLERS[driver.split("+", maxsplit=1)[0]]
            return kind(conn, registry, events)

        yield opener


CALLERS: dict[str, type[Caller]] = {
    "psycopg": Psycopg, "psycopg-async": AsyncPsycopg, "psycopg2": Psycopg2,
    "sqlalchemy": SQLAlchemy, "sqlalchemy-session": SQLAlchemy,
    "sqlalchemy-async": AsyncSQLAlchemy, "sqlalchemy-asyncsession": AsyncSQLAlchemy,
    "asyncpg": Asyncpg, "asyncpg-pool": Asyncpg, "django": Django,
}  # fmt: skip


async def connect(driver: str, cluster: Cluster, stack: AsyncExitStack, autocommit: bool,
                  index: int) -> Any:  # fmt: skip
    """A connection of DRIVER; AUTOCOMMIT: in the driver's autocommit mode."""
    dsn = cluster.dsn(application_name="caller")
    if driver == "psycopg":
        return stack.enter_context(psycopg.connect(dsn, autocommit=True))
    if driver == "psycopg-async":
        return await stack.enter_async_context(
            await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        )
    if driver == "psycopg2":
        import psycopg2

        conn = psycopg2.connect(dsn)
        conn.autocommit = autocommit
        stack.callback(conn.close)
        return conn
    isolation = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    if driver.startswith("sqlalchemy-async"):
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        dialect = "asyncpg" if driver.endswith("asyncpg") else "psycopg"
        aengine = create_async_engine(
            url(cluster.port, scheme=f"postgresql+{dialect}"), **isolation
        )
        stack.push_async_callback(aengine.dispose)
        if driver.startswith("sqlalchemy-asyncsession"):
            return await stack.enter_async_context(AsyncSession(aengine))
        return await stack.enter_async_context(aengine.connect())
    if driver.startswith("sqlalchemy"):
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        dialect = "psycopg" if driver == "sqlalchemy+psycopg" else "psycopg2"
        engine = create_engine(url(cluster.port, scheme=f"postgresql+{dialect}"), **isolation)
        stack.callback(engine.dispose)
        if driver == "sqlalchemy-session":
            return stack.enter_context(Session(engine))
        return stack.enter_context(engine.connect())
    if driver == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(url(cluster.port))
        stack.push_async_callback(conn.close)
        return conn
    if driver == "asyncpg-pool":
        import asyncpg

        pool = await stack.enter_async_context(
            asyncpg.create_pool(url(cluster.port), min_size=1, max_size=2)
        )
        return await stack.enter_async_context(pool.acquire())
    django_settings(cluster)
    from django.db import connection, connections

    stack.callback(connections.close_all)
    return connection if index == 0 else connections["other"]


def scenario(
    driver: str,
    cluster: Cluster,
    registry: Registry,
    body: Callable[[Opener, list[Event]], Awaitable[None]],
    events: Callable[[Event], None] | None = None,
) -> list[Event]:
    """Runs BODY with an opener of DRIVER's callers; the events they reported."""
    seen: list[Event] = []

    def report(event: Event) -> None:
        seen.append(event)
        if events is not None:
            events(event)

    async def main() -> None:
        async with callers(driver, cluster, registry, report) as opener:
            await body(opener, seen)

    asyncio.run(main())
    return seen


def attempts(events: list[Event]) -> list[str]:
    return [event.result for event in events if event.what == "attempt"]


ALL = pytest.mark.parametrize("driver", DRIVERS)


# -- the rules, once -------------------------------------------------------------------------


@ALL
def test_two_workers_contend(driver: str, cluster: Cluster, registry: Registry) -> None:
    resource = next(RESOURCES)

    async def body(open_caller: Opener, events: list[Event]) -> None:
        first, second = await open_caller(False), await open_caller(False)
        async with first.transaction():
            assert await first.xact(resource)
            async with second.transaction():
                assert not await second.xact(resource)
            assert held(cluster, resource) == 1
        assert held(cluster, resource) == 0  # the first committed: its lock is gone
        async with second.transaction():
            assert await second.xact(resource)
            assert held(cluster, resource) == 1

    events = scenario(driver, cluster, registry, body)
    assert attempts(events) == ["acquired", "busy", "acquired"]


@ALL
def test_a_transaction_lock_outside_a_transaction_is_refused(
    driver: str, cluster: Cluster, registry: Registry
) -> None:
    resource = next(RESOURCES)

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(True)
        with pytest.raises(NotInTransaction, match="needs a transaction"):
            await caller.xact(resource)
        assert held(cluster, resource) == 0
        assert events == []  # refused before any attempt

    scenario(driver, cluster, registry, body)


@ALL
@pytest.mark.parametrize("inside", [False, True], ids=["autocommit", "in-transaction"])
def test_a_session_lock_is_held_in_its_block_and_released_after_an_exception(
    driver: str, cluster: Cluster, registry: Registry, inside: bool
) -> None:
    """In a transaction, the block's failed statement is rolled back to the helper's
    savepoint: the unlock runs and the caller's transaction goes on."""
    resource = next(RESOURCES)

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(not inside)
        async with AsyncExitStack() as stack:
            if inside:
                await stack.enter_async_context(caller.transaction())
            with pytest.raises(Exception) as raised:
                async with caller.session(resource) as taken:
                    assert taken and held(cluster, resource) == 1
                    await caller.run("SELECT 1 / 0")
            assert sqlstate(raised.value) == "22012"  # division_by_zero
            assert held(cluster, resource) == 0
            assert await caller.run("SELECT 1") == [(1,)]  # the caller's transaction goes on
        results = [event.result for event in events if event.what == "release"]
        assert results == ["ok"]

    scenario(driver, cluster, registry, body)


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_a_cancelled_task_releases_its_session_lock(
    driver: str, cluster: Cluster, registry: Registry
) -> None:
    resource = next(RESOURCES)

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(True)
        inside = asyncio.Event()

        async def job() -> None:
            async with caller.session(resource) as taken:
                assert taken
                inside.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(job())
        await asyncio.wait_for(inside.wait(), 10)
        assert held(cluster, resource) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert held(cluster, resource) == 0
        assert await caller.run("SELECT 1") == [(1,)]

    events = scenario(driver, cluster, registry, body)
    assert [e.result for e in events if e.what == "release"] == ["ok"]


@ALL
@pytest.mark.parametrize("kind", ["xact", "session"])
def test_a_waiting_lock_with_a_timeout_gives_up_in_time(
    driver: str, cluster: Cluster, sessions: Sessions, registry: Registry, kind: str
) -> None:
    """The caller's transaction stays usable and its SET LOCAL settings stay as they were."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock({LOCKDIAG}, {resource})")

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(False)
        async with caller.transaction():
            await caller.run("SET LOCAL lock_timeout = '3s'")
            await caller.run("SET LOCAL statement_timeout = '4s'")
            pid = await caller.pid()
            started = time.monotonic()
            with pytest.raises(LockTimeout, match=r"not granted within 0\.2s"):
                if kind == "xact":
                    await caller.xact(resource, timeout=T)
                else:
                    async with caller.session(resource, timeout=T):
                        pytest.fail("the session lock was taken")
            assert T <= time.monotonic() - started < 3
            assert advisory_locks_of(cluster, pid) == 0
            assert await caller.settings() == ("3s", "4s")
            assert await caller.run("SELECT 1") == [(1,)]
        async with caller.transaction():
            assert await caller.settings() == ("0", "0")  # the local settings ended with it

    events = scenario(driver, cluster, registry, body)
    assert attempts(events) == ["timeout"]


@ALL
def test_the_counters_count(driver: str, cluster: Cluster, registry: Registry) -> None:
    """The same metric names and labels, whatever the driver."""
    collector = CollectorRegistry()
    resource = next(RESOURCES)

    async def body(open_caller: Opener, events: list[Event]) -> None:
        first, second = await open_caller(False), await open_caller(True)
        async with first.transaction():
            assert await first.xact(resource)
            async with second.session(resource) as taken:
                assert not taken
        async with second.session(resource) as taken:
            assert taken

    scenario(driver, cluster, registry, body, PrometheusEvents(collector))

    def value(name: str, **labels: str) -> float:
        found = collector.get_sample_value(name, {"namespace": "tenant_summary", **labels})
        return found if found is not None else 0.0

    attempts_total = "lockdiag_worker_lock_attempts_total"
    assert value(attempts_total, kind="xact", result="acquired") == 1
    assert value(attempts_total, kind="session", result="busy") == 1
    assert value(attempts_total, kind="session", result="acquired") == 1
    assert value("lockdiag_worker_lock_releases_total", result="ok") == 1
    assert value("lockdiag_worker_lock_wait_seconds_count", kind="session") == 2
    assert value("lockdiag_worker_lock_hold_seconds_count", kind="session") == 1


@pytest.mark.parametrize("driver", ["psycopg2", "sqlalchemy+psycopg2", "django"])
def test_a_cancelled_wait_leaves_the_callers_transaction_usable(
    driver: str, cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    """pg_cancel_backend while the helper waits: the driver's QueryCanceled, raised inside
    the helper's savepoint (each adapter makes its own)."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock({LOCKDIAG}, {resource})")

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(False)
        async with caller.transaction():
            await caller.run("SET LOCAL lock_timeout = '3s'")
            pid = await caller.pid()

            def cancel() -> None:
                sessions.until(lambda admin: bool(admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
                ).fetchone()[0]), 10, "the caller to wait")  # type: ignore[index]  # fmt: skip
                with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                    admin.execute("SELECT pg_cancel_backend(%s)", (pid,))

            canceller = asyncio.get_running_loop().run_in_executor(None, cancel)
            with pytest.raises(Exception) as raised:
                await caller.xact(resource, timeout=30)
            await canceller
            assert sqlstate(raised.value) == QUERY_CANCELED
            assert advisory_locks_of(cluster, pid) == 0
            assert await caller.settings() == ("3s", "0")
            assert await caller.run("SELECT 1") == [(1,)]

    events = scenario(driver, cluster, registry, body)
    assert attempts(events) == ["error"]


# -- recognising the driver ------------------------------------------------------------------


def test_importing_the_helpers_loads_no_driver() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, lockdiag.worker; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('psycopg', 'psycopg2', 'sqlalchemy', 'asyncpg', 'django')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True)  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_what_is_not_a_known_connection_is_refused(cluster: Cluster, registry: Registry) -> None:
    from sqlalchemy import create_engine

    with pytest.raises(UnsupportedConnection, match=r"builtins\.str is not a connection"):
        xact_lock("dbname=app", "tenant_summary", 1, registry=registry)
    with (
        psycopg.connect(cluster.dsn()) as conn,
        pytest.raises(UnsupportedConnection, match="use xact_lock"),
    ):
        asyncio.run(axact_lock(conn, "tenant_summary", 1, registry=registry))
    engine = create_engine("sqlite://")
    with engine.connect() as lite, pytest.raises(UnsupportedConnection, match="on sqlite"):
        xact_lock(lite, "tenant_summary", 1, registry=registry)

    async def blocking_api() -> None:
        aconn = await psycopg.AsyncConnection.connect(cluster.dsn())
        async with aconn:
            with pytest.raises(UnsupportedConnection, match="use axact_lock"):
                xact_lock(aconn, "tenant_summary", 1, registry=registry)

    asyncio.run(blocking_api())


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
@pytest.mark.parametrize("kind", ["xact", "session"])
def test_a_task_cancelled_while_it_waits_leaves_the_callers_transaction_usable(
    driver: str, cluster: Cluster, sessions: Sessions, registry: Registry, kind: str
) -> None:
    """asyncio's cancellation of the waiting helper: nothing is held afterwards, and the
    caller's transaction and its settings are as they were."""
    resource = next(RESOURCES)
    sessions.open("key-holder").run(f"SELECT pg_advisory_lock({LOCKDIAG}, {resource})")

    async def body(open_caller: Opener, events: list[Event]) -> None:
        caller = await open_caller(False)
        async with caller.transaction():
            await caller.run("SET LOCAL lock_timeout = '3s'")
            pid = await caller.pid()

            async def waiting() -> None:
                if kind == "xact":
                    await caller.xact(resource, timeout=30)
                else:
                    async with caller.session(resource, timeout=30):
                        pytest.fail("the session lock was taken")

            task = asyncio.create_task(waiting())
            await asyncio.to_thread(sessions.until, lambda admin: bool(admin.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
            ).fetchone()[0]), 10, "the helper to wait")  # type: ignore[index]  # fmt: skip
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert advisory_locks_of(cluster, pid) == 0
            assert await caller.settings() == ("3s", "0")
            assert await caller.run("SELECT 1") == [(1,)]

    events = scenario(driver, cluster, registry, body)
    assert attempts(events) == ["error"]
