"""A server that accepts the connection and then stops answering (SIGSTOP, a frozen network
path) never hangs lockdiag: every conversation has a client-side deadline of --timeout plus a
margin, after which the command fails with one line and a hint (exit 3), `sample` still ends on
time and `watch` answers q at once.

The server "stops" behind a FreezingProxy: right after the handshake (the first query is never
answered) or in the middle of a conversation (the first query is, the next is not). Commands run
as real processes, each with a timeout of its own: without the deadline they hang and the test
fails at that timeout. Bounds on time are generous (--timeout plus 5 s), never tight, except
for q in watch, which must not wait for the deadline at all.

A server that answers each round trip just in time (a delaying proxy) costs a one-shot command
its --timeout plus the margin as a whole, not the sum of its round trips; and terminate says what
followed its signal (sent; seen gone, not exited within --wait, or unknown) whatever the
deadline, on a backend stopped with SIGSTOP.

And the session lockdiag gets is the one it asked for: row_security = off is in force (a policy
is refused, never run); the PgBouncer cases are in test_pooler.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pexpect
import psycopg
import pytest

from lockdiag.demo.cluster import Bouncer, Cluster, start_pgbouncer
from lockdiag.errors import EXIT_NEGATIVE, EXIT_SERVER, EXIT_UNKNOWN, ServerError
from lockdiag.pg import deadline
from lockdiag.pg.session import DiagnosticSession
from lockdiag.pg.timeout import Timeout

from conftest import OBSERVER, Sessions
from freezer import FreezingProxy

TIMEOUT = 1.0  # --timeout of every command here: the deadline is then 2s
GENEROUS = 5.0  # seconds allowed past --timeout before a test calls it a hang
HANG = 40.0  # the test's own limit: a command still running then is hung
NO_ANSWER = "did not answer within 2s"
MODES = {"after-handshake": 0, "mid-conversation": 1}  # queries answered before the freeze


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[FreezingProxy]:
    with FreezingProxy(cluster.port) as frozen:
        yield frozen


def lockdiag(*args: str, timeout: float = HANG) -> tuple[subprocess.CompletedProcess[str], float]:
    """``lockdiag ARGS`` as a process; how long it took."""
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "lockdiag", *args],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"lockdiag {' '.join(args)} hung for {timeout:g}s")
    return result, time.monotonic() - started


def assert_no_answer(result: subprocess.CompletedProcess[str], code: int = EXIT_SERVER) -> None:
    """One ``lockdiag: error:`` line saying the server did not answer, a hint, no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert "Traceback" not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("lockdiag: error:")]
    assert len(errors) == 1, result.stderr
    assert NO_ANSWER in errors[0], result.stderr
    assert "lockdiag: hint: " in result.stderr


COMMANDS = {
    "list": ["list"],
    "who-holds": ["who-holds", "--key", "4102,73"],
    "blockers": ["blockers"],
    "snapshot": ["snapshot", "-o", "incident.json"],
    "watch --once": ["watch", "--once"],
}


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
@pytest.mark.parametrize("command", COMMANDS, ids=list(COMMANDS))
def test_read_commands_fail_within_the_deadline(
    cluster: Cluster, proxy: FreezingProxy, command: str, mode: str, tmp_path: Path
) -> None:
    proxy.freeze_after_queries(MODES[mode])
    dsn = proxy.dsn(cluster.dsn())
    result, took = lockdiag(*COMMANDS[command], "--dsn", dsn, "--timeout", "1s")
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert_no_answer(result)
    assert not (tmp_path / "incident.json").exists()


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_check_is_unknown_within_the_deadline(
    cluster: Cluster, proxy: FreezingProxy, mode: str
) -> None:
    proxy.freeze_after_queries(MODES[mode])
    dsn = proxy.dsn(cluster.dsn())
    result, took = lockdiag("check", "--format", "nagios", "--dsn", dsn, "--timeout", "1s")
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert_no_answer(result, EXIT_UNKNOWN)
    first = result.stdout.splitlines()[0]
    assert first.startswith("LOCKDIAG UNKNOWN - the server did not answer within 2s"), first


