"""A guessed name needs corroboration; the SQL: line comes from evidence; the naming advice
fits the key's structure. Real sessions on a real server, as the issue reproduced them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster

from helpers.cli import run
from helpers.servers import Sessions

AIRFLOW_DB = "airflow_meta"  # with the tables Airflow creates
OBJECTS_DB = "object_store"  # an object database's, with no Airflow table


@pytest.fixture(scope="module")
def databases(cluster: Cluster) -> Iterator[None]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        for name in (AIRFLOW_DB, OBJECTS_DB):
            admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(cluster.dsn(dbname=AIRFLOW_DB), autocommit=True) as setup:
        # as airflow db migrate creates them (airflow/models: DagModel, DagRun, TaskInstance)
        setup.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        setup.execute("CREATE TABLE dag (dag_id varchar(250) PRIMARY KEY)")
        setup.execute("CREATE TABLE dag_run (id serial PRIMARY KEY, dag_id varchar(250))")
        setup.execute("CREATE TABLE task_instance (id uuid PRIMARY KEY, dag_id varchar(250))")
    with psycopg.connect(cluster.dsn(dbname=OBJECTS_DB), autocommit=True) as setup:
        setup.execute("CREATE TABLE object_state (zoid bigint PRIMARY KEY, state bytea)")
    yield


def stdout_of(*args: str) -> str:
    result = run(*args)
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
    return result.stdout


def locks_of(cluster: Cluster, dbname: str, pid: int) -> dict[int, dict[str, Any]]:
    document = json.loads(
        stdout_of("list", "--dsn", cluster.dsn(dbname=dbname), "--format", "json")
    )
    return {lock["key"][0]: lock for lock in document["locks"] if lock["pid"] == pid}


def steps_of(cluster: Cluster, dbname: str, pid: int, *args: str) -> list[dict[str, Any]]:
    document = json.loads(
        stdout_of("check", "--dsn", cluster.dsn(dbname=dbname), "--format", "json",
            "--session-age", "0s", "--idle-age", "0s", "--wait-age", "0s", *args)
    )  # fmt: skip
    return [f for f in document["findings"] if f["pid"] == pid]


def who_holds(cluster: Cluster, dbname: str, key: str) -> str:
    return stdout_of("who-holds", "--key", key, "--dsn", cluster.dsn(dbname=dbname))


def sql_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if "SQL: " in line]
    return line.split("SQL: ", 1)[1]


def test_small_keys_without_airflow_are_only_could_be(
    cluster: Cluster, sessions: Sessions, databases: None
) -> None:
    """An object database's per-object locks on objects 1 and 2, in a database with no
    Airflow table: not named Airflow's, flagged unregistered, no advice in Airflow's terms,
    and the SQL: line is the holder's own call, not Airflow's."""
    store = sessions.open("RS: Store", dbname=OBJECTS_DB)
    store.run("SELECT pg_advisory_lock(1), pg_advisory_lock(2)")
    waiter = sessions.open("RS: Store", dbname=OBJECTS_DB)
    waiter.start("SELECT pg_advisory_lock(1)")
    sessions.waiting(waiter)
    locks = locks_of(cluster, OBJECTS_DB, store.pid)
    assert {k: v["known"]["confidence"] for k, v in locks.items()} == {1: "guess", 2: "guess"}
    assert all("unregistered" in lock["flags"] for lock in locks.values()), locks
    findings = steps_of(cluster, OBJECTS_DB, store.pid)
    assert findings, "the idle holder of a waited-for key gets findings"
    for finding in findings:
        assert "Airflow" not in finding["next_step"], finding
        assert "Airflow" not in finding["evidence"] or "could be" in finding["evidence"]
    unregistered = [f for f in findings if f["kind"] == "unregistered"]
    assert unregistered and unregistered[0]["next_step"].startswith("a small number"), findings
    text = who_holds(cluster, OBJECTS_DB, "1")
    assert "could be Apache Airflow" in text, text
    assert "migrations lock" not in text and "Airflow takes it" not in text, text
    assert sql_line(text) == "SELECT pg_advisory_lock(1) (its holder's own query)", text


def test_small_keys_with_airflow_tables_are_named(
    cluster: Cluster, sessions: Sessions, databases: None
) -> None:
    """The positive control: the same keys in a database with Airflow's tables; key 2 taken
    as Airflow's scheduler takes it, in a transaction left open."""
    migrate = sessions.open("migrate", dbname=AIRFLOW_DB)
    migrate.run("SELECT pg_advisory_lock(1)")
    scheduler = sessions.open("scheduler", dbname=AIRFLOW_DB, autocommit=False)
    scheduler.run("SELECT pg_try_advisory_xact_lock(2)")
    known = {
        key: lock["known"]
        for pid in (migrate.pid, scheduler.pid)
        for key, lock in locks_of(cluster, AIRFLOW_DB, pid).items()
    }
    assert known[1]["software"] == "Apache Airflow" and known[1]["confidence"] == "corroborated"
    assert known[2]["software"] == "Apache Airflow scheduler"
    assert known[2]["confidence"] == "corroborated"
    second = sessions.open("migrate-2", dbname=AIRFLOW_DB)
    second.start("SELECT pg_advisory_lock(1)")
    sessions.waiting(second)
    (step,) = {f["next_step"] for f in steps_of(cluster, AIRFLOW_DB, migrate.pid)}
    assert "Apache Airflow migration is running, or died" in step, step
    text = who_holds(cluster, AIRFLOW_DB, "2")
    assert "Apache Airflow scheduler: critical section" in text, text
    assert sql_line(text) == "SELECT pg_try_advisory_xact_lock(2) (its holder's own query)"
    scheduler.run("SELECT 1")  # its own query no longer shows the call
    assert sql_line(who_holds(cluster, AIRFLOW_DB, "2")) == (
        "SELECT pg_try_advisory_xact_lock(2) (as Apache Airflow scheduler takes it)"
    )


