"""The catalogue of advisory keys that well-known software takes.

Formulas and constants come from each project's source (see the README's table and
``tests/test_known.py`` for the checked example values). A registry namespace always wins over
the catalogue, and the catalogue over a plugin's entries (:mod:`lockdiag.plugins`). Five
confidences:

- ``exact``: a fixed key that the software uses, recognisable from the triple alone;
- ``derived``: computed from the lock's database name, the software's rows or a listed name;
- ``corroborated``: a guess that its database or its sessions confirm (:data:`SIGNS`);
- ``guess``: a small number that many programs could use (Airflow's 1 and 2), and nothing
  seen confirms it: it names nothing ("could be Apache Airflow"), and no advice speaks in that
  software's terms;
- ``plugin``: declared by an installed plugin, lockdiag has not checked it.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from typing import Literal

from lockdiag import plugins
from lockdiag.core.model import DerivedKey, Session, Snapshot
from lockdiag.keys import (
    PAIR_SUBID,
    LockTriple,
    from_bigint,
    from_pair,
    split_namespace,
    to_int4,
    to_uint4,
)
from lockdiag.registry import Candidates, Namespace, Registry

Confidence = Literal["exact", "derived", "corroborated", "guess", "plugin"]


SoftwareKind = plugins.Kind


@dataclass(frozen=True)
class Software:
    """How a piece of software takes its advisory locks, and what is normal for it."""

    kind: SoftwareKind
    function: str  # the lock function it calls, as lockdiag key --function spells it
    normal: str  # one sentence: what holding the lock means for it
    check: str = ""  # what to look at before acting, in its own terms (else its process)

    @property
    def runs(self) -> bool:
        """A migration or a deploy: ending its session mid-run can leave its record of applied
        changes out of step with the schema."""
        return self.kind in ("migration", "deploy")


# from each project's source (see known-locks.md); the key is Known.software
SOFTWARE: dict[str, Software] = {
    "Prisma Migrate": Software("migration", "pg_advisory_lock", "held for the whole migrate run"),
    "Sqitch": Software(
        "deploy", "pg_try_advisory_lock",
        "held for the whole deploy, while Sqitch's own connection stays idle in transaction "
        "(LOCK TABLE changes) and psql applies each change in another backend",
    ),
    "goose": Software("migration", "pg_try_advisory_lock", "held for the whole migration run"),
    # src/runner.ts lock(): pg_try_advisory_lock(PG_MIGRATE_LOCK_ID)
    "node-pg-migrate": Software("migration", "pg_try_advisory_lock", "held for the whole run"),
    # PostgresAdapter.acquireMigrationLock: in the run's transaction (transactional DDL)
    "Kysely": Software("migration", "pg_advisory_xact_lock",
                       "held by the migration run's transaction"),
    "Marten": Software("scheduler", "pg_try_advisory_lock",
                       "held by the node that applies schema changes or leads the daemon"),
    "liquibase-sessionlock": Software("migration", "pg_try_advisory_lock",
                                      "held for the whole update"),
    # airflow/utils/db.py create_global_lock(DBLocks.MIGRATIONS): pg_advisory_lock(1) (with
    # lock_timeout 1800 ms), by initdb, upgradedb, resetdb and providers creating their tables
    "Apache Airflow": Software(
        "migration", "pg_advisory_lock",
        "held while airflow db migrate (or reset) runs, or while a provider (edge3, standard) "
        "creates its tables at start",
    ),
    # jobs/scheduler_job_runner.py _executable_task_instances_to_queued: pg_try_advisory_xact_lock
    # (DBLocks.SCHEDULER_CRITICAL_SECTION); a scheduler that does not get it skips that loop
    "Apache Airflow scheduler": Software(
        "scheduler", "pg_try_advisory_xact_lock",
        "held by one scheduler's transaction while it queues task instances; the other "
        "schedulers skip that loop",
    ),
    "Ruby on Rails": Software("migration", "pg_try_advisory_lock",
                              "held for the whole db:migrate"),
    "sqlx": Software("migration", "pg_advisory_lock", "held for the whole migrate run"),
    "golang-migrate": Software("migration", "pg_advisory_lock", "held for the whole run"),
    "Flyway": Software("migration", "pg_try_advisory_xact_lock",
                       "held by each migration's transaction"),
    "pg-boss v7-v9": Software("queue", "pg_advisory_xact_lock",
                              "held by one maintenance transaction"),
    "pg-boss v10+": Software("queue", "pg_advisory_xact_lock",
                             "held while pg-boss installs or migrates its schema (v10: also by "
                             "each maintenance transaction)"),
    "pg-boss v11+": Software("queue", "pg_advisory_xact_lock",
                             "held by one maintenance or queue transaction (lock_timeout 30s)"),
    "pg-boss v12": Software("queue", "pg_advisory_xact_lock",
                            "held by one maintenance, stats or claim transaction "
                            "(lock_timeout 30s)"),
    "pg_repack": Software(
        "extension", "pg_try_advisory_lock",
        "held by pg_repack's main connection for the whole repack of one table, while its "
        "second connection stays idle in transaction on purpose (ACCESS SHARE on the table) "
        "until older transactions end",
        "check the repack (the pg_repack process, its output: 'Waiting for N transactions to "
        "finish' names the oldest pid) before acting; a pg_repack killed mid-run leaves its "
        "trigger repack_trigger and its table repack.log_<oid> behind (drop them, or DROP "
        "EXTENSION pg_repack CASCADE and create it again)",
    ),
    "graphile-migrate": Software("migration", "pg_try_advisory_lock",
                                 "held for the whole migrate run (and each migration it runs)"),
    "GoodJob": Software("queue", "pg_try_advisory_lock",
                        "held while a job or a process runs (concurrency keys: per transaction)"),
    "Que": Software("queue", "pg_try_advisory_lock", "held while the job runs"),
    "pgmq": Software("queue", "pg_advisory_xact_lock", "held by one queue transaction"),
    "pg_partman": Software("extension", "pg_try_advisory_xact_lock",
                           "held by one maintenance call (some calls take session locks)"),
    "with_advisory_lock": Software("library", "pg_advisory_lock",
                                   "held around a block of the application's code"),
    "django-pglocks": Software("library", "pg_advisory_lock",
                               "held around a block of the application's code"),
    "pals": Software("library", "pg_advisory_lock",
                     "held around a block of the application's code"),
    "advisory-lock (npm)": Software("library", "pg_advisory_lock",
                                    "held around a block of the application's code"),
    "@medusajs/locking-postgres": Software("library", "pg_advisory_xact_lock",
                                           "held by one transaction of the application"),
    # checked by running each one against PostgreSQL 15 (tests/test_known_more.py)
    "postgres-migrations": Software(
        "migration", "pg_try_advisory_lock",
        "held for the whole migrate run by the connection that runs each migration in a "
        "transaction of its own",
    ),
    "@slonik/migrator": Software(
        "migration", "pg_advisory_lock",
        "held for the whole up or down by one pooled connection that stays idle while the "
        "migrations run on another connection of the pool",
    ),
    "PgQueuer upgrade": Software("migration", "pg_advisory_lock",
                                 "held for a whole pgq upgrade (statements one by one)"),
    "PgQueuer": Software("queue", "pg_try_advisory_xact_lock",
                         "held by one worker's log-aggregation statement; the others skip it"),
    "SAQ": Software(
        "queue", "pg_try_advisory_lock",
        "never released: the pooled connection that ran init_db, and the one whose worker won "
        "the sweep lock, keep it for the life of the connection while they sit idle in the "
        "pool or serve other queries",
    ),
    "DBOS": Software(
        "migration", "pg_try_advisory_lock",
        "held while DBOS migrates its system database, by an idle autocommit connection while "
        "the migrations run on another (application databases: one transaction's xact lock)",
    ),
    "DBOS background jobs": Software(
        "scheduler", "pg_try_advisory_xact_lock",
        "held nearly all the time by one process of the application: its connection stays "
        "idle in transaction for each 1 s round (idle_in_transaction_session_timeout 5 s) "
        "while the jobs run on other connections, then takes the lock again",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Known:
    software: str
    meaning: str
    confidence: Confidence
    plugin: str | None = None  # the plugin that declared it (confidence "plugin")
    declared: Software | None = None  # a plugin's software: SOFTWARE names built-ins only
    evidence: str = ""  # what confirmed a guess (confidence "corroborated")

    @property
    def names(self) -> bool:
        """Whether it names the lock: a guess nothing confirms only says what it could be."""
        return self.confidence != "guess"

    @property
    def label(self) -> str:
        if self.plugin is not None:
            return f"{self.software}: {self.meaning} (declared by plugin {self.plugin})"
        if self.confidence == "guess":  # no claim about what it does
            return f"could be {self.software}"
        return f"{self.software}: {self.meaning}"

    @property
    def behaviour(self) -> Software | None:
        """How its software behaves, for advice in its terms; none for a mere guess."""
        if self.confidence == "guess":
            return None
        return self.declared or SOFTWARE.get(self.software)


@dataclass(frozen=True)
class Signs:
    """What confirms a guess-level key of one software: its tables in the lock's database
    (all of them), an application_name it sets (a prefix), or its own words in the query text
    of a session on the key. A software with guess keys and no signs stays "could be"."""

    tables: tuple[str, ...] = ()
    applications: tuple[str, ...] = ()
    query: re.Pattern[str] | None = None


_AIRFLOW = Signs(
    ("dag", "dag_run", "task_instance"),  # airflow/models: DagModel, DagRun, TaskInstance
    ("airflow",),
    re.compile(r"\b(?:dag_run|task_instance|serialized_dag|slot_pool)\b", re.IGNORECASE),
)
SIGNS: dict[str, Signs] = {
    "Apache Airflow": _AIRFLOW,
    "Apache Airflow scheduler": _AIRFLOW,
    # dbos/_schemas/system_database.py (schema dbos); saq/queue/postgres.py's default tables
    "DBOS": Signs(("workflow_status", "operation_outputs"), (), re.compile(r"\bdbos\.")),
    "SAQ": Signs(("saq_jobs", "saq_versions"), (), re.compile(r"\bsaq_(?:jobs|stats)\b")),
    # RelStorage 4.3.0: tables of both schemas, its connections' names ("RS: Store", "RS: Load")
    "RelStorage": Signs(
        ("object_state", "commit_row_lock"),
        ("rs: ",),
        re.compile(r"\b(?:lock_objects_and_detect_conflicts|lock_and_choose_tid)\b"),
    ),
}
# the tables the snapshot looks for in the connected database (one catalog read)
SIGN_TABLES = sorted({table for signs in SIGNS.values() for table in signs.tables})
QUERY_PREFIX = 4096  # characters of a query searched for a software's words


def corroboration(
    known: Known, database: str, tables: Collection[str] | None, sessions: Iterable[Session]
) -> str:
    """What confirms a guess in one database ("" when nothing does): its software's tables
    there (``tables``: None when the snapshot could not see that database's), or a session
    that holds or waits for the key naming that software (application_name, query text)."""
    signs = SIGNS.get(known.software)
    if signs is None:
        return ""
    if tables is not None and signs.tables and set(signs.tables) <= set(tables):
        return f"its tables {', '.join(signs.tables)} are in database {database}"
    for session in sessions:
        app = (session.application_name or "").lower()
        if signs.applications and app.startswith(signs.applications):
            return f"its holder's application_name is {session.application_name!r}"
        query = (session.query or "")[:QUERY_PREFIX]
        found = signs.query.search(query) if signs.query is not None else None
        if found is not None:
            return f"its holder's query names {found.group(0)}"
    return ""


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit signed overflow)."""
    value = 0
    encoded = text.encode("utf-16-be")
    for index in range(0, len(encoded), 2):
        value = (31 * value + int.from_bytes(encoded[index : index + 2], "big")) & 0xFFFFFFFF
    return to_int4(value)


def crc32(text: str) -> int:
    return zlib.crc32(text.encode())


def _signed64(digest: bytes, endian: str = ">") -> int:
    (value,) = struct.unpack(f"{endian}q", digest[:8])
    return int(value)


FIXED: dict[LockTriple, Known] = {
    from_bigint(72707369): Known("Prisma Migrate", "migration lock", "exact"),
    from_bigint(75474063): Known("Sqitch", "deploy lock", "exact"),
    from_bigint(4097083626): Known("goose", "migration lock (session locker)", "exact"),
    from_bigint(7241865325823964): Known("node-pg-migrate", "migration lock", "exact"),
    from_bigint(3853314791062309107): Known("Kysely", "migration lock", "exact"),
    from_bigint(4004): Known("Marten", "schema changes lock (ApplyChangesLockId)", "exact"),
    from_bigint(41730001): Known("Marten", "daemon lock (AdvisoryLockKey)", "exact"),
    from_pair(java_hash("databasechangeloglock"), java_hash("public")): Known(
        "liquibase-sessionlock", "changelog lock (schema public)", "exact"
    ),
    # airflow/utils/db.py DBLocks, an IntEnum: MIGRATIONS = 1, SCHEDULER_CRITICAL_SECTION = 2
    from_bigint(1): Known("Apache Airflow", "migrations lock (DBLocks.MIGRATIONS)", "guess"),
    from_bigint(2): Known(
        "Apache Airflow scheduler", "critical section (DBLocks.SCHEDULER_CRITICAL_SECTION)", "guess"
    ),
    # postgres-migrations dist/with-lock.js: pg_try_advisory_lock(-8525285245963000605)
    from_bigint(-8525285245963000605): Known("postgres-migrations", "migration lock", "exact"),
    # PgQueuer schema_plan.advisory_key: zlib.crc32 of the (qualified) queue table, "pgqueuer"
    from_bigint(crc32("pgqueuer")): Known(
        "PgQueuer upgrade", "schema upgrade lock (queue table pgqueuer)", "exact"
    ),
    # DBOS _sys_db_postgres.py MIGRATION_LOCK_ID; a number other code may pick too
    from_bigint(1234567890): Known("DBOS", "system database migration lock", "guess"),
    # SAQ queue/postgres.py init_db: pg_try_advisory_lock(saq_lock_keyspace, 0), keyspace 0
    from_pair(0, 0): Known("SAQ", "init_db lock (saq_lock_keyspace 0, never released)", "guess"),
    # "GRAPHILE MIGRATE" on a phone keypad (graphile-migrate src/pgReal.ts, ADVISORY_LOCK_MIGRATE)
    from_bigint(4727445306447283): Known("graphile-migrate", "migration lock", "exact"),
}

FLYWAY_BASE = 77431708279161  # "Flyway" in ASCII: 0x466C79776179
FLYWAY_CLASSIDS = range(18027, 18030)  # FLYWAY_BASE + any int4, in the high 32 bits
# pg-boss keys by the versions that take them (src/plans.js of 11.1, dist/plans.js of 12.x)
PG_BOSS_KEYS = {"create-queue": "v11+", "delete-queue": "v11+", "queue-stats": "v11+",
                "queue-stats-insert": "v12", "bamClaim": "v12"}  # fmt: skip
# per table: <table> is a queue's pgboss.queue.table_name ("job_common" unless partitioned)
PG_BOSS_TABLE_KEYS = {"failJobsByTimeout": "v11+", "deletion": "v11+",
                      "failJobsByHeartbeat": "v12", "cleanupDependencies": "v12"}  # fmt: skip
PG_BOSS_TABLES = ("job_common", "job")  # the default table (v11+), the partitioned parent
# pg_repack's pg_try_advisory_lock(REPACK_LOCK_PREFIX, table OID - 2^31) (pg_repack bin/pg_repack.c)
REPACK_LOCK_PREFIX = 16185446


def database_keys(database: str) -> dict[LockTriple, Known]:
    """Keys that software derives from the database name (computed per database)."""
    found: dict[LockTriple, Known] = {}
    checksum = crc32(database)
    found[from_bigint(2053462845 * checksum)] = Known(
        "Ruby on Rails", f"migration lock of database {database}", "derived"
    )
    found[from_bigint(1026731422 * checksum)] = Known(
        "sqlx", f"migration lock of database {database}", "derived"
    )
    for name in (database, "/" + database):  # opened from a URL, the driver keeps the "/"
        key = (crc32(f"public\x00schema_migrations\x00{name}") * 1486364155) % 2**32
        found[from_bigint(key)] = Known(
            "golang-migrate", f"migration lock of database {database}", "derived"
        )
    found[grafana_key(database)] = Known(
        "Grafana", f"migration lock of database {database}", "derived"
    )
    found.update(pg_boss_keys(database))
    digest = hashlib.md5(f"{database}.pgboss.pgboss".encode(), usedforsecurity=False).digest()
    found[from_bigint(_signed64(digest))] = Known("pg-boss v7-v9", "maintenance lock", "derived")
    return found


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


def pg_boss_key(database: str, schema: str, name: str) -> int:
    """``('x' || encode(sha224((current_database() || '.pgboss.' || schema || name)::bytea),
    'hex'))::bit(64)::bigint``, as pg-boss's advisoryLock() computes it."""
    digest = hashlib.sha224(f"{database}.pgboss.{schema}{name}".encode()).digest()
    return _signed64(digest)


def collisions(namespace: Namespace, guesses: bool = True) -> list[str]:
    """Well-known software keys that fall inside a namespace of the team (with ``guesses``
    False, only the keys that name a lock by themselves: a guess is a number others use)."""
    found = [
        f"namespace {namespace.name!r} contains the key {triple.describe()} that "
        f"{known.software} uses ({known.meaning})"
        for triple, known in FIXED.items()
        if triple.form == namespace.form
        and split_namespace(triple)[0] == namespace.id
        and (guesses or known.names)
    ]
    if namespace.form == "bigint" and namespace.id in FLYWAY_CLASSIDS:
        found.append(
            f"namespace {namespace.name!r} covers the keys of Flyway's migration lock "
            f"(high 32 bits {min(FLYWAY_CLASSIDS)}..{max(FLYWAY_CLASSIDS)})"
        )
    found += [
        f"namespace {namespace.name!r} contains the {key.describe()} that {known.software} "
        f"uses ({known.meaning}, declared by plugin {known.plugin})"
        for key, known in plugin_keys().declared
        if _in_namespace(key, namespace)
    ]
    return found


def _in_namespace(key: plugins.Key, namespace: Namespace) -> bool:
    if key.form == "space":
        return namespace.form == "pair" and key.numbers[0] == namespace.id
    triple = key.triple
    return triple.form == namespace.form and split_namespace(triple)[0] == namespace.id


def flyway_key(schema: str, table: str = "flyway_schema_history") -> LockTriple:
    return from_bigint(FLYWAY_BASE + java_hash(f'"{schema}"."{table}"'))


def flyway_keys(schemas: Iterable[str]) -> dict[LockTriple, Known]:
    return {
        flyway_key(schema): Known("Flyway", f"migration lock of schema {schema}", "derived")
        for schema in schemas
    }


def medusa_hash(name: str) -> int:
    """@medusajs/locking-postgres: h = 5381; from the last character to the first,
    h = (h * 33) ^ code, as an unsigned 32-bit number (JavaScript's ``h >>> 0``)."""
    value = 5381
    for character in reversed(name.encode("utf-16-be").decode("utf-16-be")):
        value = ((value * 33) ^ ord(character)) & 0xFFFFFFFF
    return value


def name_keys(
    with_advisory_lock: Iterable[str] = (),
    with_advisory_lock_prefix: int = 0,
    django_pglocks: Iterable[str] = (),
    pals: Iterable[str] = (),
    advisory_lock_npm: Iterable[str] = (),
    medusa: Iterable[str] = (),
    slonik_tables: Iterable[str] = (),
    dbos_apps: Iterable[str] = (),
) -> dict[LockTriple, Known]:
    """Keys of names the team lists as candidates, for libraries that hash names in Python,
    Ruby or JavaScript in ways Python can repeat (CRC-32, SHA-1, SHA-256, djb2, MD5). A name
    listed for a library that hashes with a digest is also tried with every other common
    digest and byte order (:func:`digest_keys`): helpers differ only in those."""
    found: dict[LockTriple, Known] = {}
    for table in slonik_tables:
        found[slonik_migrator_key(table)] = Known(
            "@slonik/migrator", f"migration lock (table {table})", "derived"
        )
    for app in dbos_apps:
        found[dbos_background_key(app)] = Known(
            "DBOS background jobs", f"background jobs lock of application {app!r}", "derived"
        )
    for name in medusa:
        found[from_bigint(medusa_hash(name))] = Known(
            "@medusajs/locking-postgres", f"lock {name!r}", "derived"
        )
    for name in with_advisory_lock:
        key = from_pair(crc32(name) & 0x7FFFFFFF, with_advisory_lock_prefix & 0x7FFFFFFF)
        found[key] = Known("with_advisory_lock", f"lock {name!r}", "derived")
    for name in django_pglocks:
        found[from_bigint(to_int4(crc32(name)))] = Known(
            "django-pglocks", f"lock {name!r} (1.0.x)", "derived"
        )
    for name in dict.fromkeys((*django_pglocks, *pals, *advisory_lock_npm)):
        for triple, known in digest_keys(name).items():
            found.setdefault(triple, known)
    return found


Shape = Literal["bigint", "int4", "pair"]
# helpers that hash a name with a common digest, by digest, byte order and key shape (from
# their source): the other combinations are named by what they compute
DIGEST_HELPERS: dict[tuple[str, str, Shape], str] = {
    ("sha256", "big", "bigint"): "django-pglocks",  # 2.x and django-pgware: [:8], "big"
    ("sha256", "little", "bigint"): "django-pglock",  # Opus10's: [:8], "little", signed
    ("sha1", "little", "bigint"): "pals",  # struct.unpack("<q", sha1(...)[:8])
    ("sha256", "little", "pair"): "advisory-lock (npm)",  # readInt32LE(0), readInt32LE(4)
}
DIGESTS = ("sha256", "sha1", "md5")


def digest_keys(name: str) -> dict[LockTriple, Known]:
    """The keys a helper makes of ``name`` with sha256, sha1 or md5: the first 8 bytes as a
    bigint, the first 4 as an int4 (passed as a bigint), or the first 8 as two int4 (a pair),
    each read big-endian and little-endian, signed."""
    found: dict[LockTriple, Known] = {}
    for algorithm in DIGESTS:
        digest = hashlib.new(algorithm, name.encode(), usedforsecurity=False).digest()
        for order in ("big", "little"):
            endian = ">" if order == "big" else "<"
            first, second = struct.unpack(f"{endian}ii", digest[:8])
            keys: dict[Shape, LockTriple] = {
                "bigint": from_bigint(_signed64(digest, endian)),
                "int4": from_bigint(first),
                "pair": from_pair(first, second),
            }
            for shape, triple in keys.items():
                helper = DIGEST_HELPERS.get((algorithm, order, shape))
                meaning = f"lock {name!r}"
                if helper is None:
                    helper, meaning = (
                        "hashed name",
                        f"{name!r} ({algorithm}, {order}-endian {shape})",
                    )
                found.setdefault(triple, Known(helper, meaning, "derived"))
    return found


# @slonik/migrator has no default migrationTableName; its README uses "migration"
SLONIK_TABLES = ("migration", "migrations")


def slonik_migrator_key(table: str) -> LockTriple:
    """@slonik/migrator dist/index.js advisoryLockId(): ``parseInt(md5('@slonik/migrator
    advisory lock:' + JSON.stringify(table)).hex.slice(0, 8), 16)``, an unsigned 32-bit bigint."""
    text = "@slonik/migrator advisory lock:" + json.dumps(
        table, ensure_ascii=False, separators=(",", ":")
    )
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return from_bigint(int.from_bytes(digest[:4], "big"))


def dbos_key(name: str) -> LockTriple:
    """DBOS: the first 8 bytes of sha256(name), big-endian signed."""
    return from_bigint(_signed64(hashlib.sha256(name.encode()).digest()))


def dbos_background_key(app: str, schema: str = "dbos") -> LockTriple:
    """DBOS _sys_db_postgres.py background_job_lock("background_jobs"), per application."""
    return dbos_key(f"dbos.background_job.{schema}.{app}.background_jobs")


# DBOS _datasource_migration.py _migration_lock_key(schema), the default schema "dbos"
FIXED[dbos_key("dbos.datasource_migrations.dbos")] = Known(
    "DBOS", "migration lock of an application database (schema dbos)", "exact"
)


def goodjob_key(text: str) -> LockTriple:
    """GoodJob: ``('x' || substr(md5(key), 1, 16))::bit(64)::bigint``."""
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return from_bigint(_signed64(digest))


# pg_partman's constant lock names (4.x, 5.x), hashed on the server with hashtext; the two
# procedures lock a pair (hashtext(name), hashtext(parent_table)) (pg_partman sources)
PARTMAN_NAMES = (
    "pg_partman run_maintenance", "pg_partman drop_partition_time", "pg_partman drop_partition_id",
    "pg_partman run_analyze", "pg_partman reapply_constraints", "pg_partman undo_partition_native",
    "pg_partman partition_data_proc", "pg_partman undo_partition_proc",
)  # fmt: skip


@dataclass
class Catalogue:
    """Known keys for one snapshot: everywhere, per database, and pair prefixes."""

    anywhere: dict[LockTriple, Known] = field(default_factory=dict)
    per_database: dict[str, dict[LockTriple, Known]] = field(default_factory=dict)
    prefixes: dict[tuple[str | None, int], Known] = field(default_factory=dict)

    @cached_property
    def _spaces(self) -> dict[tuple[int, int], frozenset[LockTriple]]:
        found: dict[tuple[int, int], set[LockTriple]] = {}
        for keys in [self.anywhere, *self.per_database.values()]:
            for triple in keys:
                found.setdefault((triple.objsubid, triple.classid), set()).add(triple)
        return {space: frozenset(triples) for space, triples in found.items()}

    def listed(self, objsubid: int, classid: int) -> frozenset[LockTriple] | None:
        """The keys listed in one key space (form and high word), in any database: a key of
        the space not among them is named by none. None when a pair prefix covers the space
        (its every key is named)."""
        if objsubid == PAIR_SUBID and (
            classid == REPACK_LOCK_PREFIX or any(c == classid for _, c in self.prefixes)
        ):
            return None
        return self._spaces.get((objsubid, classid), frozenset())

    def lookup(self, triple: LockTriple, database: str | None) -> Known | None:
        if database is not None:
            found = self.per_database.get(database, {}).get(triple)
            if found is not None:
                return found
        found = self.anywhere.get(triple)
        if found is None and triple.objsubid == PAIR_SUBID and triple.classid == REPACK_LOCK_PREFIX:
            return repack_known(triple)  # a table's OID, named per snapshot when it can be
        if found is None and triple.objsubid == 2:
            found = self.prefixes.get((database, triple.classid)) or self.prefixes.get(
                (None, triple.classid)
            )
        return found


def build_catalogue(
    candidates: Candidates,
    databases: Iterable[str] = (),
    derived: Iterable[DerivedKey] = (),
) -> Catalogue:
    guesses = {k: v for k, v in FIXED.items() if v.confidence == "guess"}
    exact = {k: v for k, v in FIXED.items() if v.confidence == "exact"}
    catalogue = Catalogue(
        anywhere={
            **guesses,
            **flyway_keys(candidates.flyway_schemas),
            **name_keys(
                candidates.with_advisory_lock,
                candidates.with_advisory_lock_prefix,
                candidates.django_pglocks,
                candidates.pals,
                candidates.advisory_lock_npm,
                candidates.medusa,
                (*SLONIK_TABLES, *candidates.slonik_migrator_tables),
                candidates.dbos_apps,
            ),
            **tooz_keys(candidates.tooz),
            **exact,
        },
        per_database={name: database_keys(name) for name in databases},
    )
    for key in derived:
        known = Known(key.software, key.meaning, "derived")
        if key.form == "pair-prefix":
            catalogue.prefixes[(key.database, to_uint4(key.key))] = known
            continue
        triple = (
            from_pair(to_int4(key.key >> 32 & 0xFFFFFFFF), to_int4(key.key & 0xFFFFFFFF))
            if key.form == "pair"
            else from_bigint(key.key)
        )
        target = (
            catalogue.per_database.setdefault(key.database, {})
            if key.database
            else catalogue.anywhere
        )
        target.setdefault(triple, known)
    _add_plugin_keys(catalogue)
    return catalogue


# -- keys that installed plugins declare (lockdiag.plugins) ------------------------------------


@dataclass(frozen=True)
class PluginKeys:
    """The plugins' fixed keys and key spaces, none named by an earlier plugin, and the entries
    that compute keys per database. A software name that is built in, or an earlier plugin's,
    leaves that entry out."""

    declared: list[tuple[plugins.Key, Known]] = field(default_factory=list)
    computed: list[tuple[str, plugins.Entry, Software]] = field(default_factory=list)


@cache  # the same Known objects for every snapshot: findings count locks by their identity
def plugin_keys() -> PluginKeys:
    found, kept = PluginKeys(), Catalogue()
    owners: dict[str, str] = {}
    for plugin in plugins.loaded():
        for entry in plugin.entries:
            owner = "built in" if entry.software in SOFTWARE else owners.get(entry.software)
            if owner is not None:
                by = owner if owner == "built in" else f"declared by plugin {owner}"
                plugins.tell(
                    f"plugin {plugin.name}: software {entry.software!r} is {by}: this entry of "
                    "it is not used"
                )
                continue
            owners[entry.software] = plugin.name
            software = Software(entry.kind, entry.function, entry.normal, entry.check)
            if entry.per_database is not None:
                found.computed.append((plugin.name, entry, software))
            for key in entry.keys:
                known = Known(entry.software, key.meaning, "plugin", plugin.name, software)
                if _claim(kept, key, known):
                    found.declared.append((key, known))
    return found


def _add_plugin_keys(catalogue: Catalogue) -> None:
    """Every plugin key that no built-in key names (the registry comes before both at every
    decode), then the keys plugins compute for each database of the catalogue."""
    declared = plugin_keys()
    for key, known in declared.declared:
        _claim(catalogue, key, known)
    for name, entry, software in declared.computed:
        for database in list(catalogue.per_database):
            try:
                keys = entry.keys_of_database(database)
            except Exception as error:  # a plugin's code: its failure leaves its keys out
                plugins.tell(
                    f"plugin {name}: per_database of {entry.software!r} not used for database "
                    f"{database!r}: {plugins.cause(error)}"
                )
                continue
            for key in keys:
                known = Known(entry.software, key.meaning, "plugin", name, software)
                _claim(catalogue, key, known, database)


def _claim(
    catalogue: Catalogue, key: plugins.Key, known: Known, database: str | None = None
) -> bool:
    """Add a plugin's key unless the catalogue names it already; a clash is told."""
    if key.form == "space":
        classid = to_uint4(key.numbers[0])
        held = [
            k
            for (d, c), k in catalogue.prefixes.items()
            if c == classid and (database is None or d in (None, database))
        ]
        if classid == REPACK_LOCK_PREFIX:
            held.append(Known("pg_repack", "key space of its table locks", "exact"))
        other = held[0] if held else None
        if other is None:
            catalogue.prefixes[(database, classid)] = known
    else:
        triple = key.triple
        other = catalogue.lookup(triple, database) or next(
            (keys[triple] for keys in catalogue.per_database.values() if triple in keys), None
        )
        if other is None:
            target = catalogue.anywhere if database is None else catalogue.per_database[database]
            target[triple] = known
    if other is None:
        return True
    by = "built in" if other.plugin is None else f"declared by plugin {other.plugin}"
    plugins.tell(
        f"plugin {known.plugin}: {key.describe()} of {known.software} is {other.software}'s "
        f"{other.meaning} ({by}): that name is used"
    )
    return False


def snapshot_catalogue(snapshot: Snapshot, candidates: Candidates) -> Catalogue:
    names = snapshot.server.databases
    databases = {
        names[lock.database]
        for lock in snapshot.locks
        if lock.locktype == "advisory" and lock.database in names
    }
    catalogue = build_catalogue(candidates, databases, snapshot.derived)
    guesses = {k: v for k, v in catalogue.anywhere.items() if v.confidence == "guess"}
    spaces = {key.classid for key in guesses}  # an int's test first: most locks are in none
    sessions_on: dict[tuple[str, LockTriple], set[int]] = {}  # the pids on each guessed key
    for lock in snapshot.locks:
        key = lock.advisory_key
        if key is None or lock.database not in names:
            continue
        if key.classid in spaces and key in guesses:
            sessions_on.setdefault((names[lock.database], key), set()).add(lock.pid or 0)
        if key.objsubid != PAIR_SUBID or key.classid != REPACK_LOCK_PREFIX:
            continue
        name = snapshot.server.relation_name(lock.database, repack_table_oid(key))
        if name is not None:  # pg_repack: the table, by name where this snapshot knows it
            catalogue.per_database.setdefault(names[lock.database], {})[key] = repack_known(
                key, name
            )
    for (database, key), pids in sessions_on.items():
        known = guesses[key]
        tables = snapshot.server.software_tables if database == snapshot.server.database else None
        sessions = [snapshot.sessions[pid] for pid in sorted(pids) if pid in snapshot.sessions]
        evidence = corroboration(known, database, tables, sessions)
        if evidence:  # one Known per database and key: findings count locks by identity
            confirmed = replace(known, confidence="corroborated", evidence=evidence)
            catalogue.per_database.setdefault(database, {}).setdefault(key, confirmed)
    return catalogue


def repack_table_oid(triple: LockTriple) -> int:
    """pg_repack locks ``(16185446, CAST(-2147483648 + oid AS integer))``: objid is the table's
    OID plus 2^31, modulo 2^32."""
    return (triple.objid - 2**31) % 2**32


@cache  # one Known per key: findings count locks by the identity of their Known
def repack_known(triple: LockTriple, table: str | None = None) -> Known:
    oid = repack_table_oid(triple)
    where = table if table is not None else f"with OID {oid} (in the lock's database)"
    return Known("pg_repack", f"repack of table {where}", "exact")


# sessions that software names through application_name, for the connections that hold no key
# of it: pg_repack's second connection, idle in transaction on purpose for the whole repack
BY_APPLICATION = {
    "pg_repack": Known(
        "pg_repack",
        "repack (its second connection)",
        "corroborated",
        evidence=("its application_name is 'pg_repack'"),
    )
}


def software_of_session(application_name: str | None) -> Known | None:
    """Software told by the application_name it sets (any client may set it: corroborated,
    not exact)."""
    return BY_APPLICATION.get(application_name or "")


# -- keys named on the inspected server (the query itself is lockdiag.pg.capture's) ---------


def hashed_names(candidates: Candidates) -> list[str]:
    """Names whose keys only a server's hashtext() can compute. pg_partman's are always
    tried: the extension may live in another database of the cluster, and hashtext() gives
    the same number in every database."""
    strings = [*candidates.hashtext, *PARTMAN_NAMES, *SERVER_HASHED]
    return strings + [f"pgmq.queue_{queue}" for queue in candidates.pgmq_queues]


# hashtext() names that PgQueuer and SAQ lock by default (pgqueuer adapters/persistence/qb.py
# build_aggregate_log_data_to_statistics_query; saq queue/postgres.py sweep, queue "default")
PGQUEUER_STATISTICS = "pgqueuer_statistics"
SAQ_QUEUE = "default"
SERVER_HASHED = (PGQUEUER_STATISTICS, SAQ_QUEUE)


def unmatched_keys(snapshot: Snapshot, registry: Registry) -> set[int]:
    """Advisory keys (as bigints) that neither the registry nor the catalogue names."""
    catalogue = snapshot_catalogue(snapshot, registry.candidates)
    names = snapshot.server.databases
    return {
        key.bigint
        for lock in snapshot.locks
        if (key := lock.advisory_key) is not None
        and registry.decode(key) is None
        and catalogue.lookup(key, names.get(lock.database or 0)) is None
    }


_SOURCES = {
    "pgmq": ("pgmq", "queue {name!r}"),
    "que": ("Que", "job {name}"),
    "good_job": ("GoodJob", "job {name}"),
    "good_job_concurrency": ("GoodJob", "concurrency key {name!r}"),
    "good_job_process": ("GoodJob", "process {name}"),
}
_SOURCES["dramatiq"] = ("dramatiq-pg", "message {name}")  # "<queue>/<message_id>"


def derived_keys(rows: Iterable[tuple[str, str, int]], database: str) -> list[DerivedKey]:
    """The enrichment query's rows as DerivedKey (hashtext: both call forms)."""
    found: list[DerivedKey] = []
    for source, name, key in rows:
        if source == "hashtext" and name == PGQUEUER_STATISTICS:  # pg_try_advisory_xact_lock
            found.append(DerivedKey(None, key, "bigint", "PgQueuer", "log aggregation lock"))
            continue
        if source == "hashtext" and name == SAQ_QUEUE:  # (saq_lock_keyspace 0, hashtext(queue))
            meaning = f"sweep lock of queue {name!r}"
            found.append(DerivedKey(None, to_uint4(key), "pair", "SAQ", meaning))
            continue
        if source == "hashtext":
            software, meaning = "hashtext", f"hashtext({name!r})"
            if name in PARTMAN_NAMES:
                software, meaning = "pg_partman", name.removeprefix("pg_partman ")
            elif name.startswith("pgmq.queue_"):
                software, meaning = "pgmq", f"queue {name.removeprefix('pgmq.queue_')!r}"
            found.append(DerivedKey(None, key, "bigint", software, meaning))
            found.append(DerivedKey(None, key, "pair-prefix", software, meaning))
            continue
        if source == "pg_boss":  # "<table>/<key name>", from pgboss.queue.table_name
            table, _, lock = name.rpartition("/")
            versions = PG_BOSS_TABLE_KEYS.get(lock, "v11+")
            meaning = f"{lock} lock of table {table}"
            found.append(DerivedKey(database, key, "bigint", f"pg-boss {versions}", meaning))
            continue
        software, template = _SOURCES[source]
        found.append(DerivedKey(database, key, "bigint", software, template.format(name=name)))
    return found


# -- more programs that hold their locks idle by design (run or read for issue 34) ------------
# Each one checked in its source at the version named, and run against PostgreSQL 15 where it is
# Python (tests/test_known_world.py); the known-locks guide says how each one holds.

SOFTWARE.update({
    # tooz 9.1.0 tooz/drivers/pgsql.py PostgresLock: pg_advisory_lock(md5(name)[0], md5(name)[1])
    # on a psycopg2 connection of its own, never autocommit: idle in transaction while held
    "tooz": Software(
        "library", "pg_advisory_lock",
        "held by one member of an OpenStack service for as long as it keeps its lock, on a "
        "connection of its own that stays idle in transaction the whole time (the driver's "
        "implicit transaction)",
        "check the member that holds it (its service's process and log) before acting: a "
        "timeout or a termination frees the lock while that member still believes it holds "
        "it, and another member takes it at once",
    ),
    # RelStorage 4.3.0 adapters/postgresql: locker.py, procs/lock_objects_and_detect_conflicts.sql
    # and procs/*/lock_and_choose_tid.sql; connmanager.py names the store connection "RS: Store"
    "RelStorage": Software(
        "library", "pg_advisory_xact_lock",
        "held by a ZODB two-phase commit: its store connection ('RS: Store') stays idle in "
        "transaction between vote and finish with one lock per object it changes (the key is "
        "the object's OID) and takes the commit lock -1 to finish; a pack holds the session "
        "lock -2",
        "check the ZODB application that is committing (its process, its log) before acting: "
        "ending the store connection between vote and finish fails the commit's second phase "
        "('Resources may be in an inconsistent state')",
    ),
    # dramatiq-pg 0.12.0 dramatiq_pg/broker.py CONSUME_ONE and message_lock(): a session lock
    # per consumed message on the consumer connection (application_name "dramatiq-pg")
    "dramatiq-pg": Software(
        "queue", "pg_try_advisory_lock",
        "held for each message a worker has consumed until the worker acks it, by the "
        "worker's consumer connection ('dramatiq-pg'), idle in autocommit between its polls",
        "check the dramatiq worker (its process, the message's row in dramatiq.queue) before "
        "acting: freeing the lock lets another worker consume the same message again",
    ),
    # grafana pkg/services/sqlstore/migrator/migrator.go RunMigrations: a dedicated sql.Conn
    # takes pg_try_advisory_lock(GenerateAdvisoryLockId(dbName)) while the migrations run in
    # transactions on other connections (older releases: inside one xorm session)
    "Grafana": Software(
        "migration", "pg_try_advisory_lock",
        "held while a Grafana server migrates its database at start, by a connection of its "
        "own left idle while the migrations run on other connections",
    ),
    # jackc/tern migrate/migrate.go: lockNum 9628173550095224 on the migrator's own connection
    "tern": Software(
        "migration", "pg_advisory_lock",
        "held for the whole migrate run by the connection that runs each migration",
    ),
})  # fmt: skip

# RelStorage's administrative keys: negative so as never to meet an OID (locker.py). Small
# numbers other code may pick too: named only with RelStorage's tables or sessions (SIGNS).
FIXED[from_bigint(-1)] = Known("RelStorage", "commit lock", "guess")
FIXED[from_bigint(-2)] = Known("RelStorage", "pack lock", "guess")
# tern migrate/migrate.go: "arbitrary random number", copied by projects that vendor tern
FIXED[from_bigint(9628173550095224)] = Known("tern", "migration lock", "exact")

# a session that names itself, whatever it holds (its per-object keys are plain OIDs)
BY_APPLICATION["RS: Store"] = Known(
    "RelStorage", "store connection of a ZODB commit (its object locks are the OIDs)",
    "corroborated", evidence="its application_name is 'RS: Store'",
)  # fmt: skip
BY_APPLICATION["dramatiq-pg"] = Known(
    "dramatiq-pg", "consumer connection (a lock per consumed message)",
    "corroborated", evidence="its application_name is 'dramatiq-pg'",
)  # fmt: skip


def tooz_key(name: str) -> LockTriple:
    """tooz's PostgresLock: the first two bytes of md5(name), passed as the two int4 keys."""
    digest = hashlib.md5(name.encode(), usedforsecurity=False).digest()
    return from_pair(digest[0], digest[1])


def tooz_keys(names: Iterable[str]) -> dict[LockTriple, Known]:
    """Only 65,536 keys: two names may share one, and any program's small pair may be one."""
    return {tooz_key(name): Known("tooz", f"lock {name!r}", "derived") for name in names}


def grafana_key(database: str) -> LockTriple:
    """Grafana's migration lock: golang-migrate's GenerateAdvisoryLockId(dbName), with no
    other names: ``crc32(dbName) * 1486364155`` as an unsigned 32-bit number."""
    return from_bigint((crc32(database) * 1486364155) % 2**32)