def test_an_established_connection_that_freezes(cluster: Cluster, proxy: FreezingProxy) -> None:
    """A session that worked, then the server stops: the snapshot gives up at the deadline,
    the connection is closed, and once the server answers again the next one reconnects."""
    with DiagnosticSession(proxy.dsn(cluster.dsn()), TIMEOUT) as session:
        session.snapshot("advisory")
        proxy.freeze()
        started = time.monotonic()
        with pytest.raises(deadline.NoAnswer) as raised:
            session.snapshot("advisory")
        took = time.monotonic() - started
        assert 1.5 <= took < TIMEOUT + GENEROUS  # the deadline, not earlier: 1s + 1s margin
        assert raised.value.exit_code == EXIT_SERVER
        assert str(raised.value).startswith(f"the server {NO_ANSWER} (127.0.0.1:{proxy.port})")
        assert "\n" not in str(raised.value)
        proxy.thaw()
        assert session.snapshot("advisory").locks == []


def test_a_slow_server_answers_first_with_its_own_statement_timeout(cluster: Cluster) -> None:
    """The margin lets a live server's statement_timeout error arrive: it is reported as the
    server's cancellation (raise --timeout), not as a server that did not answer."""
    with DiagnosticSession(cluster.dsn(), TIMEOUT) as session:
        with pytest.raises(ServerError) as raised, session.conversation() as connection:
            connection.execute("SELECT pg_catalog.pg_sleep(4)")
        assert not isinstance(raised.value, deadline.NoAnswer)
        assert "statement timeout" in str(raised.value)
        with session.conversation() as connection:  # and the connection is still good
            assert connection.execute("SELECT 1").fetchone() == (1,)


def test_terminate_frozen_before_and_after_the_preview(
    cluster: Cluster, proxy: FreezingProxy, sessions: Sessions
) -> None:
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 73)")
    dsn = proxy.dsn(cluster.dsn())
    proxy.freeze_after_queries(1)  # the preview's snapshot is never answered
    result, took = lockdiag("terminate", str(holder.pid), "--yes", "--dsn", dsn, "--timeout", "1s")
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert_no_answer(result)
    proxy.thaw()
    proxy.freeze_after_queries(2)  # the preview is shown; the signal is never answered
    result, took = lockdiag("terminate", str(holder.pid), "--yes", "--dsn", dsn, "--timeout", "1s")
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert_no_answer(result)
    assert str(holder.pid) in result.stdout  # the preview was shown
    assert f"whether pid {holder.pid} was ended is unknown" in result.stderr
    assert holder.run("SELECT 1") == [(1,)]  # the signal never reached the server


def test_decode_asking_a_frozen_server(cluster: Cluster, proxy: FreezingProxy) -> None:
    """decode --dsn (hashtext() on the server) has the default timeout, 5s: 6s at most."""
    proxy.freeze_after_queries(1)
    result, took = lockdiag("decode", "-1738207498", "--dsn", proxy.dsn(cluster.dsn()))
    assert took < 5 + GENEROUS, f"{took:.1f}s"
    assert result.returncode == EXIT_SERVER and "Traceback" not in result.stderr
    assert "did not answer within 6s" in result.stderr.splitlines()[0]


