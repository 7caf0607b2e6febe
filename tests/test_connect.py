"""lockdiag's own session is harmless, and connection failures are one clear line."""

from __future__ import annotations

import time

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster, free_port
from lockdiag.errors import InputError, ServerError
from lockdiag.evidence import take_snapshot
from lockdiag.pg.connection import conninfo, scrub
from lockdiag.pg.session import DiagnosticSession
from lockdiag.pg.timeout import Timeout

from conftest import PASSWORD, Sessions


def test_session_is_read_only_named_and_bounded(cluster: Cluster) -> None:
    with DiagnosticSession(cluster.dsn(), timeout=3) as session:
        connection = session.connection
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('application_name', 'statement_timeout', 'lock_timeout', "
                "'default_transaction_read_only')"
            ).fetchall()
        )
        assert settings == {
            "application_name": "lockdiag",
            "statement_timeout": "3000",
            "lock_timeout": "3000",
            "default_transaction_read_only": "on",
        }
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            connection.execute("CREATE TABLE must_not_exist (id int)")


def test_snapshot_takes_no_advisory_lock(cluster: Cluster, sessions: Sessions) -> None:
    watcher = sessions.open("watcher")
    before = watcher.run("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    take_snapshot(cluster.dsn(), 5, "all")
    assert watcher.run("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == before


def test_user_options_are_kept() -> None:
    info = conninfo("host=x options='-c search_path=a'", Timeout(2))
    assert "-c search_path=a -c statement_timeout=2000" in info


def test_unreachable_server() -> None:
    with pytest.raises(ServerError) as raised:
        DiagnosticSession(f"host=127.0.0.1 port={free_port()} user=postgres", 2).describe()
    assert "cannot connect" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert raised.value.hint is not None and "running" in raised.value.hint


def test_wrong_password_is_never_shown(cluster: Cluster) -> None:
    with pytest.raises(ServerError) as raised:
        DiagnosticSession(cluster.dsn(user="pw_user", password="not-the-Secret-123"), 2).describe()
    assert "password authentication failed" in str(raised.value)
    assert "not-the-Secret-123" not in str(raised.value)
    with DiagnosticSession(cluster.dsn(user="pw_user", password=PASSWORD), 2) as session:
        assert session.connection.info.user == "pw_user"


def test_invalid_connection_string() -> None:
    with pytest.raises(InputError, match="invalid connection string"):
        conninfo("host=x nonsense", Timeout(2))


def test_scrub_removes_passwords() -> None:
    assert (
        scrub("failed for postgresql://u:hunter2@h/db", None)
        == "failed for postgresql://u:***@h/db"
    )
    assert scrub("x hunter2 y", "host=h password=hunter2") == "x *** y"


def test_stuck_server_gives_up_after_the_timeout(cluster: Cluster, sessions: Sessions) -> None:
    """New backends read pg_database at start: with it locked the server accepts no session.
    lockdiag gives up after its connect timeout with a clear error instead of hanging."""
    blocker = sessions.open("catalog-locker", autocommit=False)
    blocker.run("LOCK TABLE pg_database IN ACCESS EXCLUSIVE MODE")
    started = time.monotonic()
    try:
        with pytest.raises(ServerError) as raised:
            take_snapshot(cluster.dsn(), 1, "advisory")
    finally:
        blocker.connection.rollback()
    assert time.monotonic() - started < 10
    assert "timeout expired" in str(raised.value)
    assert raised.value.hint is not None and "--timeout" in raised.value.hint
