"""What pools do to a session lock, checked on a real server (pg_locks read from a connection
of its own), and the helpers' answer: asyncpg's pool unlocks on release, SQLAlchemy's
QueuePool does not, a transaction-pooling PgBouncer of the registry is refused."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator

import psycopg
import pytest

from lockdiag.demo.cluster import Bouncer, Cluster, start_pgbouncer
from lockdiag.registry import Registry, parse_registry
from lockdiag.worker import (
    Event,
    PooledSession,
    asession_lock,
    axact_lock,
    session_lock,
    xact_lock,
)

from helpers.servers import held, url

RESOURCES = itertools.count(7000)
NAMESPACE = "[namespaces.tenant_summary]\nid = 4102\n"


def registry_of(text: str) -> Registry:
    parsed, problems = parse_registry(NAMESPACE + text)
    assert parsed is not None, problems
    return parsed


def test_asyncpg_pool_unlocks_on_release(cluster: Cluster) -> None:
    """Pool.release runs Connection.get_reset_query(): pg_advisory_unlock_all() among it. A
    plain asyncpg Connection keeps its session lock until it is closed."""
    import asyncpg

    resource, plain = next(RESOURCES), next(RESOURCES)

    async def scenario() -> None:
        async with asyncpg.create_pool(url(cluster.port), min_size=1, max_size=1) as pool:
            async with pool.acquire() as conn:
                await conn.execute(f"SELECT pg_advisory_lock(4102, {resource})")
                assert held(cluster, resource) == 1
            assert held(cluster, resource) == 0  # released to the pool: unlocked
        conn = await asyncpg.connect(url(cluster.port))
        await conn.execute(f"SELECT pg_advisory_lock(4102, {plain})")
        assert held(cluster, plain) == 1
        await conn.close()
        assert held(cluster, plain) == 0

    asyncio.run(scenario())


def test_sqlalchemy_queue_pool_keeps_a_session_lock_past_close(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """QueuePool's reset on return is a rollback: a session lock survives conn.close() and
    the next checkout (the same backend) holds it. session_lock's unlock, after the block
    closed the connection, fails, is counted and logged with what to do."""
    from sqlalchemy import create_engine, text

    resource, in_block = next(RESOURCES), next(RESOURCES)
    engine = create_engine(url(cluster.port).replace("postgresql", "postgresql+psycopg2"))
    try:
        conn = engine.connect()
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        conn.execute(text(f"SELECT pg_advisory_lock(4102, {resource})"))
        conn.close()  # back to the pool: rolled back, not unlocked
        assert held(cluster, resource) == 1
        with engine.connect() as again:
            assert again.execute(text("SELECT pg_backend_pid()")).scalar() == pid
            taken = again.execute(text(f"SELECT pg_try_advisory_lock(4102, {resource})"))
            assert taken.scalar() is True  # re-entrant: the next user "gets" the lock too
        events: list[Event] = []
        registry = registry_of("")
        conn = engine.connect()
        with caplog.at_level(logging.WARNING, "lockdiag.worker"):
            with session_lock(conn, "tenant_summary", in_block, registry=registry,
                              events=events.append):  # fmt: skip
                conn.close()  # a mistake: the lock goes back to the pool with the connection
            assert held(cluster, in_block) == 1
        assert [e.result for e in events if e.what == "release"] == ["error"]
        assert "QueuePool only rolls back on return" in caplog.text
    finally:
        engine.dispose()  # closes the pooled connections: their session locks end
    assert held(cluster, resource) == held(cluster, in_block) == 0


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Bouncer]:
    started = start_pgbouncer(cluster, str(request.param))
    yield started
    started.stop()


@pytest.mark.parametrize("driver", ["psycopg", "sqlalchemy", "asyncpg"])
def test_a_session_lock_through_transaction_pooling_is_refused(
    cluster: Cluster, bouncer: Bouncer, driver: str
) -> None:
    """A PgBouncer named in [poolers]: its console says which pool mode this connection's
    server connection is in. Transaction pooling refuses session_lock (xact_lock is fine
    there); session pooling allows it."""
    registry = registry_of(f"[poolers]\npgbouncer = [{bouncer.console_dsn()!r}]\n")
    resource = next(RESOURCES)
    refused = bouncer.mode == "transaction"

    def sync(conn: object) -> None:
        if refused:
            with (
                pytest.raises(PooledSession, match="transaction pooling") as error,
                session_lock(conn, "tenant_summary", resource, registry=registry),
            ):
                pytest.fail("taken")
            assert f"127.0.0.1:{bouncer.port}" in str(error.value)  # named, not by its DSN
            assert "dbname" not in str(error.value)
        else:
            with session_lock(conn, "tenant_summary", resource, registry=registry) as taken:
                assert taken and held(cluster, resource) == 1
        assert held(cluster, resource) == 0

    if driver == "psycopg":
        with psycopg.connect(bouncer.dsn(), autocommit=True, prepare_threshold=None) as conn:
            sync(conn)
            with conn.transaction():
                assert xact_lock(conn, "tenant_summary", resource, registry=registry)
    elif driver == "sqlalchemy":
        from sqlalchemy import create_engine

        engine = create_engine(
            url(bouncer.port).replace("postgresql", "postgresql+psycopg2"),
            isolation_level="AUTOCOMMIT",
        )
        with engine.connect() as sqlalchemy_conn:
            sync(sqlalchemy_conn)
        engine.dispose()
    else:
        import asyncpg

        async def scenario() -> None:
            conn = await asyncpg.connect(url(bouncer.port), statement_cache_size=0)
            try:
                if refused:
                    with pytest.raises(PooledSession, match="transaction pooling"):
                        async with asession_lock(conn, "tenant_summary", resource,
                                                 registry=registry):  # fmt: skip
                            pytest.fail("taken")
                else:
                    async with asession_lock(conn, "tenant_summary", resource,
                                             registry=registry) as taken:  # fmt: skip
                        assert taken and held(cluster, resource) == 1
                async with conn.transaction():
                    assert await axact_lock(conn, "tenant_summary", resource, registry=registry)
            finally:
                await conn.close()

        asyncio.run(scenario())
    assert held(cluster, resource) == 0


def test_a_pooler_address_of_unknown_mode_warns(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """[poolers] addresses: the server sees this session come from a pooler whose console
    cannot be read, so its mode is unknown: a warning, and the lock is taken."""
    registry = registry_of('[poolers]\naddresses = ["127.0.0.1"]\n')
    resource = next(RESOURCES)
    with (
        psycopg.connect(cluster.dsn(), autocommit=True) as conn,
        caplog.at_level(logging.WARNING, "lockdiag.worker"),
        session_lock(conn, "tenant_summary", resource, registry=registry) as taken,
    ):
        assert taken
    assert "pool mode is unknown" in caplog.text
    assert held(cluster, resource) == 0
