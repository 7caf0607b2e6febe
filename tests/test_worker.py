"""lockdiag.worker against a real server, with real concurrent workers, sync and async."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.registry import Registry, UnknownNamespace, load_registry, parse_registry
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

ROOT = Path(__file__).resolve().parent.parent
TEXT = (
    '[namespaces.tenant_summary]\nid = 4102\n[namespaces.nightly_export]\nid = 7\nform = "bigint"\n'
)


@pytest.fixture
def registry() -> Registry:
    parsed, _ = parse_registry(TEXT)
    assert parsed is not None
    return parsed


def held(cluster: Cluster, key: tuple[int, int, int]) -> int:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND (classid, objid, objsubid) = (%s, %s, %s)", key,
        ).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


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
        assert held(cluster, (4102, 2, 2)) == 0


def test_an_exception_releases_a_session_lock(cluster: Cluster, registry: Registry) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        with pytest.raises(RuntimeError), session_lock(conn, "tenant_summary", 3,
                                                       registry=registry) as taken:  # fmt: skip
            assert taken and held(cluster, (4102, 3, 2)) == 1
            raise RuntimeError("the job failed")
        assert held(cluster, (4102, 3, 2)) == 0
    with psycopg.connect(cluster.dsn()) as conn, conn.transaction():  # a failed statement
        with (
            pytest.raises(psycopg.errors.DivisionByZero),
            session_lock(conn, "tenant_summary", 4, registry=registry),
        ):
            conn.execute("SELECT 1 / 0")
        assert held(cluster, (4102, 4, 2)) == 0
        conn.execute("SELECT 1")  # the caller's transaction goes on


def test_a_session_lock_survives_rollback_and_is_released_on_exit(
    cluster: Cluster, registry: Registry
) -> None:
    with psycopg.connect(cluster.dsn()) as conn:
        with session_lock(conn, "tenant_summary", 5, registry=registry) as taken:
            assert taken
            conn.rollback()  # PostgreSQL's rule: a session lock ignores the transaction
            assert held(cluster, (4102, 5, 2)) == 1
        assert held(cluster, (4102, 5, 2)) == 0


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
                    results.append(held(cluster, (4102, 10, 2)))
                    raise RuntimeError("the job failed")
            results.append(held(cluster, (4102, 10, 2)))

            async def cancelled() -> None:
                async with asession_lock(auto, "tenant_summary", 11, registry=registry):
                    await asyncio.sleep(30)

            task = asyncio.create_task(cancelled())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            results.append(held(cluster, (4102, 11, 2)))
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
