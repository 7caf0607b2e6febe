"""Schedulers, workflow engines and leader election: one node holds a lock to lead or to run a
critical section, often for as long as it lives."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from lockdiag.core.catalogue.entry import Family, Known, Program, Signs, Software
from lockdiag.core.catalogue.formulas import signed64
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import KnownList


def dbos_key(name: str) -> LockTriple:
    """DBOS: the first 8 bytes of sha256(name), big-endian signed."""
    return from_bigint(signed64(hashlib.sha256(name.encode()).digest()))


def dbos_background_key(app: str, schema: str = "dbos") -> LockTriple:
    """DBOS _sys_db_postgres.py background_job_lock("background_jobs"), per application."""
    return dbos_key(f"dbos.background_job.{schema}.{app}.background_jobs")


def dbos_background_keys(apps: Iterable[str]) -> dict[LockTriple, Known]:
    return {
        dbos_background_key(app): Known(
            "DBOS background jobs", f"background jobs lock of application {app!r}", "derived"
        )
        for app in apps
    }


def tooz_key(name: str) -> LockTriple:
    """tooz's PostgresLock: the first two bytes of md5(name), passed as the two int4 keys."""
    digest = hashlib.md5(name.encode(), usedforsecurity=False).digest()
    return from_pair(digest[0], digest[1])


def tooz_keys(names: Iterable[str]) -> dict[LockTriple, Known]:
    """Only 65,536 keys: two names may share one, and any program's small pair may be one."""
    return {tooz_key(name): Known("tooz", f"lock {name!r}", "derived") for name in names}


_AIRFLOW = Signs(
    ("dag", "dag_run", "task_instance"),  # airflow/models: DagModel, DagRun, TaskInstance
    ("airflow",),
    re.compile(r"\b(?:dag_run|task_instance|serialized_dag|slot_pool)\b", re.IGNORECASE),
)

SCHEDULERS = Family(
    (
        # airflow/utils/db.py create_global_lock(DBLocks.MIGRATIONS): pg_advisory_lock(1) (with
        # lock_timeout 1800 ms), by initdb, upgradedb, resetdb and providers creating their
        # tables; DBLocks is an IntEnum: MIGRATIONS = 1, SCHEDULER_CRITICAL_SECTION = 2
        Program(
            "Apache Airflow",
            Software(
                "migration",
                "pg_advisory_lock",
                "held while airflow db migrate (or reset) runs, or while a provider (edge3, "
                "standard) creates its tables at start",
            ),
            guesses={from_bigint(1): "migrations lock (DBLocks.MIGRATIONS)"},
            signs=_AIRFLOW,
        ),
        # jobs/scheduler_job_runner.py _executable_task_instances_to_queued:
        # pg_try_advisory_xact_lock(DBLocks.SCHEDULER_CRITICAL_SECTION); a scheduler that does
        # not get it skips that loop
        Program(
            "Apache Airflow scheduler",
            Software(
                "scheduler",
                "pg_try_advisory_xact_lock",
                "held by one scheduler's transaction while it queues task instances; the other "
                "schedulers skip that loop",
            ),
            guesses={from_bigint(2): "critical section (DBLocks.SCHEDULER_CRITICAL_SECTION)"},
            signs=_AIRFLOW,
        ),
        Program(
            "Marten",
            Software(
                "scheduler",
                "pg_try_advisory_lock",
                "held by the node that applies schema changes or leads the daemon",
            ),
            exact={
                from_bigint(4004): "schema changes lock (ApplyChangesLockId)",
                from_bigint(41730001): "daemon lock (AdvisoryLockKey)",
            },
        ),
        # checked by running it against PostgreSQL 15 (tests/test_known_more.py)
        # _sys_db_postgres.py MIGRATION_LOCK_ID, a number other code may pick too;
        # _datasource_migration.py _migration_lock_key(schema), the default schema "dbos"
        Program(
            "DBOS",
            Software(
                "migration",
                "pg_try_advisory_lock",
                "held while DBOS migrates its system database, by an idle autocommit connection "
                "while the migrations run on another (application databases: one "
                "transaction's xact lock)",
                ending="does not stop the migrations running on DBOS's other connection, "
                "and the freed lock lets another process migrate at the same time",
                keeps_working=True,
            ),
            exact={
                dbos_key("dbos.datasource_migrations.dbos"): (
                    "migration lock of an application database (schema dbos)"
                )
            },
            guesses={from_bigint(1234567890): "system database migration lock"},
            # dbos/_schemas/system_database.py (schema dbos)
            signs=Signs(("workflow_status", "operation_outputs"), (), re.compile(r"\bdbos\.")),
        ),
        Program(
            "DBOS background jobs",
            Software(
                "scheduler",
                "pg_try_advisory_xact_lock",
                "held nearly all the time by one process of the application: its connection "
                "stays idle in transaction for each 1 s round (idle_in_transaction_session_"
                "timeout 5 s) while the jobs run on other connections, then takes the lock again",
            ),
            lists=(KnownList("dbos_apps", 'DBOS application names (config "name")'),),
            listed_keys=lambda candidates: dbos_background_keys(candidates.names("dbos_apps")),
        ),
        # tooz 9.1.0 tooz/drivers/pgsql.py PostgresLock: pg_advisory_lock(md5(name)[0],
        # md5(name)[1]) on a psycopg2 connection of its own, never autocommit: idle in
        # transaction while held
        Program(
            "tooz",
            Software(
                "library",
                "pg_advisory_lock",
                "held by one member of an OpenStack service for as long as it keeps its lock, on "
                "a connection of its own that stays idle in transaction the whole time (the "
                "driver's implicit transaction)",
                "check the member that holds it (its service's process and log) before acting: "
                "a timeout or a termination frees the lock while that member still believes it "
                "holds it, and another member takes it at once",
                keeps_working=True,
            ),
            lists=(KnownList("tooz", "lock names given to tooz get_lock()"),),
            listed_keys=lambda candidates: tooz_keys(candidates.names("tooz")),
        ),
    ),
)
