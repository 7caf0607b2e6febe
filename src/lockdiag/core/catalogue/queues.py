"""Job queues: a worker holds a lock while it runs a job or a maintenance step; the others skip
it or wait."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from lockdiag.core.catalogue.entry import (
    Family,
    Hashed,
    Hold,
    Known,
    Program,
    Rows,
    Signs,
    Software,
)
from lockdiag.core.catalogue.formulas import crc32, signed64
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import KnownList

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


def pg_boss_database_keys(database: str) -> dict[LockTriple, Known]:
    """pg-boss derives its keys from the database's name (v7-v9: md5, v10+: sha224)."""
    found = pg_boss_keys(database)
    digest = hashlib.md5(f"{database}.pgboss.pgboss".encode(), usedforsecurity=False).digest()
    found[from_bigint(signed64(digest))] = Known("pg-boss v7-v9", "maintenance lock", "derived")
    return found


def pg_boss_table_key(name: str) -> tuple[str, str]:
    """A row of pgboss.queue's table, ``<table>/<key name>``: its software and meaning."""
    table, _, lock = name.rpartition("/")
    return f"pg-boss {PG_BOSS_TABLE_KEYS.get(lock, 'v11+')}", f"{lock} lock of table {table}"


def goodjob_key(text: str) -> LockTriple:
    """GoodJob: ``('x' || substr(md5(key), 1, 16))::bit(64)::bigint``."""
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return from_bigint(signed64(digest))