def test_decode_takes_the_common_connection_options(
    cluster: Cluster, proxy: FreezingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode names its server as every server command does (here --target, from the settings
    file) and is bound by --timeout; without a server named it asks none."""
    settings = tmp_path / "settings.toml"
    settings.write_text(f"[targets.frozen]\ndsn = {json.dumps(proxy.dsn(cluster.dsn()))}\n")
    monkeypatch.setenv("LOCKDIAG_SETTINGS", str(settings))
    proxy.freeze_after_queries(1)
    result, took = lockdiag("decode", "-1738207498", "--target", "frozen", "--timeout", "1s")
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert result.returncode == EXIT_SERVER and "Traceback" not in result.stderr
    assert NO_ANSWER in result.stderr.splitlines()[0]
    offline, _ = lockdiag("decode", "-1738207498", "--timeout", "1s")
    assert offline.returncode == 0 and "not tried without a server" in offline.stdout


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_sample_frozen_from_the_start_ends_on_time(
    cluster: Cluster, proxy: FreezingProxy, mode: str
) -> None:
    proxy.freeze_after_queries(MODES[mode])
    result, took = lockdiag(
        "sample", "--duration", "3s", "--interval", "250ms", "--dsn", proxy.dsn(cluster.dsn()),
        "--timeout", "1s",
    )  # fmt: skip
    assert took < 3 + TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert result.returncode == EXIT_SERVER, result.stderr
    assert f"lockdiag: sample: the server {NO_ANSWER}" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("lockdiag: error: the server did not answer")
    assert "Traceback" not in result.stderr


def test_sample_that_freezes_midway_reports_what_it_sampled(
    cluster: Cluster, proxy: FreezingProxy
) -> None:
    dsn = proxy.dsn(cluster.dsn())
    command = [sys.executable, "-m", "lockdiag", "sample", "--duration", "4s", "--interval",
               "100ms", "--dsn", dsn, "--timeout", "1s", "--format", "json"]  # fmt: skip
    # frozen midway by queries, not by a timer a slow start could outrun: its settings, then
    # a few samples answered, then the server goes silent
    proxy.freeze_after_queries(8)
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True) as run:
        try:
            out, err = run.communicate(timeout=HANG)
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail("sample hung")
    assert proxy.first_accepted is not None, err
    took = time.monotonic() - proxy.first_accepted  # from its first connection
    assert took < 4 + TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert run.returncode == 0, err
    assert f"lockdiag: sample: the server {NO_ANSWER}" in err
    assert json.loads(out)["samples"] > 0 and "Traceback" not in err


def test_sample_bounds_its_last_snapshot_by_the_time_left(
    cluster: Cluster, proxy: FreezingProxy
) -> None:
    """Frozen during a 2s period: the snapshot under way then gets what is left of it plus
    the margin, not the whole --timeout of 10s."""
    command = [sys.executable, "-m", "lockdiag", "sample", "--duration", "2s", "--interval",
               "100ms", "--dsn", proxy.dsn(cluster.dsn()), "--timeout", "10s"]  # fmt: skip
    proxy.freeze_after_queries(12)  # some samples answered, then a snapshot left hanging
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True) as run:
        try:
            _, err = run.communicate(timeout=HANG)
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail("sample hung")
    assert proxy.first_accepted is not None, err
    took = time.monotonic() - proxy.first_accepted  # from its first connection, not python's start
    assert took < 2 + Timeout(10).margin + 2, f"{took:.1f}s: {err}"
    assert "lockdiag: sample: the server did not answer" in err


def test_fleet_with_one_frozen_target(cluster: Cluster, proxy: FreezingProxy) -> None:
    """The healthy target is read; the frozen one is an error line, after its deadline."""
    proxy.freeze_after_queries(0)
    result, took = lockdiag(
        "list", "--dsn", cluster.dsn(), "--dsn", proxy.dsn(cluster.dsn()), "--timeout", "1s"
    )
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert result.returncode == EXIT_SERVER and "Traceback" not in result.stderr
    assert f"127.0.0.1:{cluster.port}/postgres" in result.stdout
    assert f"127.0.0.1:{proxy.port}/postgres: the server {NO_ANSWER}" in result.stderr


@pytest.fixture
def bouncer(cluster: Cluster) -> Iterator[Bouncer]:
    pooler = start_pgbouncer(cluster, "transaction")
    yield pooler
    pooler.stop()


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_frozen_pgbouncer_console_is_a_note(cluster: Cluster, bouncer: Bouncer, mode: str) -> None:
    """A console that stops answering (SHOW SERVERS, or SHOW CLIENTS after it) costs its
    deadline, and the answer goes on without it, saying so."""
    with FreezingProxy(bouncer.port) as console:
        console.freeze_after_queries(MODES[mode])
        result, took = lockdiag(
            "list", "--dsn", cluster.dsn(), "--pgbouncer", console.dsn(bouncer.console_dsn()),
            "--timeout", "1s",
        )  # fmt: skip
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert result.returncode == 0, result.stderr
    assert (
        f"cannot read PgBouncer console: PgBouncer did not answer within 2s "
        f"(127.0.0.1:{console.port})"
    ) in result.stdout


def test_pooltest_through_a_frozen_pool(cluster: Cluster, bouncer: Bouncer) -> None:
    with FreezingProxy(bouncer.port) as pool:
        pool.freeze_after_queries(0)
        result, took = lockdiag(
            "pooltest", "--pooled", pool.dsn(bouncer.dsn()), "--direct", cluster.dsn(),
            "--timeout", "1s",
        )  # fmt: skip
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    assert_no_answer(result)


# -- watch on a real pseudo-terminal -----------------------------------------------------------


WATCH_TIMEOUT = "3s"  # the deadline is 4s: q at once means well before it
QUIT = 2.5  # seconds q may take to end watch, whatever the server does
TERMINAL_ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def spawn_watch(dsn: str, directory: Path) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable, ["-m", "lockdiag", "watch", "--interval", "300ms", "--dsn", dsn,
                         "--timeout", WATCH_TIMEOUT],
        cwd=str(directory), dimensions=(30, 150), timeout=HANG, env=TERMINAL_ENV,
    )  # fmt: skip


def quit_at_once(child: pexpect.spawn) -> float:
    started = time.monotonic()
    child.send("q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return time.monotonic() - started


def test_watch_quits_at_once_when_frozen_after_the_handshake(
    cluster: Cluster, proxy: FreezingProxy, tmp_path: Path
) -> None:
    """The first snapshot never comes: q, pressed while watch waits for it, quits at once
    (not at the deadline), and a frame was drawn meanwhile."""
    proxy.freeze_after_queries(0)
    child = spawn_watch(proxy.dsn(cluster.dsn()), tmp_path)
    try:
        child.expect_exact("lockdiag watch")  # the first frame, though no snapshot came
        time.sleep(0.5)
        assert quit_at_once(child) < QUIT
    finally:
        child.close(force=True)


def test_watch_frozen_mid_session_shows_it_and_quits_at_once(
    cluster: Cluster, proxy: FreezingProxy, sessions: Sessions, tmp_path: Path
) -> None:
    sessions.open("holder").run("SELECT pg_advisory_lock(4102, 9)")
    child = spawn_watch(proxy.dsn(cluster.dsn()), tmp_path)
    try:
        child.expect_exact("unregistered pair (4102, 9)")
        child.expect_exact("refresh #2")
        proxy.freeze()
        child.expect(rb"refresh late: no answer from the server for \d")
        child.expect(rb"connection lost \S+ ago .{1,4} showing the frame of \d\d:\d\d:\d\d; "
                     rb"retrying: the server did not answer within 4s")  # fmt: skip
        child.expect(rb"refresh late")  # retrying, frozen again: the key loop still answers
        assert quit_at_once(child) < QUIT
    finally:
        child.close(force=True)


def test_watch_recovers_when_the_server_answers_again(
    cluster: Cluster, proxy: FreezingProxy, sessions: Sessions, tmp_path: Path
) -> None:
    child = spawn_watch(proxy.dsn(cluster.dsn()), tmp_path)
    try:
        child.expect_exact("refresh #2")
        proxy.freeze()
        child.expect_exact("connection lost")
        proxy.thaw()
        child.expect(rb"refresh #[3-9]")
        assert quit_at_once(child) < QUIT
    finally:
        child.close(force=True)


def test_the_watchdog_wakes_a_blocked_call_and_closes_the_connection(
    cluster: Cluster, proxy: FreezingProxy
) -> None:
    """The mechanism alone: a statement on a frozen connection is woken at its deadline by
    shutting the socket down (psycopg raises OperationalError, seen as NoAnswer); the
    connection is closed, and an interrupt from another thread wakes one at once."""
    connection = deadline.connect(proxy.dsn(cluster.dsn()), Timeout(0.5), autocommit=True)
    assert connection.execute("SELECT 1").fetchone() == (1,)
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(deadline.NoAnswer):
        connection.execute("SELECT 2")
    assert 1.2 < time.monotonic() - started < 0.5 + GENEROUS  # 0.5s + 1s margin
    assert connection.closed
    proxy.thaw()
    connection = deadline.connect(proxy.dsn(cluster.dsn()), Timeout(30), autocommit=True)
    proxy.freeze()
    threading.Timer(0.5, deadline.interrupt, [connection]).start()
    started = time.monotonic()
    with pytest.raises(deadline.NoAnswer):
        connection.execute("SELECT 3")
    assert time.monotonic() - started < 3
    assert connection.closed


def test_an_answer_in_time_is_untouched(cluster: Cluster) -> None:
    """Statements that finish in time are never disturbed, however many run: the deadline
    of a finished statement never fires on the next one."""
    connection = deadline.connect(cluster.dsn(), Timeout(0.2), autocommit=True)
    try:
        for _ in range(50):
            assert connection.execute("SELECT 1 FROM pg_catalog.pg_sleep(0.01)").fetchone() == (1,)
        time.sleep(1.5)  # every alarm of those statements has come and gone
        assert connection.execute("SELECT 1").fetchone() == (1,)
        assert not connection.closed
    finally:
        connection.close()


def test_psycopg_errors_stay_psycopg_errors(cluster: Cluster) -> None:
    connection = deadline.connect(cluster.dsn(), Timeout(2), autocommit=True)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            connection.execute("SELECT 1 / 0")
        assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        connection.close()


# -- the session's settings, verified ----------------------------------------------------------


def test_row_security_off_refuses_rather_than_runs_a_policy(
    cluster: Cluster, sessions: Sessions
) -> None:
    """With row_security = off, a query that a policy would filter fails instead of running the
    policy's code in lockdiag's session; the same read with row security on runs it."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(
            "CREATE FUNCTION public.lockdiag_policy_ran() RETURNS boolean LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'policy code ran as %', current_user; END $$"
        )
        admin.execute("CREATE TABLE public.guarded (id int)")
        admin.execute("INSERT INTO public.guarded VALUES (1)")
        admin.execute("ALTER TABLE public.guarded ENABLE ROW LEVEL SECURITY")
        admin.execute("CREATE POLICY p ON public.guarded USING (public.lockdiag_policy_ran())")
        admin.execute(f"GRANT SELECT ON public.guarded TO {OBSERVER}")
    try:
        with (
            psycopg.connect(cluster.dsn(user=OBSERVER), autocommit=True) as plain,
            pytest.raises(psycopg.errors.RaiseException, match="policy code ran"),
        ):
            plain.execute("SELECT count(*) FROM public.guarded")  # the plant is live
        with DiagnosticSession(cluster.dsn(user=OBSERVER), TIMEOUT) as session:
            with pytest.raises(ServerError) as refused, session.conversation() as connection:
                connection.execute("SELECT count(*) FROM public.guarded")
            assert not session.per_transaction  # a direct connection applies the options
        assert "would be affected by row-level security policy" in str(refused.value)
        assert "policy code ran" not in str(refused.value)
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("DROP TABLE public.guarded")
            admin.execute("DROP FUNCTION public.lockdiag_policy_ran()")


