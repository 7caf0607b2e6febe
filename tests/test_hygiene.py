"""Incidents page; hygiene does not (issue 39). A key no registry names is reported in every
format but changes `check`'s exit code only when asked (--unregistered, or the registry's
``unregistered``); declarations that contradict each other are warned about; a constant's
hint is an entry that, pasted into the registry, names exactly that key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.core.snapshot_file import registry_text
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import from_bigint, from_pair
from lockdiag.registry import parse_registry

from helpers.cli import run
from helpers.registry import write_registry
from helpers.servers import Sessions

INCIDENT = Path(__file__).resolve().parent.parent / "examples" / "incident.json"
LEADER = """\
[namespaces.leader]
id = 1
expect = "session"
"""


def check(cluster: Cluster, registry: Path, *args: str) -> Result:
    return run("check", "--dsn", cluster.dsn(), "--registry", str(registry), *args)


def document(result: Result) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_an_unnamed_key_is_reported_and_does_not_page(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """A short-held session lock no namespace names: every format reports it, exit 0; exit 1
    when asked by the option or by the registry (the option wins over the registry)."""
    holder = sessions.open("elector")
    holder.run("SELECT pg_advisory_lock(4242, 17)")
    quiet = write_registry(tmp_path, LEADER)

    text = check(cluster, quiet, "--format", "plain")
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[0] == "OK: no alerts; 1 info cause(s)"
    assert f"INFO unregistered: unregistered pair (4242, 17)  pid {holder.pid}" in text.stdout
    as_json = document(check(cluster, quiet, "--format", "json"))
    assert as_json["status"] == "OK"
    (found,) = [f for f in as_json["findings"] if f["kind"] == "unregistered"]
    assert (found["severity"], found["pid"]) == ("info", holder.pid)
    assert [c["severity"] for c in as_json["causes"]] == ["info"]
    nagios = check(cluster, quiet, "--format", "nagios")
    assert nagios.exit_code == 0
    assert nagios.stdout.startswith("LOCKDIAG OK - no alerts; 1 info cause(s); unregistered")
    metrics = check(cluster, quiet, "--format", "prometheus")
    assert metrics.exit_code == 0
    assert 'lockdiag_findings{kind="unregistered",severity="info"} 1.0' in metrics.stdout
    assert 'lockdiag_findings{kind="unregistered",severity="warning"} 0.0' in metrics.stdout
    assert 'lockdiag_causes{severity="warning"} 0.0' in metrics.stdout
    assert 'lockdiag_causes{severity="info"} 1.0' in metrics.stdout
    markdown = check(cluster, quiet, "--format", "markdown")
    assert re.search(
        r"\| INFO +\| unregistered +\| unregistered pair \(4242, 17\) ", markdown.stdout
    )

    asked = check(cluster, quiet, "--unregistered", "warn")
    assert asked.exit_code == 1, asked.output
    assert asked.stdout.startswith("WARNING: 0 critical, 1 warning cause(s)")
    ignored = document(check(cluster, quiet, "--unregistered", "ignore", "--format", "json"))
    assert ignored["findings"] == [] and ignored["status"] == "OK"

    paging = write_registry(tmp_path, 'unregistered = "warn"\n\n' + LEADER)
    assert check(cluster, paging).exit_code == 1
    assert check(cluster, paging, "--unregistered", "report").exit_code == 0
    quiet_file = write_registry(tmp_path, 'unregistered = "ignore"\n\n' + LEADER)
    assert document(check(cluster, quiet_file, "--format", "json"))["findings"] == []


def test_a_bad_unregistered_setting_is_one_clear_error(tmp_path: Path) -> None:
    bad = write_registry(tmp_path, 'unregistered = "page"\n\n' + LEADER)
    checked = CliRunner().invoke(cli, ["registry", "check", "--registry", str(bad)])
    assert checked.exit_code != 0
    assert (
        f'{bad}:1: error: unregistered must be "ignore", "report" or "warn", not \'page\''
        in checked.output
    )
    verdict = CliRunner().invoke(cli, ["check", "--from", str(INCIDENT), "--registry", str(bad)])
    assert verdict.exit_code == 3
    assert verdict.stdout.count("\n") == 1 and "unregistered must be" in verdict.stdout
    assert "Traceback" not in verdict.output


CONTRADICTION = """\
[namespaces.leader]
id = 1
expect = "session"
max_hold = "5m"
"""


def test_a_declaration_that_contradicts_itself_is_warned_about(tmp_path: Path) -> None:
    path = write_registry(tmp_path, CONTRADICTION)
    result = CliRunner().invoke(cli, ["registry", "check", "--registry", str(path)])
    assert result.exit_code == 0, result.output  # a warning, not an error
    assert (
        f"{path}:1: warning: namespace 'leader': expect = \"session\" declares a lock held for "
        "the life of its session (a leader's), but max_hold = 5m flags every holder idle past "
        "5m CRITICAL (max-hold)"
    ) in result.output
    plain = CliRunner().invoke(
        cli, ["registry", "check", "--registry", str(write_registry(tmp_path, LEADER))]
    )
    assert "0 warning(s)" in plain.output and "max-hold" not in plain.output


def test_expect_session_quiets_age_but_not_waits(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """The declaration that quiets a healthy leader silences its session-lock age, and
    nothing about a real incident: a session waiting behind it is still a finding."""
    registry = write_registry(tmp_path, LEADER)
    leader = sessions.open("leader")
    leader.run("SELECT pg_advisory_lock(1, 1)")
    aged = ["--session-age", "0s", "--wait-age", "0s", "--format", "json"]
    assert document(check(cluster, registry, *aged))["findings"] == []
    undeclared = write_registry(tmp_path, LEADER.replace('expect = "session"', 'expect = "any"'))
    kinds = {f["kind"] for f in document(check(cluster, undeclared, *aged))["findings"]}
    assert kinds == {"session-lock"}  # the same lock, undeclared: what the declaration quiets
    registry = write_registry(tmp_path, LEADER)
    waiter = sessions.open("standby")
    waiter.start("SELECT pg_advisory_lock(1, 1)")
    sessions.waiting(waiter)
    found = document(check(cluster, registry, *aged))["findings"]
    assert {(f["kind"], f["pid"]) for f in found} == {("long-wait", waiter.pid)}


def test_a_constants_hint_pasted_into_the_registry_names_it(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """A hand-picked 64-bit constant: the hint gives the entry that names exactly that key;
    pasted, `check` and `list` show the name, and its neighbour keys stay unnamed."""
    holder = sessions.open("elector")
    holder.run("SELECT pg_advisory_lock(8237461823746182), pg_advisory_lock(4242, 17)")
    registry = write_registry(tmp_path, LEADER)
    found = document(check(cluster, registry, "--format", "json"))["findings"]
    steps = {f["lock"]: f["next_step"] for f in found if f["kind"] == "unregistered"}
    step = steps["unregistered bigint 8237461823746182"]
    assert "64-bit hash" in step  # the hashing helpers it might come from, still
    entry = re.search(r"\[namespaces\.NAME\] key = \S+$", step)
    assert entry is not None, step
    assert entry.group(0) == "[namespaces.NAME] key = 8237461823746182"
    pair = steps["unregistered pair (4242, 17)"]
    assert pair.endswith("[namespaces.NAME] key = [4242, 17]"), pair

    pasted = entry.group(0).replace(
        "[namespaces.NAME] ", '[namespaces.elector]\nexpect = "session"\n'
    )
    registry = write_registry(tmp_path, LEADER + "\n" + pasted + "\n")
    neighbour = sessions.open("neighbour")
    neighbour.run("SELECT pg_advisory_lock(8237461823746183)")  # the same high word, 1917933
    listed = CliRunner().invoke(
        cli, ["list", "--dsn", cluster.dsn(), "--registry", str(registry), "--format", "json"]
    )
    names = {
        (lock["pid"], lock["namespace"], tuple(lock["key"]))
        for lock in document(listed)["locks"]
        if lock["locktype"] == "advisory"
    }
    assert (holder.pid, "elector", (8237461823746182,)) in names
    assert (neighbour.pid, None, (8237461823746183,)) in names
    plain = CliRunner().invoke(
        cli, ["list", "--dsn", cluster.dsn(), "--registry", str(registry), "--format", "plain"]
    )
    assert any(line.split()[:1] == ["elector"] for line in plain.stdout.splitlines())
    checked = document(check(cluster, registry, "--format", "json", "--session-age", "0s"))
    named = {(f["kind"], f["lock"]) for f in checked["findings"]}
    assert ("session-lock", "elector") not in named  # declared, and named
    assert ("unregistered", "unregistered bigint 8237461823746183") in named
    key = CliRunner().invoke(cli, ["key", "elector", "--registry", str(registry)])
    assert key.exit_code == 0, key.output
    assert key.stdout.splitlines()[0] == "elector" and "(8237461823746182)" in key.stdout
    who = CliRunner().invoke(
        cli, ["who-holds", "elector", "--dsn", cluster.dsn(), "--registry", str(registry)]
    )
    assert who.exit_code == 0, who.output
    assert f"pid {holder.pid}" in who.stdout and "elector" in who.stdout, who.stdout
    shown = CliRunner().invoke(cli, ["registry", "show", "--registry", str(registry)])
    assert re.search(r"^elector +key 8237461823746182 +bigint +session", shown.stdout, re.M)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("key = 9223372036854775808", "key 9223372036854775808 is outside the bigint range"),
        ("key = [4242, 2147483648]", "key 2147483648 is outside the int4 range"),
        ('key = "x"', "key must be one integer (a bigint key) or two (an int4 pair)"),
        ("key = 1\nid = 0", "id does not go with key"),
        ('key = 1\nform = "pair"', 'key 1 is of form "bigint"'),
        ("key = [1, 5]", "key (1, 5) is already named by namespace 'leader' (id 1) as leader 5"),
    ],
)
def test_a_bad_exact_key_is_refused(tmp_path: Path, entry: str, message: str) -> None:
    path = write_registry(tmp_path, f"{LEADER}\n[namespaces.constant]\n{entry}\n")
    result = CliRunner().invoke(cli, ["registry", "check", "--registry", str(path)])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_two_entries_for_one_key_are_refused(tmp_path: Path) -> None:
    text = "[namespaces.a]\nkey = 77\n\n[namespaces.b]\nkey = 77\n"
    result = CliRunner().invoke(
        cli, ["registry", "check", "--registry", str(write_registry(tmp_path, text))]
    )
    assert result.exit_code != 0
    assert "namespace 'b': key 77 is already named by 'a'" in result.output


def test_a_key_collides_only_with_itself(tmp_path: Path) -> None:
    """A namespace of one key claims that key, not its space: 42 (high word 0, where Sqitch's
    key 75474063 lives) collides with nothing; Sqitch's own key is warned about."""
    for key, warned in (("42", False), ("75474063", True)):
        path = write_registry(tmp_path, f"[namespaces.constant]\nkey = {key}\n")
        result = CliRunner().invoke(cli, ["registry", "check", "--registry", str(path)])
        assert result.exit_code == 0, result.output
        assert ("that Sqitch uses" in result.output) is warned, result.output


def test_a_snapshot_file_carries_a_namespace_of_one_key() -> None:
    """A snapshot carries the registry as registry-file text: a namespace of one key stays one."""
    names, problems = parse_registry(
        '[namespaces.elector]\nkey = 8237461823746182\nexpect = "session"\n\n'
        "[namespaces.cron]\nkey = [4242, 17]\n"
    )
    assert names is not None and not problems
    text = registry_text(names)
    assert text is not None
    again, problems = parse_registry(text)
    assert again is not None and not problems, problems
    assert again.namespaces == names.namespaces
    assert again.decode(from_bigint(8237461823746182)) == (names.namespaces["elector"], 2312827014)
    assert again.decode(from_pair(4242, 18)) is None
