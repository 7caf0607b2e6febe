"""Real PostgreSQL for the tests: one throwaway cluster per test run, real concurrent sessions.

If the server cannot start the run fails (an error in the fixture), it never skips. The
fixtures live here; the helpers the tests share are in ``helpers/`` (tests import them from
there, never from this file or from another test module).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from lockdiag.demo.cluster import Bouncer, Cluster, create_cluster, start_pgbouncer

from helpers.freezer import FreezingProxy
from helpers.servers import OBSERVER, OTHER_DB, PASSWORD, Sessions

# No wall-clock limit on an example, nor on generating one: a machine busy with other work
# takes seconds where a quiet one takes milliseconds, and the properties are about results.
settings.register_profile("lockdiag", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lockdiag")


@pytest.fixture(autouse=True)
def without_the_cycle_collector() -> Iterator[None]:
    """Each test runs as the commands do (``cli.main`` turns the cycle collector off): the
    analysis of 100k locks in a test's own process otherwise spends half its time rescanning
    objects that hold no cycle. On again after each test."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    server = create_cluster(
        settings={
            "max_locks_per_transaction": "256",
            "deadlock_timeout": "60s",
            "max_prepared_transactions": "4",
        },
        hba=["host all pw_user 127.0.0.1/32 scram-sha-256"],
    )
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {OBSERVER} LOGIN")
            admin.execute(f"CREATE ROLE pw_user LOGIN PASSWORD '{PASSWORD}'")
            admin.execute(f"CREATE DATABASE {OTHER_DB}")
            admin.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
            admin.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 10) g")
            admin.execute(f"GRANT SELECT, UPDATE ON items TO {OBSERVER}")
        yield server
    finally:
        server.destroy()


@pytest.fixture
def sessions(cluster: Cluster) -> Iterator[Sessions]:
    with Sessions(cluster) as helper:
        yield helper


@pytest.fixture
def transaction_pool(cluster: Cluster) -> Iterator[Bouncer]:
    """A real PgBouncer in transaction mode in front of the cluster (``Bouncer.dsn()``, and its
    admin console at ``console_dsn()``)."""
    bouncer = start_pgbouncer(cluster, "transaction")
    yield bouncer
    bouncer.stop()


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[FreezingProxy]:
    """A proxy in front of the cluster that freezes when told (``helpers/freezer.py``)."""
    with FreezingProxy(cluster.port) as frozen:
        yield frozen


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No registry, DSN or libpq setting of the developer's may leak into a test."""
    import os

    for name in list(os.environ):
        if name.startswith(("LOCKDIAG_", "PG")) and name != "LOCKDIAG_PG_BIN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
