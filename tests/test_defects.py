"""Defects a newcomer met, each pinned by the command that showed it (no server needed)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INCIDENT = str(EXAMPLES / "incident.json")
BUNDLED_REGISTRY = str(EXAMPLES / "lockdiag.toml")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def error_lines(result: Result) -> list[str]:
    return result.stderr.splitlines()


# -- 1. watch --from reads a snapshot file as a recording of one frame -------------------------


def test_watch_replays_a_snapshot_file_as_one_frame() -> None:
    result = run("watch", "--from", INCIDENT, "--registry", BUNDLED_REGISTRY, "--once")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()
    assert "invalid JSON" not in result.stderr
    # the same file as `list --from` reads it: the same source in the frame
    assert "127.0.0.1:54329/shop" in result.stdout


def test_watch_replays_what_snapshot_o_wrote(tmp_path: Path) -> None:
    """The writer of `lockdiag snapshot -o` (snapshot_file.save), on the example's snapshot."""
    from lockdiag.core import snapshot_file

    saved = tmp_path / "saved.json"
    snapshot_file.save(snapshot_file.load(Path(INCIDENT)), saved)
    result = run("watch", "--from", str(saved), "--once")
    assert result.exit_code == 0, result.stderr
    assert "127.0.0.1:54329/shop" in result.stdout


def test_watch_still_replays_a_recording_of_many_frames(tmp_path: Path) -> None:
    from lockdiag.core import snapshot_file

    snapshot = snapshot_file.load(Path(INCIDENT))
    recording = tmp_path / "incident.jsonl"
    line = snapshot_file.record_line(snapshot)
    recording.write_text(f"{line}\n\n{line}\n")
    result = run("watch", "--from", str(recording), "--once")
    assert result.exit_code == 0, result.stderr
    assert "127.0.0.1:54329/shop" in result.stdout


def test_watch_names_the_file_and_line_of_a_broken_snapshot_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{\n "format": "lockdiag-snapshot",\n "version": \n}\n')
    result = run("watch", "--from", str(broken), "--once")
    assert result.exit_code == 2
    assert error_lines(result) == [
        f"lockdiag: error: {broken}:4: not a snapshot file: invalid JSON (Expecting value)"
    ]


# -- 2. exporter --listen: a bad address is one line, exit 2 ------------------------------------


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("127.0.0.1:70000", "port 70000 is out of range"),
        ("127.0.0.1:65536", "port 65536 is out of range"),
        ("127.0.0.1:0", "port 0"),
        ("127.0.0.1:http", "give HOST:PORT"),
        ("127.0.0.1:-1", "give HOST:PORT"),
        ("127.0.0.1:", "give HOST:PORT"),
        (":0", "port 0 would be any free port"),  # ":9714" is every interface: accepted
        ("9714", "give HOST:PORT"),
        ("[::1:9714", "give HOST:PORT"),
        (f"{'a' * 64}.example:9714", "cannot listen on"),
        ("bad\x00host:9714", "give HOST:PORT"),
    ],
)
def test_exporter_refuses_a_bad_listen_address_in_one_line(listen: str, reason: str) -> None:
    result = run("exporter", "--listen", listen)
    assert result.exit_code == 2, (result.exception, result.stderr)
    (line,) = error_lines(result)
    assert line.startswith("lockdiag: error: ")
    assert reason in line


# -- 3. usage errors are one line: lockdiag: error: ... -----------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (["list", "--nope"], 2, "lockdiag: error: No such option '--nope'."),
        (
            ["list", "--for", "json"],
            2,
            "lockdiag: error: No such option '--for'. (Did you mean one of: '--format', '--from'?)",
        ),
        (["lst"], 2, "lockdiag: error: No such command 'lst'. Did you mean 'list'?"),
        (["--nope"], 2, "lockdiag: error: No such option '--nope'."),
        (["registry", "nope"], 2, "lockdiag: error: No such command 'nope'."),
        (["key"], 2, "lockdiag: error: Missing argument 'NAMESPACE'."),
        (
            ["list", "--format", "xml"],
            2,
            "lockdiag: error: Invalid value for '--format': 'xml' is not one of 'auto', "
            "'table', 'plain', 'json', 'markdown', 'csv'.",
        ),
        (["watch", "--interval", "soon"], 2, None),
        (["check", "--nope"], 3, "lockdiag: error: No such option '--nope'."),
        (["check", "--wait-age", "soon"], 3, None),
    ],
)
def test_a_usage_error_is_one_line(args: list[str], code: int, line: str | None) -> None:
    result = run(*args)
    assert result.exit_code == code, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith("lockdiag: error: ")
    if line is not None:
        assert lines == [line]
    # check, a monitoring plugin, says UNKNOWN on stdout too (tests/test_check_failures.py)
    said = lines[0].removeprefix("lockdiag: error: ")
    assert result.stdout == (f"UNKNOWN: {said}\n" if args[0] == "check" else "")


