"""Job queues: a worker holds a lock while it runs a job or a maintenance step; the others skip
it or wait."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from lockdiag.core.catalogue.entry import Family, Known, Program, Signs, Software
from lockdiag.core.catalogue.formulas import crc32, signed64
from lockdiag.keys import LockTriple, from_bigint, from_pair

# pg-boss keys by the versions that take them (src/plans.js of 11.1, dist/plans.js of 12.x)
PG_BOSS_KEYS = {
    "create-queue": "v11+",
    "delete-queue": "v11+",
    "queue-stats": "v11+",
    "queue-stats-insert": "v12",
    "bamClaim": "v12",
}
# per table: <table> is a queue's pgboss.queue.table_name ("job_common" unless partitioned)
PG_BOSS_TABLE_KEYS = {
    "failJobsByTimeout": "v11+",
    "deletion": "v11+",
    "failJobsByHeartbeat": "v12",
    "cleanupDependencies": "v12",
}
PG_BOSS_TABLES = ("job_common", "job")  # the default table (v11+), the partitioned parent

# hashtext() names that PgQueuer and SAQ lock by default (pgqueuer adapters/persistence/qb.py
# build_aggregate_log_data_to_statistics_query; saq queue/postgres.py sweep, queue "default"):
# the server computes their keys
PGQUEUER_STATISTICS = "pgqueuer_statistics"
SAQ_QUEUE = "default"


def pg_boss_key(database: str, schema: str, name: str) -> int:
    """``('x' || encode(sha224((current_database() || '.pgboss.' || schema || name)::bytea),
    'hex'))::bit(64)::bigint``, as pg-boss's advisoryLock() computes it."""
    digest = hashlib.sha224(f"{database}.pgboss.{schema}{name}".encode()).digest()
    return signed64(digest)


def pg_boss_keys(
    database: str, schema: str = "pgboss", tables: Iterable[str] = PG_BOSS_TABLES
) -> dict[LockTriple, Known]:
    """pg-boss: the first 8 bytes of sha224(database + ".pgboss." + schema + key), signed."""

    def key(name: str) -> LockTriple:
        return from_bigint(pg_boss_key(database, schema, name))

    found = {
        key(""): Known(
            "pg-boss v10+",
            "schema lock (install and migrate; v10: maintenance too)",
            "derived",
        ),
    }
    for name, versions in PG_BOSS_KEYS.items():
        found[key(name)] = Known(f"pg-boss {versions}", f"'{name}' lock", "derived")
    for table in tables:
        for name, versions in PG_BOSS_TABLE_KEYS.items():
            found[key(f"{table}{name}")] = Known(
                f"pg-boss {versions}", f"{name} lock of table {table}", "derived"
            )
    return found


def database_keys(database: str) -> dict[LockTriple, Known]:
    """pg-boss derives its keys from the database's name (v7-v9: md5, v10+: sha224)."""
    found = pg_boss_keys(database)
    digest = hashlib.md5(f"{database}.pgboss.pgboss".encode(), usedforsecurity=False).digest()
    found[from_bigint(signed64(digest))] = Known("pg-boss v7-v9", "maintenance lock", "derived")
    return found


def goodjob_key(text: str) -> LockTriple:
    """GoodJob: ``('x' || substr(md5(key), 1, 16))::bit(64)::bigint``."""
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return from_bigint(signed64(digest))


QUEUES = Family(
    (
        Program(
            "pg-boss v7-v9",
            Software("queue", "pg_advisory_xact_lock", "held by one maintenance transaction"),
        ),
        Program(
            "pg-boss v10+",
            Software(
                "queue",
                "pg_advisory_xact_lock",
                "held while pg-boss installs or migrates its schema (v10: also by each "
                "maintenance transaction)",
            ),
        ),
        Program(
            "pg-boss v11+",
            Software(
                "queue",
                "pg_advisory_xact_lock",
                "held by one maintenance or queue transaction (lock_timeout 30s)",
            ),
        ),
        Program(
            "pg-boss v12",
            Software(
                "queue",
                "pg_advisory_xact_lock",
                "held by one maintenance, stats or claim transaction (lock_timeout 30s)",
            ),
        ),
        Program(
            "GoodJob",
            Software(
                "queue",
                "pg_try_advisory_lock",
                "held while a job or a process runs (concurrency keys: per transaction)",
            ),
        ),
        Program("Que", Software("queue", "pg_try_advisory_lock", "held while the job runs")),
        Program(
            "pgmq", Software("queue", "pg_advisory_xact_lock", "held by one queue transaction")
        ),
        # checked by running each one against PostgreSQL 15 (tests/test_known_more.py)
        # PgQueuer schema_plan.advisory_key: zlib.crc32 of the (qualified) queue table
        Program(
            "PgQueuer upgrade",
            Software(
                "migration",
                "pg_advisory_lock",
                "held for a whole pgq upgrade (statements one by one)",
            ),
            exact={from_bigint(crc32("pgqueuer")): "schema upgrade lock (queue table pgqueuer)"},
        ),
        Program(
            "PgQueuer",
            Software(
                "queue",
                "pg_try_advisory_xact_lock",
                "held by one worker's log-aggregation statement; the others skip it",
            ),
        ),
        # SAQ queue/postgres.py init_db: pg_try_advisory_lock(saq_lock_keyspace, 0), keyspace 0;
        # its default tables confirm it
        Program(
            "SAQ",
            Software(
                "queue",
                "pg_try_advisory_lock",
                "never released: the pooled connection that ran init_db, and the one whose "
                "worker won the sweep lock, keep it for the life of the connection while they "
                "sit idle in the pool or serve other queries",
            ),
            guesses={from_pair(0, 0): "init_db lock (saq_lock_keyspace 0, never released)"},
            signs=Signs(("saq_jobs", "saq_versions"), (), re.compile(r"\bsaq_(?:jobs|stats)\b")),
        ),
        # dramatiq-pg 0.12.0 dramatiq_pg/broker.py CONSUME_ONE and message_lock(): a session
        # lock per consumed message on the consumer connection (application_name "dramatiq-pg")
        Program(
            "dramatiq-pg",
            Software(
                "queue",
                "pg_try_advisory_lock",
                "held for each message a worker has consumed until the worker acks it, by the "
                "worker's consumer connection ('dramatiq-pg'), idle in autocommit between its "
                "polls",
                "check the dramatiq worker (its process, the message's row in dramatiq.queue) "
                "before acting: freeing the lock lets another worker consume the same message "
                "again",
            ),
            sessions={"dramatiq-pg": "consumer connection (a lock per consumed message)"},
        ),
    ),
    database_keys,
)
