"""More well-known software, each checked by running it against PostgreSQL 15 and watching
pg_locks. Every expected key is computed here from the formula as the program's own source
writes it (file and line cited), and the triple seen in pg_locks during the real run is noted.
No test needs npm or the programs themselves."""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.catalogue import (
    FIXED,
    SOFTWARE,
    build_catalogue,
    dbos_background_key,
    name_keys,
    slonik_migrator_key,
)
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import Candidates

from helpers.servers import Sessions


def decoded(*numbers: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["decode", *numbers, "--format", "json"])
    assert result.exit_code == 0, result.output
    known: dict[str, Any] = json.loads(result.stdout)["known"]
    return known


def listed_known(cluster: Cluster, pid: int, *args: str) -> dict[tuple[int, ...], Any]:
    result = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return {
        tuple(lock["key"]): lock
        for lock in json.loads(result.stdout)["locks"]
        if lock["pid"] == pid
    }


def test_postgres_migrations() -> None:
    """postgres-migrations 5.3.0 (npm), dist/with-lock.js:11:
    ``SELECT pg_try_advisory_lock(-8525285245963000605)``. Seen during `migrate()` of a
    pg_sleep(3) migration: (2310019644, 3648988387, 1) granted, its holder active / idle in
    transaction running the migration itself."""
    key = -8525285245963000605
    assert from_bigint(key) == LockTriple(2310019644, 3648988387, 1)
    known = decoded(str(key))
    assert known["software"] == "postgres-migrations" and known["confidence"] == "exact"
    assert SOFTWARE["postgres-migrations"].runs


def slonik_source_formula(table: str) -> int:
    """@slonik/migrator 0.12.0 dist/index.js:59-63, advisoryLockId():
    hashable = '@slonik/migrator advisory lock:' + JSON.stringify(migrationTableName);
    parseInt(createHash('md5').update(hashable).digest('hex').slice(0, 8), 16)."""
    hashable = "@slonik/migrator advisory lock:" + json.dumps(table, separators=(",", ":"))
    return int(hashlib.md5(hashable.encode(), usedforsecurity=False).hexdigest()[:8], 16)


def test_slonik_migrator(tmp_path: Path) -> None:
    """The real `up()` printed advisoryLockId() 1230759186 for table "migration"; pg_locks
    showed (0, 1230759186, 1) on a pooled connection idle (no transaction) while pg_sleep(3)
    ran on another connection of the pool."""
    assert slonik_source_formula("migration") == 1230759186
    assert slonik_migrator_key("migration") == from_bigint(1230759186)
    known = decoded("1230759186")  # the README's table name is tried by default
    assert known["software"] == "@slonik/migrator"
    assert known["meaning"] == "migration lock (table migration)"
    other = slonik_source_formula("app_migrations")
    (tmp_path / "lockdiag.toml").write_text(
        '[known]\nslonik_migrator_tables = ["app_migrations"]\n'
    )
    result = CliRunner().invoke(
        cli, ["decode", str(other), "--registry", str(tmp_path / "lockdiag.toml")]
    )
    assert result.stdout.startswith("@slonik/migrator: migration lock (table app_migrations)")
    assert SOFTWARE["@slonik/migrator"].runs
    # an array name, as the option allows: JSON.stringify has no spaces
    assert slonik_migrator_key("x") != slonik_migrator_key('"x"')


def test_pgqueuer(cluster: Cluster, sessions: Sessions) -> None:
    """PgQueuer 1.6.0 (PyPI).

    - adapters/persistence/schema_plan.py:470-476, advisory_key(): ``zlib.crc32(
      settings.qualified.queue_table.encode())``, queue table "pgqueuer"; queries.py:135
      ``SELECT pg_advisory_lock($1)`` around `pgq upgrade`. Seen: (0, 2389487409, 1), holder
      idle, no transaction (session lock).
    - adapters/persistence/qb.py:776: ``pg_try_advisory_xact_lock(hashtext('<statistics
      table>'))`` in the worker's log aggregation. Seen: (4294967295, 3689802254, 1), holder
      active in a transaction (one statement).
    """
    upgrade = zlib.crc32(b"pgqueuer")
    assert upgrade == 2389487409
    known = decoded(str(upgrade))
    assert known["software"] == "PgQueuer upgrade" and known["confidence"] == "exact"
    worker = sessions.open("pgqueuer", autocommit=False)
    worker.run(
        "WITH guard AS (SELECT pg_try_advisory_xact_lock(hashtext('pgqueuer_statistics')) "
        "AS proceed) SELECT proceed FROM guard"
    )
    (lock,) = listed_known(cluster, worker.pid).values()
    assert lock["known"]["software"] == "PgQueuer"
    assert lock["known"]["meaning"] == "log aggregation lock"
    assert SOFTWARE["PgQueuer"].kind == "queue"