def test_a_session_corroborates_by_its_application_name(
    cluster: Cluster, sessions: Sessions, databases: None
) -> None:
    """Where the snapshot cannot see the tables (another database), the holder's own
    application_name can confirm the guess; any other name cannot."""
    named = sessions.open("airflow scheduler", dbname=OBJECTS_DB, autocommit=False)
    named.run("SELECT pg_try_advisory_xact_lock(2)")
    other = sessions.open("RS: Store", dbname="postgres")
    other.run("SELECT pg_advisory_lock(2)")
    assert locks_of(cluster, AIRFLOW_DB, named.pid)[2]["known"]["confidence"] == "corroborated"
    assert locks_of(cluster, AIRFLOW_DB, other.pid)[2]["known"]["confidence"] == "guess"


def test_negative_keys_sharing_a_high_word_get_that_id(
    cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("sentinels")
    holder.run("SELECT pg_advisory_lock(-1), pg_advisory_lock(-2)")
    (finding,) = [f for f in steps_of(cluster, "postgres", holder.pid)
                  if f["kind"] == "unregistered"]  # fmt: skip
    assert finding["next_step"] == (
        'name it in the registry file: [namespaces.NAME] id = -1, form = "bigint"'
    )
    assert finding["locks"] == 2


def test_an_enum_id_is_not_called_a_hash(cluster: Cluster, sessions: Sessions) -> None:
    holder = sessions.open("enum-locks")
    holder.run("SELECT pg_advisory_lock(4)")
    (finding,) = [f for f in steps_of(cluster, "postgres", holder.pid)
                  if f["kind"] == "unregistered"]  # fmt: skip
    step = finding["next_step"]
    assert step.startswith("a small number") and "not a hash" in step, step
    assert "most likely a hashed name" not in step and "id = 0" not in step, step


def test_little_endian_sha256_name_is_matched(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """django-pglock (not django-pglocks) reads the sha256 digest little-endian."""
    registry = tmp_path / "lockdiag.toml"
    registry.write_text('[known]\ndjango_pglocks = ["billing.close_day"]\n')
    key = int.from_bytes(hashlib.sha256(b"billing.close_day").digest()[:8], "little", signed=True)
    holder = sessions.open("django")
    holder.run(f"SELECT pg_advisory_lock({key})")
    document = json.loads(
        stdout_of("list", "--dsn", cluster.dsn(), "--format", "json", "--registry", str(registry))
    )
    (lock,) = [lock for lock in document["locks"] if lock["pid"] == holder.pid]
    assert lock["known"] == {
        "software": "django-pglock", "meaning": "lock 'billing.close_day'", "confidence": "derived"
    }  # fmt: skip
    assert lock["flags"] == []


def test_sql_line_is_the_holders_own_call(cluster: Cluster, sessions: Sessions) -> None:
    """A holder whose own query, on screen, is SELECT pg_advisory_lock(253, 16): the SQL:
    line says that call, and the naming advice proposes no id for a digest's bytes."""
    holder = sessions.open("md5-pairs")
    holder.run("SELECT pg_advisory_lock(253, 16)")
    text = who_holds(cluster, "postgres", "253,16")
    assert sql_line(text) == "SELECT pg_advisory_lock(253, 16) (its holder's own query)", text
    assert "pg_try_advisory_xact_lock" not in text
    (finding,) = [f for f in steps_of(cluster, "postgres", holder.pid)
                  if f["kind"] == "unregistered"]  # fmt: skip
    assert "id = 253" not in finding["next_step"], finding
    assert finding["next_step"].startswith("a pair of two byte-sized numbers"), finding
    holder.run("SELECT 1")  # nothing seen says how it was taken, and no software
    text = who_holds(cluster, "postgres", "253,16")
    assert sql_line(text).startswith("SELECT pg_advisory_lock(253, 16) (as held now"), text
