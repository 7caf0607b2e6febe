"""`lockdiag check` never goes silent: every way it can fail (no server, a frozen one, a bad
--from, a named registry that is missing or broken, a broken settings file, bad arguments, a
bug) is UNKNOWN, exit 3, said in the format asked for, so that Nagios/NRPE (which drops stderr)
and node_exporter's textfile collector (which reads a file) see the failure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, free_port
from lockdiag.errors import EXIT_UNKNOWN

from helpers.cli import run
from helpers.freezer import FreezingProxy
from helpers.servers import Sessions

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INCIDENT = str(EXAMPLES / "incident.json")
REGISTRY = str(EXAMPLES / "lockdiag.toml")
FORMATS = ["plain", "json", "markdown", "nagios", "prometheus"]

Setup = Callable[[pytest.FixtureRequest, Path, pytest.MonkeyPatch], list[str]]


def server_down(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    return ["--dsn", f"host=127.0.0.1 port={free_port()} user=x", "--timeout", "2s"]


def frozen_server(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    proxy: FreezingProxy = request.getfixturevalue("frozen")
    cluster: Cluster = request.getfixturevalue("cluster")
    return ["--dsn", proxy.dsn(cluster.dsn()), "--timeout", "1s"]


def missing_from(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    return ["--from", str(tmp / "nope.json")]


def broken_from(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    (tmp / "broken.json").write_text("{")
    return ["--from", str(tmp / "broken.json")]


def missing_registry_option(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    return ["--from", INCIDENT, "--registry", "/nope.toml"]


def missing_registry_environment(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    env.setenv("LOCKDIAG_REGISTRY", "/nope.toml")
    return ["--from", INCIDENT]


def missing_registry_settings(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    (tmp / "settings.toml").write_text('[defaults]\nregistry = "/nope.toml"\n')
    env.setenv("LOCKDIAG_SETTINGS", str(tmp / "settings.toml"))
    return ["--from", INCIDENT]


def broken_registry(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    (tmp / "named.toml").write_text("[namespaces.a]\nid = 'x'\n[namespaces.b]\nid = 'y'\n")
    return ["--from", INCIDENT, "--registry", str(tmp / "named.toml")]


def broken_found_registry(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    (tmp / "lockdiag.toml").write_text("[namespaces.a]\nid = 'x'\n")  # found, not named
    return ["--from", INCIDENT]


def broken_settings(
    request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch
) -> list[str]:
    (tmp / "settings.toml").write_text("[check]\nwait-age = 'soon'\n")
    env.setenv("LOCKDIAG_SETTINGS", str(tmp / "settings.toml"))
    return ["--from", INCIDENT, "--registry", REGISTRY]


def bad_argument(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    return ["--from", INCIDENT, "--wait-age", "soon"]


def a_bug(request: pytest.FixtureRequest, tmp: Path, env: pytest.MonkeyPatch) -> list[str]:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    # the view is imported when the answer is made (lockdiag.evidence.overlap), not by alerts
    env.setattr("lockdiag.views.check.fleet_check_output", broken)
    return ["--from", INCIDENT, "--registry", REGISTRY]


# each failure, and what its UNKNOWN line must say (the file and the problem, for a file)
FAILURES: dict[str, tuple[Setup, str]] = {
    "server down": (server_down, "cannot connect: connection failed"),
    "frozen server": (frozen_server, "cannot connect: connection timeout expired"),
    "missing --from": (missing_from, "nope.json: No such file or directory"),
    "broken --from": (broken_from, "broken.json:1: not a snapshot file: invalid JSON"),
    "missing --registry": (
        missing_registry_option, "registry file /nope.toml (from --registry) does not exist"
    ),
    "missing LOCKDIAG_REGISTRY": (
        missing_registry_environment,
        "registry file /nope.toml (from LOCKDIAG_REGISTRY) does not exist",
    ),
    "missing settings registry": (
        missing_registry_settings,
        "registry file /nope.toml (from the settings file) does not exist",
    ),
    "broken registry": (
        broken_registry, "named.toml:2: namespace 'a': id must be an integer, not 'x'"
    ),
    "broken ./lockdiag.toml": (
        broken_found_registry, "lockdiag.toml:2: namespace 'a': id must be an integer"
    ),
    "broken settings file": (broken_settings, "settings.toml line 2: "),
    "bad argument": (bad_argument, "'soon' is not a duration"),
    "a bug": (a_bug, "internal error: RuntimeError: boom (a bug in lockdiag)"),
}  # fmt: skip


@pytest.fixture
def frozen(cluster: Cluster) -> Iterator[FreezingProxy]:
    with FreezingProxy(cluster.port) as proxy:
        proxy.freeze()
        yield proxy


def check(*args: str) -> Result:
    return run("check", *args)


def said(fmt: str, stdout: str) -> str:
    """Why check was UNKNOWN, read from its output in ``fmt`` (which must be the whole of it,
    in that format's shape)."""
    lines = stdout.splitlines()
    if fmt == "json":
        document = json.loads(stdout)
        assert document["version"] == 1 and document["status"] == "UNKNOWN", document
        return str(document["error"])
    if fmt == "prometheus":
        families = {f.name: f for f in text_string_to_metric_families(stdout)}
        assert list(families) == ["lockdiag_up"], stdout
        assert [(s.name, s.labels, s.value) for s in families["lockdiag_up"].samples] == [
            ("lockdiag_up", {}, 0.0)
        ]
        (comment,) = [line for line in lines if line.startswith("# lockdiag error: ")]
        return comment.removeprefix("# lockdiag error: ")
    assert len(lines) == 1, stdout
    if fmt == "nagios":
        assert lines[0].startswith("LOCKDIAG UNKNOWN - "), stdout
        return lines[0].removeprefix("LOCKDIAG UNKNOWN - ")
    if fmt == "markdown":
        assert lines[0].startswith("**UNKNOWN: ") and lines[0].endswith("**"), stdout
        return re.sub(r"\\(.)", r"\1", lines[0][len("**UNKNOWN: ") : -2])  # md_escape undone
    assert lines[0].startswith("UNKNOWN: "), stdout
    return lines[0].removeprefix("UNKNOWN: ")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("failure", list(FAILURES))
def test_every_failure_is_unknown_in_every_format(
    failure: str,
    fmt: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup, reason = FAILURES[failure]
    result = check(*setup(request, tmp_path, monkeypatch), "--format", fmt)
    assert result.exit_code == EXIT_UNKNOWN, (result.stdout, result.stderr)
    reported = said(fmt, result.stdout)
    assert reason in reported, result.stdout
    if failure == "broken registry":  # two errors: JSON has both, a line the first and a count
        assert "named.toml:4: " in reported if fmt == "json" else reported.endswith("(+1 more)")
    assert "lockdiag: error: " in result.stderr
    assert ("Traceback" in result.stderr) == (failure == "a bug")  # a bug's only on stderr
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("spelling", [["--format", "nagios"], ["--format=nagios"]])
def test_bad_arguments_are_said_in_the_format_given_with_them(spelling: list[str]) -> None:
    result = check("--from", INCIDENT, "--nope", *spelling)
    assert result.exit_code == EXIT_UNKNOWN
    assert result.stdout == "LOCKDIAG UNKNOWN - No such option '--nope'.\n"
    assert check("--from", INCIDENT, "--format", "xml").stdout.startswith("UNKNOWN: ")


def test_bad_arguments_are_said_in_the_format_of_the_settings_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "settings.toml").write_text('[check]\nformat = "prometheus"\n')
    monkeypatch.setenv("LOCKDIAG_SETTINGS", str(tmp_path / "settings.toml"))
    result = check("--from", INCIDENT, "--wait-age", "soon")
    assert result.exit_code == EXIT_UNKNOWN
    assert said("prometheus", result.stdout) == (
        "Invalid value for '--wait-age': 'soon' is not a duration (examples: 250ms, 90s, 5m, "
        "1h30m, 2d)"
    )


def test_the_textfile_collector_gets_a_valid_file_either_way(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """What the documented shell redirection leaves in the file, checked by promtool: the
    check's series with lockdiag_up 1, or lockdiag_up 0 and why; never an empty file."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/run does)"
    sessions.open("holder").run("SELECT pg_advisory_lock(4102, 73)")
    down = f"host=127.0.0.1 port={free_port()} user=x"
    written = {}
    for name, dsn, status in [("up", cluster.dsn(), 0), ("down", down, EXIT_UNKNOWN)]:
        target = tmp_path / f"{name}.prom"
        with target.open("w") as file:
            ran = subprocess.run(
                [sys.executable, "-m", "lockdiag", "check", "--format", "prometheus",
                 "--no-unregistered", "--dsn", dsn, "--timeout", "2s"],
                stdout=file, stderr=subprocess.PIPE, text=True, check=False, timeout=60,
            )  # fmt: skip
        assert ran.returncode == status, ran.stderr
        linted = subprocess.run(
            [promtool, "check", "metrics"], stdin=target.open(), capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert linted.returncode == 0, linted.stdout + linted.stderr
        written[name] = {
            sample.name: sample.value
            for family in text_string_to_metric_families(target.read_text())
            for sample in family.samples
            if not sample.labels
        }
    assert written["up"]["lockdiag_up"] == 1.0 and "lockdiag_waiting_sessions" in written["up"]
    assert written["down"] == {"lockdiag_up": 0.0}


REGISTERED = '[namespaces.tenant_summary]\nid = 4102\nexpect = "session"\n'


def test_a_named_registry_gone_is_unknown_not_a_verdict_without_its_rules(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """The registry says tenant_summary (4102) locks are meant to be held by a session: with
    it, a held one is OK; without it (missing or broken) check would call it an unregistered
    namespace and WARN; named and gone, it is UNKNOWN; never named, check runs as before."""
    sessions.open("leader").run("SELECT pg_advisory_lock(4102, 73)")
    registry = tmp_path / "ops.toml"
    registry.write_text(REGISTERED)
    dsn = ["--dsn", cluster.dsn(), "--format", "nagios", "--session-age", "0s"]
    assert check(*dsn, "--registry", str(registry)).exit_code == 0
    registry.unlink()
    gone = check(*dsn, "--registry", str(registry))
    assert gone.exit_code == EXIT_UNKNOWN
    assert gone.stdout == (
        f"LOCKDIAG UNKNOWN - registry file {registry} (from --registry) does not exist\n"
    )
    registry.write_text(REGISTERED + "max_hold = 'soon'\n")
    broken = check(*dsn, "--registry", str(registry))
    assert broken.exit_code == EXIT_UNKNOWN
    assert broken.stdout.startswith(f"LOCKDIAG UNKNOWN - {registry}:4: ")
    unnamed = check(*dsn)  # no registry anywhere: raw keys, as always
    assert unnamed.exit_code == 1
    assert "unregistered pair (4102, 73)" in unnamed.stdout


def test_registry_check_names_what_named_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    monkeypatch.setenv("LOCKDIAG_REGISTRY", "/nope.toml")
    from_environment = runner.invoke(cli, ["registry", "check"])
    assert from_environment.exit_code == 2
    assert "/nope.toml (from LOCKDIAG_REGISTRY) does not exist" in from_environment.stderr
    monkeypatch.delenv("LOCKDIAG_REGISTRY")
    (tmp_path / "settings.toml").write_text('[defaults]\nregistry = "/gone.toml"\n')
    monkeypatch.setenv("LOCKDIAG_SETTINGS", str(tmp_path / "settings.toml"))
    from_settings = runner.invoke(cli, ["registry", "check"])
    assert from_settings.exit_code == 2
    assert "/gone.toml (from the settings file) does not exist" in from_settings.stderr
