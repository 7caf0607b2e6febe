"""An incident is when things are already broken: each fault gives a clear message naming the
cause and the fix, and a documented exit code. Never a traceback."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator

import pexpect
import psycopg
import pytest
from click.testing import Result

from lockdiag.demo.cluster import Cluster, create_standby
from lockdiag.errors import ServerError
from lockdiag.pg.session import DiagnosticSession

from helpers.cli import ctrl_c_reaches_child, run
from helpers.servers import OBSERVER, Sessions


def assert_one_clear_error(result: Result, code: int, *words: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.stderr + result.stdout
    first = result.stderr.splitlines()[0]
    assert first.startswith("lockdiag: error: ")
    for word in words:
        assert word in result.stderr


def test_own_backend_terminated(cluster: Cluster) -> None:
    session = DiagnosticSession(cluster.dsn(), 5)
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (session.connection.info.backend_pid,))
    with pytest.raises(ServerError, match="connection lost") as raised:
        session.snapshot("advisory")
    assert raised.value.exit_code == 3
    assert session.snapshot("advisory").locks == []  # the session reconnects on its next use
    session.close()


def test_server_restart_mid_command(cluster: Cluster) -> None:
    session = DiagnosticSession(cluster.dsn(), 5)
    session.snapshot("advisory")
    cluster.restart()
    with pytest.raises(ServerError, match="connection lost"):
        session.snapshot("advisory")
    session.close()
    assert run("list", "--dsn", cluster.dsn()).exit_code == 0  # and the next run works


def test_statement_timeout_on_a_huge_lock_table(cluster: Cluster, sessions: Sessions) -> None:
    sessions.open("many").run("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 40000) g")
    result = run("list", "--dsn", cluster.dsn(), "--timeout", "1ms")
    assert_one_clear_error(result, 3, "cancelled", "raise it with --timeout")


def test_a_low_temp_file_limit(
    cluster: Cluster, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database whose work_mem makes 5,000 locks spill to disk and whose temp_file_limit lets
    one copy of the lock table spill but not two. lockdiag's own work_mem keeps them in memory:
    every answer as usual, even under a limit no spill fits. Lowered to the database's (as a lock
    table beyond lockdiag's work_mem would spill): the answers that read spans (which copy it
    twice) read in full instead and answer as before; with a limit no read fits, one clear
    error naming the limit, not a lost connection. temp_file_limit is the database's: only a
    superuser may change it, lockdiag's session cannot."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE tempcap")
        # 64kB of work_mem: 5,000 locks spill, some 350 kB a copy
        admin.execute("ALTER DATABASE tempcap SET work_mem = '64kB'")
        admin.execute("ALTER DATABASE tempcap SET temp_file_limit = '64kB'")
    holder = sessions.open("spiller")
    holder.run("SELECT count(pg_advisory_lock(991, g)) FROM generate_series(1, 5000) g")
    dsn = cluster.dsn(dbname="tempcap")
    for command in ("blockers", "check"):  # lockdiag's work_mem: nothing spills
        result = run(command, "--dsn", dsn, "--format", "json")
        assert result.exit_code in (0, 1), result.stderr  # an answer, not UNKNOWN or an error

    monkeypatch.setattr("lockdiag.pg.connection.WORK_MEM_KB", 64)
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("ALTER DATABASE tempcap SET temp_file_limit = '500kB'")
    with psycopg.connect(dsn, autocommit=True) as reader:
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            reader.execute(  # the aggregated read's two copies, as the server keeps them
                "WITH l AS MATERIALIZED (SELECT * FROM pg_catalog.pg_locks) "
                "SELECT count(*) FROM l, (SELECT count(*) FROM l) AS again"
            )
        assert reader.execute("SELECT count(*) FROM pg_catalog.pg_locks").fetchone()
    result = run("who-holds", "--dsn", dsn, "--key", "991,4000", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (holding,) = json.loads(result.stdout)["holders"]
    assert holding["pid"] == holder.pid
    result = run("check", "--dsn", dsn, "--format", "json")
    assert result.exit_code in (0, 1), result.stderr  # an answer, not UNKNOWN
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("ALTER DATABASE tempcap SET temp_file_limit = '64kB'")
    result = run("blockers", "--dsn", dsn)
    assert_one_clear_error(result, 3, "temp_file_limit", "ALTER ROLE")
    assert "connection lost" not in result.stderr


def test_unknown_host() -> None:
    result = run("list", "--dsn", "host=no-such-host.invalid user=x", "--timeout", "2s")
    assert_one_clear_error(result, 3, "cannot connect", "does not resolve")


def test_database_the_role_may_not_connect_to(cluster: Cluster) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE closed_db")
        admin.execute("REVOKE CONNECT ON DATABASE closed_db FROM PUBLIC")
    result = run("list", "--dsn", cluster.dsn(user=OBSERVER, dbname="closed_db"))
    assert_one_clear_error(result, 3, "permission denied for database", "GRANT CONNECT")


@pytest.fixture
def standby(cluster: Cluster) -> Iterator[Cluster]:
    server = create_standby(cluster)
    yield server
    server.destroy()


def test_standby_in_recovery(standby: Cluster, sessions: Sessions) -> None:
    result = run("list", "--dsn", standby.dsn(), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["server"]["in_recovery"] is True
    assert "standby in recovery" in result.stdout
    check = run("check", "--dsn", standby.dsn())
    assert check.exit_code == 0 and "standby in recovery" in check.stdout


ACCEPTED: list[socket.socket] = []  # kept open (and silent) until the test run ends


def silent_server() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def accept() -> None:
        while True:
            try:
                ACCEPTED.append(listener.accept()[0])
            except OSError:
                return  # the listener was closed

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_ctrl_c_exits_130_without_traceback() -> None:
    listener, port = silent_server()
    try:
        dsn = f"host=127.0.0.1 port={port} user=x"
        command = ["-m", "lockdiag", "list", "--dsn", dsn, "--timeout", "30s"]
        child = pexpect.spawn(sys.executable, command, timeout=20, preexec_fn=ctrl_c_reaches_child)
        child.expect(pexpect.TIMEOUT, timeout=1)  # it is waiting for the silent server
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
        output = child.before.decode()
        assert child.exitstatus == 130, output
        assert "interrupted" in output
        assert "Traceback" not in output
    finally:
        listener.close()


def test_silent_server_times_out_clearly() -> None:
    listener, port = silent_server()
    try:
        result = run("list", "--dsn", f"host=127.0.0.1 port={port} user=x", "--timeout", "2s")
        assert_one_clear_error(result, 3, "timeout expired", "--timeout")
    finally:
        listener.close()


def server_processes(postmaster: int) -> list[int]:
    """The postmaster and its children (each backend is in a process group of its own)."""
    from pathlib import Path

    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def test_a_stopped_server_fails_within_the_deadline() -> None:
    """The measured incident, for real: a cluster SIGSTOPped (postmaster and backends) with
    lockdiag's session open. The snapshot on that session gives up at its deadline (--timeout
    1s + 1s), a new connection at libpq's connect_timeout, each in one line; and once the
    server runs again the same session reconnects."""
    import os
    import signal
    import time

    from lockdiag.demo.cluster import create_cluster
    from lockdiag.pg.deadline import NoAnswer

    stopped = create_cluster()
    assert stopped.process is not None
    try:
        with DiagnosticSession(stopped.dsn(), 1) as session:
            session.snapshot("advisory")
            processes = server_processes(stopped.process.pid)
            assert session.connection.info.backend_pid in processes
            for pid in processes:
                os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(NoAnswer) as raised:
                    session.snapshot("advisory")
                assert time.monotonic() - started < 1 + 5
                assert "did not answer within 2s" in str(raised.value)
                started = time.monotonic()
                result = run("list", "--dsn", stopped.dsn(), "--timeout", "1s")
                assert time.monotonic() - started < 2 + 5
                assert_one_clear_error(result, 3, "timeout expired")
            finally:
                for pid in processes:
                    os.kill(pid, signal.SIGCONT)
            assert session.snapshot("advisory").locks == []
    finally:
        stopped.destroy()
