"""The alerting guide's "what pages and why" table against the code: every kind is a row; the
severities `check` gives each kind on the bundled incident (at warning-level and
critical-level thresholds, hygiene asked to warn or not) are the row's, its exit codes are
those severities' codes, and the Prometheus alerts it names are the shipped rules that select
that kind; no shipped rule selects hygiene."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.findings import SEVERITIES, Kind
from lockdiag.views.check import STATUS_EXIT

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "alerting.md"
RULES = ROOT / "contrib" / "prometheus" / "lockdiag-rules.yml"
EXIT = {"info": STATUS_EXIT["OK"], "warning": STATUS_EXIT["WARNING"],
        "critical": STATUS_EXIT["CRITICAL"]}  # fmt: skip
# kinds the bundled incident cannot raise (a lock queue, pg_repack): their rows are checked
# for shape only
NOT_IN_THE_INCIDENT = {Kind.LOCK_QUEUE, Kind.STALLED}
PARTLY = {Kind.OUTLIVED_CLIENT}  # critical needs a waiter on it, which the incident has not
LEVELS = {
    "warning": ["--session-age", "0s", "--wait-age", "0s", "--idle-age", "0s",
                "--max-blocked", "0"],
    "critical": ["--session-age", "0s,0s", "--wait-age", "0s,0s", "--idle-age", "0s,0s",
                 "--max-blocked", "0,0"],
}  # fmt: skip


def table() -> dict[str, list[str]]:
    """The rows of the table under '### What pages and why', by kind."""
    lines = GUIDE.read_text().split("### What pages and why", 1)[1].splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]
    return {row[0].strip("`"): row[1:] for row in cells}


def words(cell: str, among: tuple[str, ...]) -> set[str]:
    return {word for word in re.findall(r"[a-z]+", cell) if word in among}


def observed(tmp_path: Path) -> dict[str, set[str]]:
    """(kind, severity) of every finding `check` gives on the bundled incident."""
    registry = tmp_path / "lockdiag.toml"
    text = (ROOT / "examples" / "lockdiag.toml").read_text()
    limited = text.replace('max_hold = "5m"', 'max_hold = "5m"\nmax_wait = "1s"', 1)
    found: dict[str, set[str]] = {}
    for thresholds, hygiene, names in itertools.product(
        LEVELS.values(), ("report", "warn"), (text, limited)
    ):
        registry.write_text(names)
        result = CliRunner().invoke(
            cli,
            ["check", "--from", str(ROOT / "examples" / "incident.json"), "--registry",
             str(registry), "--format", "json", "--unregistered", hygiene, *thresholds],
        )  # fmt: skip
        for finding in json.loads(result.stdout)["findings"]:
            found.setdefault(finding["kind"], set()).add(finding["severity"])
    return found


def test_every_kind_has_a_row_whose_severities_are_the_codes() -> None:
    rows = table()
    assert set(rows) == {kind.value for kind in Kind}
    for kind, (severity, exit_code, *_) in rows.items():
        listed = words(severity, SEVERITIES)
        assert listed, kind
        codes = {int(code) for code in re.findall(r"\d", exit_code)}
        assert codes == {EXIT[s] for s in listed}, (kind, severity, exit_code)


def test_the_severities_are_the_codes(tmp_path: Path) -> None:
    rows = table()
    found = observed(tmp_path)
    for kind in Kind:
        if kind in NOT_IN_THE_INCIDENT:
            continue
        listed = words(rows[kind.value][0], SEVERITIES)
        assert found[kind.value] <= listed, kind
        if kind not in PARTLY:
            assert found[kind.value] == listed, kind
    # hygiene alone never pages: info unless asked
    assert rows["unregistered"][0].startswith("info")


@pytest.mark.parametrize("kind", [kind.value for kind in Kind])
def test_the_alerts_named_are_the_rules_that_select_the_kind(kind: str) -> None:
    rules = {
        rule["alert"]: rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    named = set(re.findall(r"`(Lockdiag\w+)`", table()[kind][2]))
    selecting = {alert for alert, expr in rules.items() if f'kind="{kind}"' in expr}
    if kind == Kind.LONG_WAIT:  # its rule reads the longest wait, not the findings
        selecting = {a for a, expr in rules.items() if "lockdiag_longest_wait_seconds" in expr}
    assert named == selecting
    assert not any('severity="info"' in expr or 'kind="unregistered"' in expr
                   for expr in rules.values())  # fmt: skip