# The enrichment query's parts (lockdiag.pg.capture runs those whose table is here and passes
# lockdiag.pg.trust): each reads its table alone and returns (name, key) rows.
# pg-boss v11+ locks each queue table's maintenance with pg_advisory_xact_lock(('x' ||
# encode(sha224((current_database() || '.pgboss.' || schema || table || key)::bytea),
# 'hex'))::bit(64)::bigint) (its plans.js advisoryLock()); the tables are
# pgboss.queue.table_name ("job_common", or "j<sha224>" for a partitioned queue)
PG_BOSS_ROWS = """
SELECT q.t || '/' || h.name, h.k
FROM (SELECT DISTINCT r.t FROM (SELECT table_name::text AS t FROM ONLY pgboss.queue
                                LIMIT %(row_limit)s) AS r) AS q
CROSS JOIN LATERAL (
    SELECT x.name, ('x' || pg_catalog.encode(pg_catalog.sha224(
                        (pg_catalog.current_database() || '.pgboss.pgboss' || q.t || x.name)
                        ::bytea), 'hex'))::bit(64)::bigint AS k
    FROM pg_catalog.unnest(ARRAY['failJobsByTimeout', 'deletion', 'failJobsByHeartbeat',
                                 'cleanupDependencies']) AS x(name)) AS h
WHERE h.k = ANY(%(keys)s::bigint[])
"""
# GoodJob locks ('x' || substr(md5(key), 1, 16))::bit(64) of 'good_jobs-<id>' for unfinished
# jobs (newest first), of each concurrency key, and of 'good_job_processes-<id>'
GOOD_JOB_ROWS = """
SELECT id::text, k
FROM (SELECT id, ('x' || pg_catalog.substr(pg_catalog.md5('good_jobs-' || id::text), 1, 16))
                 ::bit(64)::bigint AS k
      FROM ONLY public.good_jobs WHERE finished_at IS NULL ORDER BY created_at DESC
      LIMIT %(row_limit)s) AS j
WHERE k = ANY(%(keys)s::bigint[])
"""
GOOD_JOB_CONCURRENCY_ROWS = """
SELECT c, k
FROM (SELECT c, ('x' || pg_catalog.substr(pg_catalog.md5(c), 1, 16))::bit(64)::bigint AS k
      FROM (SELECT DISTINCT concurrency_key AS c FROM ONLY public.good_jobs
            WHERE finished_at IS NULL AND concurrency_key IS NOT NULL
            LIMIT %(row_limit)s) AS d) AS j
WHERE k = ANY(%(keys)s::bigint[])
"""
GOOD_JOB_PROCESS_ROWS = """
SELECT id::text, k
FROM (SELECT id, ('x' || pg_catalog.substr(pg_catalog.md5('good_job_processes-' || id::text),
                                           1, 16))::bit(64)::bigint AS k
      FROM ONLY public.good_job_processes LIMIT %(row_limit)s) AS p
WHERE k = ANY(%(keys)s::bigint[])
"""
_TIMESTAMP = ("timestamptz", "timestamp")
_TEXT = ("text", "varchar")
# Que locks the job id itself
QUE_ROWS = """
SELECT id::text, id::bigint FROM ONLY public.que_jobs WHERE id = ANY(%(keys)s::bigint[])
"""
# pgmq locks hashtext('pgmq.queue_' || queue_name)
PGMQ_ROWS = """
SELECT queue_name::text, pg_catalog.hashtext('pgmq.queue_' || queue_name)::bigint
FROM ONLY pgmq.meta LIMIT %(row_limit)s
"""
# dramatiq-pg locks each consumed message with int(sha256(queue_name ||
# message_id).hexdigest()[24:40], 16) - 2^63 (dramatiq_pg/broker.py message_lock()): hex digits
# 25-40 as a bigint with its top bit flipped; newest rows first
DRAMATIQ_ROWS = """
SELECT queue_name || '/' || message_id::text, k
FROM (SELECT queue_name, message_id,
             ('x' || pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(
                 pg_catalog.convert_to(queue_name || message_id::text, 'UTF8')), 'hex'), 25, 16))
             ::bit(64)::bigint # (-9223372036854775807 - 1) AS k
      FROM ONLY dramatiq.queue ORDER BY mtime DESC LIMIT %(row_limit)s) AS m
WHERE k = ANY(%(keys)s::bigint[])
"""


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
            database_keys=pg_boss_database_keys,  # every version's, from the database's name
        ),
        Program(
            "pg-boss v11+",
            Software(
                "queue",
                "pg_advisory_xact_lock",
                "held by one maintenance or queue transaction (lock_timeout 30s)",
            ),
            # src/plans.js locked(): SET LOCAL lock_timeout = 30000, then the lock (11 and 12,
            # run: tests/test_known.py)
            holds=(
                Hold(
                    "maintenance, queue changes",
                    ("pg_advisory_xact_lock",),
                    "waits",
                    note="a second transaction waits for the key, up to its lock_timeout of 30 s",
                ),
            ),
            rows=(
                Rows(
                    "pgboss.queue", {"table_name": _TEXT}, PG_BOSS_ROWS, describe=pg_boss_table_key
                ),
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
            rows=(
                Rows(
                    "public.good_jobs",
                    {"id": ("uuid",), "finished_at": _TIMESTAMP, "created_at": _TIMESTAMP},
                    GOOD_JOB_ROWS,
                    "job {name}",
                ),
                Rows(
                    "public.good_jobs",
                    {"finished_at": _TIMESTAMP, "concurrency_key": _TEXT},
                    GOOD_JOB_CONCURRENCY_ROWS,
                    "concurrency key {name!r}",
                ),
                Rows(
                    "public.good_job_processes",
                    {"id": ("uuid",)},
                    GOOD_JOB_PROCESS_ROWS,
                    "process {name}",
                ),
            ),
        ),
        Program(
            "Que",
            Software("queue", "pg_try_advisory_lock", "held while the job runs"),
            rows=(Rows("public.que_jobs", {"id": ("int8", "int4")}, QUE_ROWS, "job {name}"),),
        ),
        Program(
            "pgmq",
            Software("queue", "pg_advisory_xact_lock", "held by one queue transaction"),
            lists=(KnownList("pgmq_queues", "when pgmq.meta cannot be read"),),
            hashed=(Hashed("pgmq.queue_{name}", "queue {name!r}", listed="pgmq_queues"),),
            rows=(Rows("pgmq.meta", {"queue_name": _TEXT}, PGMQ_ROWS, "queue {name!r}"),),
            extension="pgmq",
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
            hashed=(Hashed(PGQUEUER_STATISTICS, "log aggregation lock", ("bigint",)),),
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
            # its sweep lock: (saq_lock_keyspace 0, hashtext(queue))
            hashed=(Hashed(SAQ_QUEUE, f"sweep lock of queue {SAQ_QUEUE!r}", ("pair-after-0",)),),
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
            rows=(
                Rows(
                    "dramatiq.queue",
                    {"queue_name": _TEXT, "message_id": ("uuid",), "mtime": _TIMESTAMP},
                    DRAMATIQ_ROWS,
                    "message {name}",
                ),
            ),
        ),
    ),
)