def test_saq(cluster: Cluster, sessions: Sessions) -> None:
    """SAQ 0.26.4 (PyPI), saq/queue/postgres.py:155 init_db ``pg_try_advisory_lock(
    %(key1)s, 0)`` and :365 sweep ``pg_try_advisory_lock(%(key1)s, hashtext(%(queue)s))``,
    key1 = saq_lock_keyspace (default 0); neither is ever unlocked. Seen with a worker of
    queue "default": (0, 0, 2) and (0, 822708183, 2), each on a pooled connection idle with no
    transaction while other pooled connections dequeued and ran the job; both stayed held."""
    worker = sessions.open("saq")
    worker.run("SELECT pg_try_advisory_lock(0, 0), pg_try_advisory_lock(0, hashtext('default'))")
    locks = listed_known(cluster, worker.pid)
    init, sweep = locks[(0, 0)], next(v for k, v in locks.items() if k != (0, 0))  # pairs
    assert init["known"]["software"] == "SAQ" and init["known"]["confidence"] == "guess"
    assert sweep["known"] == {
        "software": "SAQ", "meaning": "sweep lock of queue 'default'", "confidence": "derived"
    }  # fmt: skip
    assert sweep["key"][0] == 0 and len(sweep["key"]) == 2
    assert FIXED[from_pair(0, 0)].software == "SAQ"


def dbos_source_formula(name: str) -> int:
    """DBOS 3.4.0 dbos/_sys_db_postgres.py:176-178 (and _datasource_migration.py:113-118):
    ``int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def test_dbos(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """DBOS 3.4.0 (PyPI), app "lockdemo".

    - _sys_db_postgres.py:118,131 MIGRATION_LOCK_ID = 1234567890, ``pg_try_advisory_lock``
      on an AUTOCOMMIT connection. Seen: (0, 1234567890, 1), holder idle (no transaction)
      while another connection ran the migrations.
    - _sys_db_postgres.py:175-185 background_job_lock("background_jobs"), name
      f"dbos.background_job.{schema}.{app_name}.background_jobs", ``pg_try_advisory_xact_lock``.
      Seen: (355466456, 4275923244, 1), holder idle in transaction through each 1 s round
      while other connections ran the jobs, and taken again at once.
    - _datasource_migration.py:113-118,164: ``pg_advisory_xact_lock`` of
      "dbos.datasource_migrations.<schema>", schema "dbos" by default (from source only).
    """
    assert decoded("1234567890")["software"] == "DBOS"
    assert decoded("1234567890")["confidence"] == "guess"  # a round number others may pick
    background = dbos_source_formula("dbos.background_job.dbos.lockdemo.background_jobs")
    assert from_bigint(background) == LockTriple(355466456, 4275923244, 1)
    assert dbos_background_key("lockdemo") == from_bigint(background)
    datasource = from_bigint(dbos_source_formula("dbos.datasource_migrations.dbos"))
    assert FIXED[datasource].software == "DBOS" and FIXED[datasource].confidence == "exact"
    (tmp_path / "lockdiag.toml").write_text('[known]\ndbos_apps = ["lockdemo"]\n')
    holder = sessions.open("dbos", autocommit=False)
    holder.run(  # as DBOS takes it, then idle in transaction
        f"SELECT pg_try_advisory_xact_lock({background}) FROM set_config("
        "'idle_in_transaction_session_timeout', '5000', true)"
    )
    locks = listed_known(cluster, holder.pid, "--registry", str(tmp_path / "lockdiag.toml"))
    (lock,) = locks.values()
    assert lock["known"]["software"] == "DBOS background jobs"
    assert lock["known"]["meaning"] == "background jobs lock of application 'lockdemo'"
    assert "idle in transaction" in SOFTWARE["DBOS background jobs"].normal


def test_names_of_the_new_lists() -> None:
    keys = name_keys(slonik_tables=["migration"], dbos_apps=["lockdemo"])
    assert keys[from_bigint(1230759186)].software == "@slonik/migrator"
    assert keys[LockTriple(355466456, 4275923244, 1)].software == "DBOS background jobs"
    catalogue = build_catalogue(Candidates())
    assert catalogue.lookup(from_bigint(slonik_source_formula("migrations")), None) is not None
    assert catalogue.lookup(LockTriple(355466456, 4275923244, 1), None) is None  # not listed
