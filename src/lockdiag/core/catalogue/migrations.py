"""Schema migration and deploy tools: a run holds its lock from start to end, and ending its
session mid-run can leave its record of applied changes out of step with the schema."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable

from lockdiag.core.catalogue.entry import Family, Hold, Known, Program, Sibling, Software, Space
from lockdiag.core.catalogue.formulas import crc32, java_hash
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import Candidates, KnownList

FLYWAY_BASE = 77431708279161  # "Flyway" in ASCII: 0x466C79776179
FLYWAY_CLASSIDS = range(18027, 18030)  # FLYWAY_BASE + any int4, in the high 32 bits
# @slonik/migrator has no default migrationTableName; its README uses "migration"
SLONIK_TABLES = ("migration", "migrations")


def flyway_key(schema: str, table: str = "flyway_schema_history") -> LockTriple:
    return from_bigint(FLYWAY_BASE + java_hash(f'"{schema}"."{table}"'))


def flyway_keys(schemas: Iterable[str]) -> dict[LockTriple, Known]:
    return {
        flyway_key(schema): Known("Flyway", f"migration lock of schema {schema}", "derived")
        for schema in schemas
    }


def grafana_key(database: str) -> LockTriple:
    """Grafana's migration lock: golang-migrate's GenerateAdvisoryLockId(dbName), with no
    other names: ``crc32(dbName) * 1486364155`` as an unsigned 32-bit number."""
    return from_bigint((crc32(database) * 1486364155) % 2**32)


def slonik_migrator_key(table: str) -> LockTriple:
    """@slonik/migrator dist/index.js advisoryLockId(): ``parseInt(md5('@slonik/migrator
    advisory lock:' + JSON.stringify(table)).hex.slice(0, 8), 16)``, an unsigned 32-bit bigint."""
    text = "@slonik/migrator advisory lock:" + json.dumps(
        table, ensure_ascii=False, separators=(",", ":")
    )
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return from_bigint(int.from_bytes(digest[:4], "big"))


def slonik_keys(tables: Iterable[str]) -> dict[LockTriple, Known]:
    return {
        slonik_migrator_key(table): Known(
            "@slonik/migrator", f"migration lock (table {table})", "derived"
        )
        for table in tables
    }


def _of_database(
    software: str, key: Callable[[str], int]
) -> Callable[[str], dict[LockTriple, Known]]:
    """A migration lock whose key is ``key(database name)``."""

    def keys(database: str) -> dict[LockTriple, Known]:
        meaning = f"migration lock of database {database}"
        return {from_bigint(key(database)): Known(software, meaning, "derived")}

    return keys


def golang_migrate_keys(database: str) -> dict[LockTriple, Known]:
    """golang-migrate: with and without the leading "/" a URL leaves on the name."""
    meaning = f"migration lock of database {database}"
    return {
        from_bigint((crc32(f"public\x00schema_migrations\x00{name}") * 1486364155) % 2**32): Known(
            "golang-migrate", meaning, "derived"
        )
        for name in (database, "/" + database)
    }


def flyway_listed(candidates: Candidates) -> dict[LockTriple, Known]:
    return flyway_keys(candidates.names("flyway_schemas"))


def slonik_listed(candidates: Candidates) -> dict[LockTriple, Known]:
    """The README's tables, and those listed."""
    return slonik_keys((*SLONIK_TABLES, *candidates.names("slonik_migrator_tables")))


MIGRATIONS = Family(
    (
        Program(
            "Prisma Migrate",
            Software("migration", "pg_advisory_lock", "held for the whole migrate run"),
            exact={from_bigint(72707369): "migration lock"},
        ),
        Program(
            "Sqitch",
            Software(
                "deploy",
                "pg_try_advisory_lock",
                "held for the whole deploy, while Sqitch's own connection stays idle in "
                "transaction (LOCK TABLE changes) and psql applies each change in another backend",
                ending="does not stop the change: psql's session goes on and commits it, "
                "Sqitch cannot record it (its registry then lacks a change that is applied), and "
                "the freed lock lets a second deploy run the same change at the same time",
                keeps_working=True,
                # observed: psql connects 0.1-0.2 s after the holder's transaction (LOCK TABLE
                # changes) begins, one psql per change (sqitch 1.3.1, lib/App/Sqitch/Engine/pg.pm)
                sibling=Sibling(
                    "change",
                    "idle in transaction",
                    "xact_start",
                    (0.0, 5.0),
                    lasting=False,
                    stop="Sqitch then logs the change as failed, rolls back its own transaction "
                    "and releases its lock; what psql committed of the change stays",
                    application="psql",
                ),
            ),
            exact={from_bigint(75474063): "deploy lock"},
            # App/Sqitch/Engine.pm lock_destination, Engine/pg.pm try_lock and wait_lock (1.3.1,
            # run on PostgreSQL 15: tests/test_known_programs.py)
            holds=(
                Hold(
                    "deploy",
                    ("pg_try_advisory_lock", "pg_advisory_lock"),
                    "waits",
                    note="held by Sqitch's own connection (no application_name), idle in "
                    "transaction while a psql child (application_name psql, a backend of its "
                    "own) applies each change; a second deploy tries once, then waits in "
                    "pg_advisory_lock until its --lock-timeout (60 s by default)",
                ),
            ),
        ),
        Program(
            "goose",
            Software("migration", "pg_try_advisory_lock", "held for the whole migration run"),
            exact={from_bigint(4097083626): "migration lock (session locker)"},
        ),
        # src/runner.ts lock(): pg_try_advisory_lock(PG_MIGRATE_LOCK_ID)
        Program(
            "node-pg-migrate",
            Software("migration", "pg_try_advisory_lock", "held for the whole run"),
            exact={from_bigint(7241865325823964): "migration lock"},
        ),
        # PostgresAdapter.acquireMigrationLock: in the run's transaction (transactional DDL)
        Program(
            "Kysely",
            Software(
                "migration", "pg_advisory_xact_lock", "held by the migration run's transaction"
            ),
            exact={from_bigint(3853314791062309107): "migration lock"},
        ),
        Program(
            "liquibase-sessionlock",
            Software("migration", "pg_try_advisory_lock", "held for the whole update"),
            exact={
                from_pair(
                    java_hash("databasechangeloglock"), java_hash("public")
                ): "changelog lock (schema public)"
            },
        ),
        # activerecord migration.rb: MIGRATOR_SALT * Zlib.crc32(current_database)
        Program(
            "Ruby on Rails",
            Software(
                "migration",
                "pg_try_advisory_lock",
                "held for the whole db:migrate",
                ending="does not stop the migration, which goes on and commits on Rails' main "
                "connection (Rails 6.1 and 7.0 hold the lock on a connection of their own), and "
                "the freed lock lets a second db:migrate run at the same time",
                keeps_working=True,
                # observed (6.1.7): the main connection, same application_name and client
                # address, connects 0.13-0.27 s before the lock's (migration.rb
                # with_advisory_lock_connection); 7.1 takes the lock on the main connection
                sibling=Sibling(
                    "migration",
                    "idle",
                    "backend_start",
                    (-10.0, 0.0),
                    lasting=True,
                    stop="its transaction rolls back (a migration with "
                    "disable_ddl_transaction! keeps what it did) and Rails releases its lock "
                    "itself",
                    lock_only=True,
                ),
            ),
            database_keys=_of_database("Ruby on Rails", lambda name: 2053462845 * crc32(name)),
            # migration.rb with_advisory_lock (6.1.7, run: tests/test_known_programs.py)
            holds=(
                Hold(
                    "db:migrate",
                    ("pg_try_advisory_lock",),
                    "fails",
                    note="Rails 6.1 and 7.0 hold it on a connection of their own, idle (no "
                    "transaction) while the migrations run on the application's connection "
                    "(the same application_name and client address); 7.1 on that connection "
                    "itself. A second db:migrate fails at once (ConcurrentMigrationError)",
                ),
            ),
        ),
        Program(
            "sqlx",
            Software("migration", "pg_advisory_lock", "held for the whole migrate run"),
            database_keys=_of_database("sqlx", lambda name: 1026731422 * crc32(name)),
        ),
        Program(
            "golang-migrate",
            Software("migration", "pg_advisory_lock", "held for the whole run"),
            database_keys=golang_migrate_keys,
        ),
        Program(
            "Flyway",
            Software(
                "migration", "pg_try_advisory_xact_lock", "held by each migration's transaction"
            ),
            lists=(KnownList("flyway_schemas", "schemas of Flyway's history table", ("public",)),),
            listed_keys=flyway_listed,
            spaces=(Space("bigint", FLYWAY_CLASSIDS, "migration lock"),),
        ),
        # "GRAPHILE MIGRATE" on a phone keypad (graphile-migrate src/pgReal.ts,
        # ADVISORY_LOCK_MIGRATE)
        Program(
            "graphile-migrate",
            Software(
                "migration",
                "pg_try_advisory_lock",
                "held for the whole migrate run (and each migration it runs)",
            ),
            exact={from_bigint(4727445306447283): "migration lock"},
            # dist/pgReal.js withAdvisoryLock (1.4, run: tests/test_known.py)
            holds=(
                Hold(
                    "migrate",
                    ("pg_try_advisory_lock",),
                    "fails",
                    note="a second run fails at once ('Failed to get exclusive lock')",
                ),
            ),
        ),
        # checked by running each one against PostgreSQL 15 (tests/test_known_more.py)
        # postgres-migrations dist/with-lock.js: pg_try_advisory_lock(-8525285245963000605)
        Program(
            "postgres-migrations",
            Software(
                "migration",
                "pg_try_advisory_lock",
                "held for the whole migrate run by the connection that runs each migration in "
                "a transaction of its own",
            ),
            exact={from_bigint(-8525285245963000605): "migration lock"},
            # src/with-lock.ts (5.3.0, run: tests/test_known_programs.py)
            holds=(
                Hold(
                    "migrate",
                    ("pg_try_advisory_lock",),
                    "polls",
                    note="a second migrate tries again every second, idle between its tries "
                    "('SELECT pg_try_advisory_lock(-8525285245963000605);'), and never gives "
                    "up: it never shows in pg_locks",
                    interval=1.0,
                ),
            ),
        ),
        Program(
            "@slonik/migrator",
            Software(
                "migration",
                "pg_advisory_lock",
                "held for the whole up or down by one pooled connection that stays idle while "
                "the migrations run on another connection of the pool",
                ending="does not stop the migrations running on the pool's other "
                "connection, and the freed lock lets another instance migrate at the same time",
                keeps_working=True,
            ),
            lists=(
                KnownList("slonik_migrator_tables", "@slonik/migrator migrationTableName values"),
            ),
            listed_keys=slonik_listed,
        ),
        # grafana pkg/services/sqlstore/migrator/migrator.go RunMigrations: a dedicated sql.Conn
        # takes pg_try_advisory_lock(GenerateAdvisoryLockId(dbName)) while the migrations run
        # in transactions on other connections (older releases: inside one xorm session)
        Program(
            "Grafana",
            Software(
                "migration",
                "pg_try_advisory_lock",
                "held while a Grafana server migrates its database at start, by a connection of "
                "its own left idle while the migrations run on other connections",
                ending="does not stop the migrations running on Grafana's other "
                "connections, and the freed lock lets another Grafana server migrate at the same "
                "time",
                keeps_working=True,
            ),
            database_keys=_of_database("Grafana", lambda name: grafana_key(name).bigint),
        ),
        # jackc/tern migrate/migrate.go: lockNum 9628173550095224 on the migrator's own
        # connection, "arbitrary random number", copied by projects that vendor tern
        Program(
            "tern",
            Software(
                "migration",
                "pg_advisory_lock",
                "held for the whole migrate run by the connection that runs each migration",
            ),
            exact={from_bigint(9628173550095224): "migration lock"},
        ),
    ),
)
