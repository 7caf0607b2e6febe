"""Settings a database's owner attaches to the database (ALTER DATABASE ... SET) never blind
lockdiag: in each such database it sees the real holder and waiter, and its session runs with
the settings it pins (read back from the server, as lockdiag verifies them)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster
from lockdiag.pg.connection import conninfo
from lockdiag.pg.session import DiagnosticSession
from lockdiag.pg.timeout import Timeout

from helpers.servers import until_waiting

KEY = 987654321
# what each database's owner may set for every session of it, and what it did before
DATABASES = {
    "set_sql_ascii": {"client_encoding": "SQL_ASCII"},  # psycopg returned bytes: "no locks"
    "set_latin1": {"client_encoding": "LATIN1"},  # a '€' anywhere failed every run
    # a read-only deferrable transaction waits for a safe snapshot behind a serializable writer
    "set_serializable": {
        "default_transaction_isolation": "serializable",
        "default_transaction_deferrable": "on",
    },
    "set_idle_timeout": {"idle_session_timeout": "1ms"},  # "connection lost"
    "set_datestyle": {"DateStyle": "SQL, DMY"},  # psycopg cannot parse a waiter's waitstart
    # a superuser's session became the owner's role: other sessions' state hidden, check OK
    "set_role": {"role": "settings_owner"},
    # every statement compiled, inlined and optimised: check took 3 s instead of 0.5 at 100k
    "set_jit": {
        "jit": "on",
        "jit_above_cost": "0",
        "jit_inline_above_cost": "0",
        "jit_optimize_above_cost": "0",
    },
    # the lock table's copies written to temp files, and read back, at every read
    "set_work_mem": {"work_mem": "64kB"},
}
# the helper sessions' own settings, whatever the database says
HELPER_OPTIONS = r"-c idle_session_timeout=0 -c default_transaction_deferrable=off -c role=none"


@pytest.fixture(scope="module")
def owned(cluster: Cluster) -> Cluster:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE ROLE settings_owner LOGIN")
        for database in DATABASES:
            admin.execute(f"CREATE DATABASE {database} OWNER settings_owner")
    for database, settings in DATABASES.items():
        with psycopg.connect(
            cluster.dsn(user="settings_owner", dbname=database), autocommit=True
        ) as owner:
            owner.execute("CREATE TABLE public.accounts (id int PRIMARY KEY)")
            for name, value in settings.items():
                owner.execute(f"ALTER DATABASE {database} SET {name} = '{value}'")
    return cluster


@pytest.fixture
def helpers(owned: Cluster) -> Iterator[list[psycopg.Connection[Any]]]:
    opened: list[psycopg.Connection[Any]] = []
    yield opened
    pids = [c.info.backend_pid for c in opened]
    with psycopg.connect(owned.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) AS p", (pids,))
    for connection in opened:
        connection.close()


def helper(
    cluster: Cluster, database: str, opened: list[psycopg.Connection[Any]], name: str
) -> psycopg.Connection[Any]:
    connection = psycopg.connect(
        cluster.dsn(dbname=database, application_name=name, client_encoding="UTF8"),
        options=HELPER_OPTIONS,
        autocommit=True,
    )
    opened.append(connection)
    return connection


def wait(connection: psycopg.Connection[Any]) -> None:
    # ended by the fixture: terminated (OperationalError), or closed under the wait (a closed
    # connection's pending query answers InternalError "got no result from the query")
    with contextlib.suppress(psycopg.Error):
        connection.execute(f"SELECT pg_advisory_lock({KEY})")


@pytest.mark.parametrize("database", list(DATABASES))
def test_lockdiag_sees_the_locks_whatever_the_database_sets(
    owned: Cluster, helpers: list[psycopg.Connection[Any]], database: str
) -> None:
    # a serializable writer, open: a deferrable read-only transaction would wait for it
    writer = helper(owned, database, helpers, "writer")
    writer.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    writer.execute("INSERT INTO public.accounts SELECT count(*) FROM public.accounts")
    # a holder whose last query has characters LATIN1 lacks, and a waiter behind it
    holder = helper(owned, database, helpers, "holder")
    holder.execute(f"SELECT pg_advisory_lock({KEY}), '€ 日本' AS note")
    waiter = helper(owned, database, helpers, "waiter")
    threading.Thread(target=wait, args=(waiter,), daemon=True).start()
    until_waiting(owned, waiter.info.backend_pid)
    time.sleep(0.05)  # past the 1ms idle_session_timeout, were lockdiag's session subject to it

    dsn = owned.dsn(dbname=database)
    result = CliRunner().invoke(cli, ["list", "--timeout", "3s", "--dsn", dsn])
    assert result.exit_code == 0, result.output
    assert "2 lock(s), 1 waiting" in result.stdout, result.output
    assert f"waits for {holder.info.backend_pid}" in result.stdout
    assert "show no state" not in result.output  # every session's state seen
    result = CliRunner().invoke(cli, ["who-holds", "--key", str(KEY), "--dsn", dsn])
    assert result.exit_code == 0, result.output
    assert str(waiter.info.backend_pid) in result.stdout

    with DiagnosticSession(dsn, 3.0) as session:
        assert not session.per_transaction  # the startup packet's settings won
        connection = session.connection
        assert connection.info.encoding == "utf-8"
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN "
                "('client_encoding', 'DateStyle', 'transaction_isolation', "
                "'transaction_deferrable', 'idle_session_timeout', 'jit', 'work_mem') "
                "UNION ALL SELECT 'current_user', CURRENT_USER::text"
            ).fetchall()
        )
    assert settings == {
        "client_encoding": "UTF8",
        "DateStyle": "ISO, MDY",
        "transaction_isolation": "read committed",
        "transaction_deferrable": "off",
        "idle_session_timeout": "0",
        "jit": "off",
        "work_mem": "32768",
        "current_user": "postgres",
    }


def test_transaction_timeout_is_pinned_where_the_server_has_it(cluster: Cluster) -> None:
    """transaction_timeout (17 and later) set on a database ends every transaction of a session
    of it that lasts longer, FATAL. An older server refuses the unknown name in the startup
    packet, so lockdiag sends it from the second connection on, once the first has told the
    version, and connects once more when the setting is not already 0 or the first query was
    ended by it."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        version = admin.info.server_version
        admin.execute("CREATE DATABASE set_transaction_timeout")
        if version >= 170000:
            # 1ms: the first connection's first query is ended (FATAL), nearly always
            admin.execute("ALTER DATABASE set_transaction_timeout SET transaction_timeout = '1ms'")
    dsn = cluster.dsn(dbname="set_transaction_timeout")
    try:
        with DiagnosticSession(dsn, 3.0) as session:
            connection = session.connection
            assert session.server_version == version
            assert not session.per_transaction
            shown = connection.execute(
                "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'transaction_timeout'"
            ).fetchall()
            options = connection.info.get_parameters().get("options", "")
            sent = conninfo(dsn, Timeout(3.0), session.server_version)
        if version >= 170000:
            assert shown == [("0",)]  # the database's 1ms is not in force
            assert "transaction_timeout=0" in sent
        else:
            assert shown == []
            assert "transaction_timeout=" not in sent + options
        result = CliRunner().invoke(cli, ["list", "--dsn", dsn])
        assert result.exit_code == 0, result.output
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("DROP DATABASE set_transaction_timeout")
