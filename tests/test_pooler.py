"""A real PgBouncer in front of the test cluster: the leak through transaction pooling is
flagged, session pooling is not, and pooltest gives the right verdicts in each setup."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pexpect
import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Bouncer, Cluster, start_pgbouncer
from lockdiag.errors import ServerError
from lockdiag.pg.deadline import NoAnswer
from lockdiag.pg.session import DiagnosticSession

from helpers.cli import ctrl_c_reaches_child, list_json
from helpers.pooler import leak
from helpers.servers import Sessions
from helpers.terminal import TERMINAL_ENV


@pytest.fixture
def session_pool(cluster: Cluster) -> Iterator[Bouncer]:
    bouncer = start_pgbouncer(cluster, "session")
    yield bouncer
    bouncer.stop()


def test_leak_through_transaction_pooling_is_flagged(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    backend = leak(transaction_pool, 424242)
    try:
        (lock,) = list_json(cluster, "--pgbouncer", transaction_pool.console_dsn())["locks"]
        assert lock["pid"] == backend
        assert lock["lifetime"] == "session"
        assert "outlived-client" in lock["flags"]
        assert lock["pool"]["pool"] == "postgres/postgres"
        assert lock["pool"]["pool_mode"] == "transaction"
        assert lock["pool"]["client"] is None
        assert lock["pool"]["application_name_may_be_inherited"] is True
        held = CliRunner().invoke(
            cli, ["who-holds", "--key", "424242", "--dsn", cluster.dsn(),
                  "--pgbouncer", transaction_pool.console_dsn()],
        )  # fmt: skip
        assert "the lock outlived the client that took it" in held.stdout.splitlines()[0]
        assert "may not name who took the lock" in held.stdout
        check = CliRunner().invoke(
            cli, ["check", "--dsn", cluster.dsn(), "--format", "json", "--pgbouncer",
                  transaction_pool.console_dsn()],
        )  # fmt: skip
        kinds = [f["kind"] for f in json.loads(check.stdout)["findings"]]
        assert "outlived-client" in kinds
        # without console access, the pooler's address still marks the backend
        (by_address,) = list_json(cluster, "--pooler-addr", "127.0.0.1")["locks"]
        assert "pooled-session-lock" in by_address["flags"]
        assert by_address["pool"]["known_from"] == "address"
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))


def test_attached_client_is_not_a_leak(cluster: Cluster, transaction_pool: Bouncer) -> None:
    with psycopg.connect(
        transaction_pool.dsn(), autocommit=False, prepare_threshold=None
    ) as worker:
        worker.execute("SELECT pg_advisory_lock(515151)")  # inside an open transaction
        (lock,) = list_json(cluster, "--pgbouncer", transaction_pool.console_dsn())["locks"]
        assert lock["pool"]["client"] is not None
        assert "outlived-client" not in lock["flags"]
        worker.execute("SELECT pg_advisory_unlock(515151)")


def test_session_pooling_releases_on_leave(
    cluster: Cluster, session_pool: Bouncer, sessions: Sessions
) -> None:
    console = ("--pgbouncer", session_pool.console_dsn())
    with psycopg.connect(
        session_pool.dsn(application_name="pooled-worker"), autocommit=True, prepare_threshold=None
    ) as worker:
        worker.execute("SELECT pg_advisory_lock(616161)")
        (lock,) = list_json(cluster, *console)["locks"]  # held, its client still attached
        assert lock["pool"]["pool_mode"] == "session" and lock["pool"]["client"] is not None
        assert "outlived-client" not in lock["flags"]
    sessions.until(
        lambda admin: (
            admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
            == (0,)
        ),
        10,
        "DISCARD ALL to release the lock",
    )
    assert list_json(cluster, "--pgbouncer", session_pool.console_dsn())["locks"] == []


def pooltest(bouncer: Bouncer, cluster: Cluster) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(
        cli, ["pooltest", "--pooled", bouncer.dsn(), "--direct", cluster.dsn(), "--format", "json"]
    )
    return result.exit_code, json.loads(result.stdout)


def verdicts(document: dict[str, Any]) -> dict[str, bool]:
    return {r["scenario"]: r["ok"] for r in document["results"]}


def test_pooltest_transaction_pooling_is_unsafe_for_session_locks(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    code, document = pooltest(transaction_pool, cluster)
    assert code == 1
    found = verdicts(document)
    assert found["session lock, A connected: B tries the same key"] is False
    assert found["session lock, A disconnects without unlocking"] is False
    assert all(ok for name, ok in found.items() if name.startswith("xact lock")), document
    assert found["two different keys at once (transaction locks)"] is True
    assert document["left_behind"] == 0
    assert document["advice"]
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:  # nothing left behind
        assert admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        ).fetchone() == (0,)


def test_pooltest_session_pooling_is_safe(cluster: Cluster, session_pool: Bouncer) -> None:
    code, document = pooltest(session_pool, cluster)
    assert code == 0, document
    assert all(verdicts(document).values())


def test_pooltest_reset_query_always(cluster: Cluster) -> None:
    """server_reset_query_always = 1: session locks no longer outlive the client, but they
    end with each transaction, so a still-connected owner loses them (reported unsafe)."""
    bouncer = start_pgbouncer(cluster, "transaction", {"server_reset_query_always": "1"})
    try:
        code, document = pooltest(bouncer, cluster)
    finally:
        bouncer.stop()
    found = verdicts(document)
    assert found["session lock, A disconnects without unlocking"] is True
    assert found["session lock, A commits"] is False
    assert all(ok for name, ok in found.items() if name.startswith("xact lock"))
    assert code == 1


def test_pooltest_refuses_a_key_in_use(
    cluster: Cluster, transaction_pool: Bouncer, sessions: Sessions
) -> None:
    sessions.open("user-of-key").run("SELECT pg_advisory_lock(1818977383, 1)")
    result = CliRunner().invoke(
        cli, ["pooltest", "--pooled", transaction_pool.dsn(), "--direct", cluster.dsn()]
    )
    assert result.exit_code == 2
    assert "already held" in result.stderr


def test_console_rows_are_read_by_column_name() -> None:
    """Newer PgBouncers add columns (1.21 prepared_statements, 1.23 replication, 1.24 id),
    and their order may change: only the names matter."""
    from lockdiag.core.model import Session
    from lockdiag.pg.pgbouncer import Console, links

    server = {
        "id": 7, "type": "S", "user": "app", "database": "shop", "replication": "none",
        "state": "idle", "addr": "10.0.0.1", "port": 5432, "local_addr": "10.0.0.9",
        "local_port": 40001, "link": "", "remote_pid": 4242, "ptr": "0x1",
        "application_name": "worker", "prepared_statements": 0,
    }  # fmt: skip
    console = Console("pgb:6432", [server], [], [{"database": "shop", "user": "app",
                                                  "pool_mode": "transaction"}])  # fmt: skip
    sessions = {4242: Session(pid=4242, client_addr="10.0.0.9", client_port=40001)}
    link = links([console], sessions)[4242]
    assert (link.pool, link.pool_mode, link.client, link.via) == (
        "shop/app", "transaction", None, "console"
    )  # fmt: skip
    # a second PgBouncer in the chain: remote_pid is not a backend pid, the address decides
    sessions = {99: Session(pid=99, client_addr="10.0.0.9", client_port=40001)}
    assert links([console], sessions)[99].pool == "shop/app"


def test_pooltest_verdicts_without_a_pooler() -> None:
    """The judge alone: a worker that never got the lock proves nothing (inconclusive), a
    lock that survives its client is unsafe, a clean release is ok."""
    from lockdiag.core.pooltest import Observation, verdict

    never = Observation("xact", "commit", False, "BEGIN is not allowed", 0, True, 0, True)
    assert verdict(never).verdict == "inconclusive"
    assert "BEGIN is not allowed" in verdict(never).observed
    leaked = Observation("session", "disconnect", True, None, 1, False, 1, True)
    assert verdict(leaked).verdict == "unsafe"
    assert "false success" in verdict(leaked).observed
    clean = Observation("xact", "rollback", True, None, 0, True, 0, True)
    assert verdict(clean).verdict == "ok"
    owned = Observation("session", "commit", True, None, 1, False, 0, True)
    assert verdict(owned).verdict == "ok"  # A still connected owns it; freed when A leaves


def test_pooltest_refuses_to_destroy_a_leaked_lock(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    """A pool whose server connection carries a leaked session lock: pooltest names it and
    refuses (exit 2), and the lock, the evidence, is still there afterwards."""
    backend = leak(transaction_pool, 515151)
    for console in ([], ["--pgbouncer", transaction_pool.console_dsn()]):
        result = CliRunner().invoke(
            cli, ["pooltest", "--pooled", transaction_pool.dsn(), "--direct", cluster.dsn(),
                  *console],
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "refusing to run" in result.stderr
        assert f"pid {backend} holds unregistered bigint 515151" in result.stderr
        assert "lockdiag who-holds --key 0,515151,1" in result.stderr
        assert "--accept-losing-locks" in result.stderr
    (lock,) = [lock for lock in list_json(cluster)["locks"] if lock["key"] == [515151]]
    assert lock["pid"] == backend  # still held: nothing was touched


def test_pooltest_folds_the_locks_it_refuses_to_destroy(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    """20,000 locks leaked on one pooled connection were 20,002 lines: they are one line per
    backend and key space, as list folds them, naming the first few and the count."""
    with psycopg.connect(
        transaction_pool.dsn(application_name="leaky-worker"), autocommit=True,
        prepare_threshold=None,
    ) as worker:  # fmt: skip
        row = worker.execute(
            "SELECT count(pg_advisory_lock(g)), pg_backend_pid() "
            "FROM generate_series(2000000, 2019999) AS g"
        ).fetchone()
    assert row is not None and row[0] == 20000
    result = CliRunner().invoke(
        cli, ["pooltest", "--pooled", transaction_pool.dsn(), "--direct", cluster.dsn()]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) < 10, lines[:12]
    assert any(
        f"  pid {row[1]} holds 20000 locks: unregistered bigint 2000000, " in line
        and "and 19997 more (lockdiag who-holds --key 0,2000000,1)" in line
        for line in lines
    ), lines
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (row[1],))


def test_check_shows_every_note_in_every_format(cluster: Cluster) -> None:
    """A console that cannot be read is a note of the snapshot: check says so in text, JSON
    and the Nagios line, so an OK never hides that part of the picture was missing."""
    from lockdiag.demo.cluster import free_port

    console = f"host=127.0.0.1 port={free_port()} user=postgres"
    base = ["check", "--dsn", cluster.dsn(), "--pgbouncer", console]
    text = CliRunner().invoke(cli, base)
    assert "note: cannot read PgBouncer console" in text.stdout
    document = json.loads(CliRunner().invoke(cli, [*base, "--format", "json"]).stdout)
    assert any(n.startswith("cannot read PgBouncer console") for n in document["notes"])
    nagios = CliRunner().invoke(cli, [*base, "--format", "nagios"]).stdout
    assert "1 note(s): cannot read PgBouncer console" in nagios


# -- lockdiag's own session through a pooler: settings verified, never leaked ----------------

DROPS_OPTIONS = {"ignore_startup_parameters": "options", "default_pool_size": "1"}
PER_TRANSACTION = (
    "lockdiag: warning: the server did not apply lockdiag's startup options (a pooler dropping "
    "them?): its settings are applied per transaction"
)


@pytest.fixture
def dropping_pool(cluster: Cluster) -> Iterator[Bouncer]:
    """Transaction pooling that drops the options startup parameter (a common setting), with
    one server connection: every client of the pool uses the backend lockdiag used."""
    bouncer = start_pgbouncer(cluster, "transaction", DROPS_OPTIONS)
    yield bouncer
    bouncer.stop()


def settings_of(connection: psycopg.Connection[Any]) -> dict[str, str]:
    names = ("transaction_read_only", "statement_timeout", "lock_timeout", "search_path",
             "row_security", "idle_in_transaction_session_timeout")  # fmt: skip
    rows = connection.execute(
        "SELECT name, setting FROM pg_catalog.pg_settings WHERE name = ANY(%s)", (list(names),)
    ).fetchall()
    return dict(rows)


def test_a_session_set_through_transaction_pooling_reaches_other_clients(
    dropping_pool: Bouncer,
) -> None:
    """Why lockdiag never SETs its settings at session level when a pooler dropped them: the
    SET stays on the server connection, and the application's next client gets it."""
    with psycopg.connect(dropping_pool.dsn(), autocommit=True, prepare_threshold=None) as first:
        first.execute("SET default_transaction_read_only = on")
    with psycopg.connect(dropping_pool.dsn(), autocommit=True, prepare_threshold=None) as app:
        assert settings_of(app)["transaction_read_only"] == "on"  # leaked
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            app.execute("CREATE TABLE pooled_write (id int)")