# -- a slow server: --timeout bounds the whole command -----------------------------------------

SLOW_TIMEOUT = 5.0  # --timeout of the commands below: the whole command gets 6s
DELAY = 4.0  # each round trip (the handshake's too): each alone is well within --timeout
WHOLE = "did not answer within 6s"
WHOLE_NOTE = "--timeout bounds the whole exchange, every round trip included"


def test_one_shot_commands_are_bounded_as_a_whole(
    cluster: Cluster, proxy: FreezingProxy, sessions: Sessions
) -> None:
    """Every round trip answered in 4s, under --timeout 5s: each command ends at its 6s (plus
    a margin of its own), with one clear line, not after the sum of its round trips (12s and
    more: 37.5s for check in the issue). The four run side by side."""
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 73)")
    proxy.delay(DELAY)
    dsn = proxy.dsn(cluster.dsn(sslmode="disable"))  # connecting is one round trip then
    commands = {
        "check": (["check", "--format", "nagios"], EXIT_UNKNOWN),
        "list": (["list"], EXIT_SERVER),
        "who-holds": (["who-holds", "--key", "4102,73"], EXIT_SERVER),
        "terminate": (["terminate", str(holder.pid), "--yes"], EXIT_SERVER),
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        runs = {
            name: pool.submit(lockdiag, *args, "--dsn", dsn, "--timeout", "5s")
            for name, (args, _) in commands.items()
        }
        results = {name: run.result() for name, run in runs.items()}
    for name, (result, took) in results.items():
        output = result.stdout + result.stderr
        assert took < SLOW_TIMEOUT + Timeout(SLOW_TIMEOUT).margin + GENEROUS, (name, took)
        assert result.returncode == commands[name][1], (name, output)
        assert "Traceback" not in output, name
        errors = [line for line in result.stderr.splitlines() if line.startswith("lockdiag: err")]
        assert len(errors) == 1 and WHOLE in errors[0] and WHOLE_NOTE in errors[0], (name, output)
    first = results["check"][0].stdout.splitlines()[0]
    assert first.startswith(f"LOCKDIAG UNKNOWN - the server {WHOLE}"), first
    assert holder.run("SELECT 1") == [(1,)]  # terminate never got to the signal


def test_a_budget_bounds_every_round_trip_of_a_block(
    cluster: Cluster, proxy: FreezingProxy
) -> None:
    """The mechanism alone: in a budget of 1s (2s with the margin), round trips of 0.4s each
    (BEGIN and COMMIT as well as the statements) end in NoAnswer at the budget, and the
    connection is closed; outside a budget the same round trips go on."""
    connection = deadline.connect(proxy.dsn(cluster.dsn()), Timeout(5), autocommit=True)
    proxy.delay(0.4)
    for _ in range(6):  # 2.4s or more, each round trip well within its own deadline
        with connection.transaction():
            connection.execute("SELECT 1")
    started = time.monotonic()
    with Timeout(1.0).budget(), pytest.raises(deadline.NoAnswer) as raised:
        while True:
            with connection.transaction():
                connection.execute("SELECT 1")
    took = time.monotonic() - started
    assert 1.5 < took < 2 + GENEROUS, f"{took:.1f}s"
    assert WHOLE_NOTE in str(raised.value) and "within 2s" in str(raised.value)
    assert connection.closed


def test_begin_and_commit_have_a_deadline(cluster: Cluster, proxy: FreezingProxy) -> None:
    """A frozen server at the BEGIN of ``transaction()`` (as enrichment opens one): woken at
    the deadline like a statement, not left waiting for ever."""
    connection = deadline.connect(proxy.dsn(cluster.dsn()), Timeout(0.5), autocommit=True)
    proxy.freeze()
    raised: list[BaseException] = []

    def begin() -> None:
        try:
            with connection.transaction():
                pass
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=begin, daemon=True)
    thread.start()
    thread.join(0.5 + GENEROUS)
    proxy.thaw()  # a hung BEGIN ends now, and the test fails below
    thread.join(5)
    assert raised and isinstance(raised[0], deadline.NoAnswer), raised
    assert connection.closed


