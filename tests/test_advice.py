"""Advice that matches the evidence, each kind tested where it would be wrong: an idle session
proves only that it is idle, so ending it is offered only with evidence that its work is over
(a pooled connection with no client: proven; the registry's own rule broken: declared), and
never as the first step. Real sessions on a real server, and a real PgBouncer."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Bouncer, Cluster, start_pgbouncer

from conftest import Sessions

REGISTRY = """
[namespaces.report_runs]
id = 4500
expect = "any"

[namespaces.cart_sync]
id = 4501
expect = "xact"
"""
RAILS_SALT = 2053462845  # ActiveRecord's MIGRATOR_SALT
THRESHOLDS = ["--session-age", "100ms,1h", "--idle-age", "100ms,1h", "--wait-age", "100ms,1h"]


@pytest.fixture
def registry(tmp_path: Path) -> str:
    path = tmp_path / "advice.toml"
    path.write_text(REGISTRY)
    return str(path)


def check(cluster: Cluster, registry: str, *more: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        cli, ["check", "--dsn", cluster.dsn(), "--registry", registry, "--format", "json",
              *THRESHOLDS, *more],
    )  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def cause_of(document: dict[str, Any], pid: int) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in document["causes"] if c["pid"] == pid]
    assert found, json.dumps(document["causes"], indent=1)
    return found[0]


def who_holds(cluster: Cluster, registry: str, key: str) -> tuple[str, dict[str, Any]]:
    args = ["who-holds", "--key", key, "--dsn", cluster.dsn(), "--registry", registry]
    text = CliRunner().invoke(cli, args).stdout
    document: dict[str, Any] = json.loads(
        CliRunner().invoke(cli, [*args, "--format", "json"]).stdout
    )
    return text, document


def test_a_coordinator_whose_work_runs_on_another_connection_is_not_ended(
    cluster: Cluster, sessions: Sessions, registry: str
) -> None:
    """The coordinator keeps its lock on a dedicated idle connection while its work runs on
    another: the advice says its work may go on elsewhere, names the working session, and
    offers no terminate."""
    coordinator = sessions.open("report-coordinator")
    coordinator.run("SELECT pg_advisory_lock(4500, 1)")
    worker = sessions.open("report-coordinator")
    worker.start("SELECT pg_sleep(60)")
    waiter = sessions.open("report-coordinator-2")
    waiter.start("SELECT pg_advisory_lock(4500, 1)")
    sessions.waiting(waiter)
    time.sleep(0.3)  # past --session-age's warning level
    cause = cause_of(check(cluster, registry), coordinator.pid)
    assert cause["owner_done"]["level"] == "unknown", cause
    step = cause["next_step"]
    assert "proves only that it is idle" in step and "go on elsewhere" in step, step
    assert f"pid {worker.pid} active" in step, step  # the session that does the work
    assert "sport = :" in step, step  # how to find the owning process
    assert "terminate" not in step, step
    text, document = who_holds(cluster, registry, "4500,1")
    assert "whether its work is over: unknown" in text.splitlines()[0], text
    assert "outlived its work" not in text
    assert "terminate" not in (document["next_step"] or ""), document["next_step"]
    assert "SQL: SELECT pg_advisory_lock(4500, 1) (its holder's own query)" in text, text


def test_library_code_idle_between_two_statements_is_not_ended(
    cluster: Cluster, sessions: Sessions, registry: str
) -> None:
    """Library code idle between two statements inside its critical section, nobody else of
    that program connected: still no evidence that its work is over."""
    library = sessions.open("nightly-export")
    library.run("SELECT pg_advisory_lock(4500, 2)")
    library.run("SELECT count(*) FROM pg_class")  # the first statement of its critical section
    time.sleep(0.3)
    document = check(cluster, registry)
    cause = cause_of(document, library.pid)
    assert cause["kind"] == "session-lock"
    assert cause["owner_done"] == {
        "level": "unknown",
        "evidence": "the session is idle: that proves only that it is idle",
    }
    assert "no other session of nightly-export" in cause["next_step"], cause["next_step"]
    assert "terminate" not in cause["next_step"]
    plain = CliRunner().invoke(
        cli, ["check", "--dsn", cluster.dsn(), "--registry", registry, "--format", "plain",
              *THRESHOLDS],
    ).stdout  # fmt: skip
    assert "evidence that its work is over: unknown" in plain, plain


def test_a_stuck_owner_of_an_advisory_lock_gets_no_timeout(
    cluster: Cluster, sessions: Sessions, registry: str
) -> None:
    """Idle in transaction holding an advisory lock may be its design (a two-phase commit
    between its phases): a timeout would end its exclusion, so none is advised (more in
    test_exclusion.py)."""
    owner = sessions.open("cart-api", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4500, 3)")
    waiter = sessions.open("cart-api")
    waiter.start("SELECT pg_advisory_lock(4500, 3)")
    sessions.waiting(waiter)
    time.sleep(0.3)
    cause = cause_of(check(cluster, registry), owner.pid)
    assert cause["kind"] == "stuck-owner"
    step = cause["next_step"]
    assert "ALTER ROLE" not in step and "SET idle_in_transaction" not in step, step
    assert 'report_runs declares expect = "any" and no max_hold' in step, step
    assert "terminate" in step and "lockdiag terminate" not in step, step
    assert "(1 more wait for a lock)" in step, step  # its waiter is not its work


def test_a_broken_registry_rule_is_evidence_and_ending_comes_after_checking(
    cluster: Cluster, sessions: Sessions, registry: str
) -> None:
    """expect = "xact" and a certain session lock: declared. Ending it is offered, after the
    step that checks the owning process."""
    holder = sessions.open("cart-sync")
    holder.run("SELECT pg_advisory_lock(4501, 9)")
    time.sleep(0.3)
    document = check(cluster, registry)
    cause = cause_of(document, holder.pid)
    assert cause["owner_done"]["level"] == "declared", cause
    step = cause["next_step"]
    assert step.index("Check the owning process first") < step.index(
        f"lockdiag terminate {holder.pid}"
    ), step
    text, _ = who_holds(cluster, registry, "4501,9")
    assert 'cart_sync declares transaction-level locks (expect = "xact")' in text, text
    own = "SQL: SELECT pg_advisory_lock(4501, 9) (its holder's own query; cart_sync expects"
    assert own in text, text


def test_a_rails_migration_is_spoken_of_in_its_terms(
    cluster: Cluster, sessions: Sessions, registry: str
) -> None:
    """A Rails 7.1 migration: the lock Rails takes for db:migrate, on the migration's own
    connection, idle between two migrations. who-holds says whose lock it is and what holding
    it means, never "outlived its work"; no connection of its is said to be gone (it runs its
    migrations itself: test_programs.py has Rails 6.1's, on a connection of its own)."""
    migration = sessions.open("rails-migrate")
    (database,) = migration.run("SELECT current_database()")[0]
    key = RAILS_SALT * zlib.crc32(
        database.encode()
    )  # ActiveRecord::Migrator#generate_migrator_advisory_lock_id
    migration.run(f"SELECT pg_try_advisory_lock({key})")
    migration.run("SELECT count(*) FROM pg_class")  # a migration's statement
    time.sleep(0.3)
    text, _ = who_holds(cluster, registry, str(key))
    assert "session lock of Ruby on Rails" in text.splitlines()[0], text
    assert "outlived" not in text
    cause = cause_of(check(cluster, registry), migration.pid)
    assert "a Ruby on Rails migration is running, or died holding its lock" in cause["next_step"]
    assert "terminate" not in cause["next_step"]


@pytest.fixture
def transaction_pool(cluster: Cluster) -> Any:
    bouncer = start_pgbouncer(cluster, "transaction")
    yield bouncer
    bouncer.stop()


def test_a_lock_that_outlived_its_pooled_client_is_proven_and_may_be_ended(
    cluster: Cluster, transaction_pool: Bouncer, registry: str
) -> None:
    with psycopg.connect(
        transaction_pool.dsn(application_name="leaky-worker"), autocommit=True,
        prepare_threshold=None,
    ) as worker:  # fmt: skip
        row = worker.execute("SELECT pg_advisory_lock(4500, 7), pg_backend_pid()").fetchone()
        assert row is not None
        backend = int(row[1])
    try:
        time.sleep(0.3)
        document = check(cluster, registry, "--pgbouncer", transaction_pool.console_dsn())
        cause = cause_of(document, backend)
        assert cause["kind"] == "outlived-client"
        assert cause["owner_done"]["level"] == "proven", cause
        assert f"lockdiag terminate {backend}" in cause["next_step"]
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