def test_options_dropped_by_the_pooler_are_applied_per_transaction(
    cluster: Cluster, dropping_pool: Bouncer, sessions: Sessions
) -> None:
    """lockdiag works through the pool, says once that its settings go per transaction, and
    they hold on the server: a statement is cancelled at --timeout by the server, a write is
    refused; the application's next client on the same backend has none of them."""
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 5)")
    result = CliRunner().invoke(
        cli, ["list", "--dsn", dropping_pool.dsn(), "--timeout", "1s", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count(PER_TRANSACTION) == 1, result.stderr
    assert [lock["key"] for lock in json.loads(result.stdout)["locks"]] == [[4102, 5]]
    sampled = CliRunner().invoke(
        cli, ["sample", "--duration", "1s", "--interval", "50ms", "--dsn", dropping_pool.dsn(),
              "--format", "json"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    assert json.loads(sampled.stdout)["samples"] >= 10  # the same query, many times
    assert sampled.stderr.count(PER_TRANSACTION) == 1

    with DiagnosticSession(dropping_pool.dsn(), 1) as session:
        with session.conversation() as connection:
            inside = settings_of(connection)
            backend = connection.execute("SELECT pg_backend_pid()").fetchone()
        assert session.per_transaction
        assert inside == {
            "transaction_read_only": "on", "statement_timeout": "1000", "lock_timeout": "1000",
            "search_path": "pg_catalog", "row_security": "off",
            "idle_in_transaction_session_timeout": "10000",
        }  # fmt: skip
        started = time.monotonic()
        with pytest.raises(ServerError) as cancelled, session.conversation() as connection:
            connection.execute("SELECT pg_catalog.pg_sleep(5)")
        assert time.monotonic() - started < 3  # the server's statement_timeout, at 1s
        assert "canceling statement due to statement timeout" in str(cancelled.value)
        assert not isinstance(cancelled.value, NoAnswer)
        with (
            pytest.raises(ServerError, match="read-only transaction"),
            session.conversation() as connection,
        ):
            connection.execute("CREATE TABLE lockdiag_must_not_write (id int)")
    with psycopg.connect(dropping_pool.dsn(), autocommit=True, prepare_threshold=None) as app:
        assert app.execute("SELECT pg_backend_pid()").fetchone() == backend  # the same backend
        assert settings_of(app) == {
            "transaction_read_only": "off", "statement_timeout": "0", "lock_timeout": "0",
            "search_path": '"$user", public', "row_security": "on",
            "idle_in_transaction_session_timeout": "0",
        }  # fmt: skip
        app.execute("CREATE TABLE pooled_write (id int)")  # the application can write
        app.execute("DROP TABLE pooled_write")


def test_per_transaction_settings_still_name_keys_from_rows(
    cluster: Cluster, dropping_pool: Bouncer, sessions: Sessions
) -> None:
    """The enrichment (its tables locked and vetted in a transaction of its own) runs inside
    lockdiag's per-transaction settings too: Que's job id is named."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE pooled_que")
    try:
        with psycopg.connect(cluster.dsn(dbname="pooled_que"), autocommit=True) as setup:
            setup.execute("CREATE TABLE que_jobs (id bigint PRIMARY KEY, job_class text)")
            setup.execute("INSERT INTO que_jobs VALUES (4242, 'SendInvoice')")
        worker = sessions.open("que-worker", dbname="pooled_que")
        worker.run("SELECT pg_advisory_lock(4242)")
        result = CliRunner().invoke(
            cli, ["list", "--dsn", dropping_pool.dsn(dbname="pooled_que"), "--format", "json"]
        )
        assert result.exit_code == 0, result.output
        (lock,) = json.loads(result.stdout)["locks"]
        assert lock["known"]["software"] == "Que", result.stdout
        sessions.close()
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("DROP DATABASE pooled_que WITH (FORCE)")


def test_a_pooler_that_rejects_the_options_is_one_line_with_the_fix(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    result = CliRunner().invoke(cli, ["list", "--dsn", transaction_pool.dsn(), "--timeout", "1s"])
    assert result.exit_code == 3
    lines = result.stderr.splitlines()
    assert lines[0].startswith("lockdiag: error: cannot connect: ")
    assert lines[0].endswith("unsupported startup parameter: options")
    assert lines[1].startswith("lockdiag: hint: ")
    assert "ignore_startup_parameters = options" in lines[1]
    assert "connect to PostgreSQL directly" in lines[1]
    # the setting is the pooler's, for all its clients: the hint says what it costs them
    assert "drops every client's options silently" in lines[1]
    assert len(lines) == 2 and "Traceback" not in result.output


def test_a_pooler_where_even_a_transaction_cannot_carry_the_settings_is_refused(
    cluster: Cluster,
) -> None:
    """Statement pooling allows no transaction block: lockdiag refuses to read without its
    settings, in one line."""
    bouncer = start_pgbouncer(cluster, "statement", {"ignore_startup_parameters": "options"})
    try:
        result = CliRunner().invoke(cli, ["list", "--dsn", bouncer.dsn(), "--timeout", "1s"])
    finally:
        bouncer.stop()
    assert result.exit_code == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("lockdiag: error:")]
    assert errors == [
        "lockdiag: error: lockdiag cannot apply its settings per transaction (transaction "
        "blocks not allowed in statement pooling mode): refusing to go on without them"
    ]
    assert "ignore_startup_parameters = options" in result.stderr


def test_terminate_acts_on_a_pooled_connection_only_while_no_client_took_it(
    cluster: Cluster,
) -> None:
    """Between the preview and the confirmation a transaction pool may hand the leaked
    server connection to the next client: ending it then ends that client's work."""
    bouncer = start_pgbouncer(cluster, "transaction", {"default_pool_size": "1"})
    backend = leak(bouncer, 434343)
    args = ["-m", "lockdiag", "terminate", str(backend), "--dsn", cluster.dsn(),
            "--pgbouncer", bouncer.console_dsn()]  # fmt: skip
    try:
        child = pexpect.spawn(
            sys.executable,
            args,
            timeout=30,
            dimensions=(40, 250),
            env=TERMINAL_ENV,
            preexec_fn=ctrl_c_reaches_child,
        )
        child.expect_exact(f"pooled server connection of 127.0.0.1:{bouncer.port} (pool "
                           "postgres/postgres, transaction mode): no client attached")  # fmt: skip
        child.expect_exact(f"terminate pid {backend}?")
        with psycopg.connect(bouncer.dsn(), autocommit=False, prepare_threshold=None) as other:
            row = other.execute("SELECT pg_backend_pid()").fetchone()
            assert row == (backend,)  # a pool of one: the next client got that connection
            child.sendline("y")
            child.expect(pexpect.EOF)
            child.close()
            said = child.before.decode()
            assert child.exitstatus == 1, said
            assert "client 127.0.0.1:" in said and "is attached to it now" in said, said
            assert other.execute("SELECT 1").fetchone() == (1,)  # its transaction goes on
        # the client gone, the lock's lost owner is all that is left on it: ended
        done = subprocess.run(
            [sys.executable, *args, "--yes"], capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"pid {backend} ended" in done.stdout + done.stderr
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        bouncer.stop()


def terminate_preview(cluster: Cluster, pid: int, *pooler: str, refused: str = "") -> str:
    """terminate's preview (no terminal to confirm at: it stops there, having done nothing,
    or refuses with ``refused``)."""
    result = CliRunner().invoke(cli, ["terminate", str(pid), "--dsn", cluster.dsn(), *pooler])
    assert result.exit_code == 2 and (refused or "not confirmed") in result.stderr, result.output
    return " ".join(result.stdout.split())


def test_terminate_warns_whose_work_a_pooled_connection_carries(
    cluster: Cluster, transaction_pool: Bouncer
) -> None:
    with psycopg.connect(
        transaction_pool.dsn(), autocommit=False, prepare_threshold=None
    ) as worker:
        row = worker.execute("SELECT pg_advisory_lock(525252), pg_backend_pid()").fetchone()
        assert row is not None
        backend = row[1]
        attached = terminate_preview(
            cluster, backend, "--pgbouncer", transaction_pool.console_dsn(),
            refused="add --end-attached-client to end that client's work too",
        )  # fmt: skip
        assert "is using this server connection now: ending it ends that client's work" in (
            attached
        )
        by_address = terminate_preview(cluster, backend, "--pooler-addr", "127.0.0.1")
        assert "which client uses this server connection is unknown without --pgbouncer" in (
            by_address
        )
        worker.execute("SELECT pg_advisory_unlock(525252)")