# -- terminate tells what followed its signal --------------------------------------------------


def test_terminate_a_stopped_backend_says_the_signal_was_sent(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A backend stopped (SIGSTOP) when it is signalled cannot act on the signal: terminate
    says it sent it and saw no exit within --wait (3s, over --timeout 2s), exit 1, never a
    cancelled query; resumed, the backend ends."""
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 74)")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        result, took = lockdiag(
            "terminate", str(holder.pid), "--yes", "--wait", "3s", "--timeout", "2s",
            "--dsn", cluster.dsn(),
        )  # fmt: skip
        # still there while stopped
        sessions.until(lambda admin: alive(admin, holder.pid), 5, "the stopped backend")
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_NEGATIVE, output
    assert f"signal sent to pid {holder.pid}; the backend had not exited within 3s" in (
        result.stderr
    )
    assert "lockdiag: error" not in output and "cancelled" not in output
    assert "Traceback" not in output
    assert 3 <= took < 3 + 2 + GENEROUS, f"{took:.1f}s"
    sessions.until(lambda admin: not alive(admin, holder.pid), 10, "the resumed backend to end")


def test_terminate_whose_look_after_the_signal_fails_says_the_signal_was_sent(
    cluster: Cluster, proxy: FreezingProxy, sessions: Sessions
) -> None:
    """The server stops answering right after the signal: terminate says the signal was sent
    and that whether the backend exited is unknown (exit 1), not only an error."""
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 75)")
    proxy.freeze_after_queries(3)  # the settings, the preview, the signal; then silence
    result, took = lockdiag(
        "terminate", str(holder.pid), "--yes", "--dsn", proxy.dsn(cluster.dsn()),
        "--timeout", "1s",
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_NEGATIVE, output
    assert (
        f"signal sent to pid {holder.pid}; whether the backend has exited is unknown: lockdiag "
        f"could not look after"
    ) in result.stderr
    assert NO_ANSWER in result.stderr and "Traceback" not in output
    assert took < TIMEOUT + GENEROUS, f"{took:.1f}s"
    sessions.until(lambda admin: not alive(admin, holder.pid), 10, "the signalled backend to end")


def alive(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] > 0


# -- a DSN of several hosts: --timeout bounds connecting to all of them -------------------------


@pytest.fixture
def silent_hosts() -> Iterator[list[int]]:
    """Four ports that accept a connection and never answer (the kernel completes the TCP
    handshake; nothing reads the startup packet), as a frozen server does."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    try:
        yield [listener.getsockname()[1] for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()


def test_several_silent_hosts_share_one_timeout(silent_hosts: list[int]) -> None:
    """libpq's connect_timeout applies to each host in turn: four silent hosts at --timeout 1s
    took 8.2s. The whole connection is bounded now (libpq's 2s at least), and the message says
    how many hosts the time left untried."""
    ports = ",".join(map(str, silent_hosts))
    dsn = f"host={','.join(['127.0.0.1'] * 4)} port={ports} user=nobody dbname=nothing"
    for args, code in ((["list"], EXIT_SERVER), (["check", "--format", "nagios"], EXIT_UNKNOWN)):
        result, took = lockdiag(*args, "--dsn", dsn, "--timeout", "1s")
        assert took < 2 + GENEROUS / 2, f"{args}: {took:.1f}s"
        assert result.returncode == code, result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        assert "more host(s) not tried: the time to connect ran out" in result.stderr


def test_a_silent_host_leaves_time_for_the_next(cluster: Cluster, silent_hosts: list[int]) -> None:
    """The hosts share the time: two silent hosts first do not spend all of it (each had 5s:
    10s before the live one), and the live server listed after them answers within the one
    --timeout (6s with the margin: 2s each)."""
    ports = f"{silent_hosts[0]},{silent_hosts[1]},{cluster.port}"
    dsn = cluster.dsn(host="127.0.0.1,127.0.0.1,127.0.0.1", port=ports)
    result, took = lockdiag("list", "--dsn", dsn, "--timeout", "5s")
    assert result.returncode == 0, result.stderr
    assert took < 5 + Timeout(5).margin + 1.5, f"{took:.1f}s"


def test_a_frozen_proxy_spins_no_core(cluster: Cluster, proxy: FreezingProxy) -> None:
    """The test's frozen server costs no CPU: a frozen link's socket stays readable (the bytes
    are left in the kernel), and the relay used to wake on it 20,000 times a second. Measured
    as this process's CPU while a frozen query waits."""
    connection = psycopg.connect(proxy.dsn(cluster.dsn()), autocommit=True)
    proxy.freeze()  # the query's bytes stay in the kernel, the socket readable
    waiting = threading.Thread(target=connection.execute, args=("SELECT 1",), daemon=True)
    waiting.start()
    time.sleep(0.3)  # the query is sent, frozen in the proxy
    before = time.process_time()
    time.sleep(1.0)
    spent = time.process_time() - before
    proxy.thaw()  # the query is answered
    waiting.join(5)
    assert not waiting.is_alive()
    connection.close()
    assert spent < 0.3, f"{spent:.2f}s of CPU in 1s while frozen"