def test_no_arguments_still_shows_the_help() -> None:
    result = run()
    assert result.exit_code == 2
    assert "Commands:" in result.stderr + result.stdout
    registry = run("registry")
    assert "Commands:" in registry.stderr + registry.stdout


def test_a_usage_error_is_one_line_from_the_real_entry_point(tmp_path: Path) -> None:
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "lockdiag", "list", "--nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr == "lockdiag: error: No such option '--nope'.\n"
    assert completed.stdout == ""


# -- 4. a registry path that does not exist warns, like a broken one ----------------------------

GOING_ON = (
    "lockdiag: warning: going on with raw keys and well-known software's keys "
    "(lockdiag registry check lists every problem)"
)


def test_a_missing_registry_option_warns_and_list_goes_on() -> None:
    result = run("list", "--from", INCIDENT, "--registry", "/nope.toml")
    assert result.exit_code == 0, result.stderr
    assert error_lines(result)[:2] == [
        "lockdiag: warning: registry not used: /nope.toml: no such file (from --registry)",
        GOING_ON,
    ]
    assert result.stdout.strip()


def test_a_missing_registry_from_the_environment_warns_and_list_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKDIAG_REGISTRY", "/nope.toml")
    result = run("list", "--from", INCIDENT)
    assert result.exit_code == 0, result.stderr
    assert error_lines(result)[:2] == [
        "lockdiag: warning: registry not used: /nope.toml: no such file (from LOCKDIAG_REGISTRY)",
        GOING_ON,
    ]


def test_a_registry_path_that_is_a_directory_warns(tmp_path: Path) -> None:
    result = run("list", "--from", INCIDENT, "--registry", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert error_lines(result)[:2] == [
        f"lockdiag: warning: registry not used: {tmp_path}: not a file (from --registry)",
        GOING_ON,
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["key", "tenant_summary", "1"],
        ["registry", "show"],
        ["registry", "check"],
    ],
)
def test_a_missing_registry_still_stops_the_commands_that_need_it(args: list[str]) -> None:
    result = run(*args, "--registry", "/nope.toml")
    assert result.exit_code == 2
    assert error_lines(result) == [
        "lockdiag: error: registry file /nope.toml (from --registry) does not exist"
    ]


def test_who_holds_a_name_without_the_registry_fails() -> None:
    result = run("who-holds", "tenant_summary", "73", "--from", INCIDENT, "--registry", "/nope")
    assert result.exit_code == 2
    assert "registry not used: /nope: no such file" in result.stderr
    assert "lockdiag: error: " in result.stderr


# -- 5. a pooler that refuses the startup options: the hint names the fix -----------------------


@pytest.fixture
def refusing_pooler() -> Iterator[int]:
    """A listener that answers every startup packet as PgBouncer does when it does not
    accept the ``options`` parameter."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def answer(connection: socket.socket) -> None:
        with connection:
            while True:
                head = connection.recv(8, socket.MSG_WAITALL)
                if len(head) < 8:
                    return
                length, code = struct.unpack("!ii", head)
                if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest
                    connection.sendall(b"N")
                    continue
                connection.recv(length - 8, socket.MSG_WAITALL)
                fields = b"".join(
                    kind + text + b"\0"
                    for kind, text in (
                        (b"S", b"FATAL"),
                        (b"V", b"FATAL"),
                        (b"C", b"08P01"),
                        (b"M", b"unsupported startup parameter: options"),
                    )
                )
                body = fields + b"\0"
                connection.sendall(b"E" + struct.pack("!i", len(body) + 4) + body)
                return

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            answer(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_pooler_refusing_the_startup_options_gets_the_hint(refusing_pooler: int) -> None:
    dsn = f"host=127.0.0.1 port={refusing_pooler} user=app dbname=app sslmode=disable"
    result = run("list", "--dsn", dsn, "--timeout", "2s")
    assert result.exit_code == 3, result.stderr
    lines = error_lines(result)
    assert lines[0].startswith("lockdiag: error: cannot connect: ")
    assert lines[0].endswith("unsupported startup parameter: options")
    assert lines[1].startswith("lockdiag: hint: ")
    assert "connect to PostgreSQL directly" in lines[1]
    assert "ignore_startup_parameters = options" in lines[1]
    assert len(lines) == 2
