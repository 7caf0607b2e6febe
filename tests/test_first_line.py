"""The first line is the cause: on the bundled incident, `check`'s first heading, the first
row `list` shows on a terminal, the cause line of `who-holds` on the stuck key (under the line
that says who holds it) and JSON `causes[0]` all name pid 4163 and tenant_summary 73;
severities and counts agree between `check`'s text and its JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.snapshot_file import load
from lockdiag.registry import load_registry
from lockdiag.render import render
from lockdiag.views.listing import list_output

from helpers.cli import run
from helpers.paths import BUNDLED_REGISTRY as REGISTRY
from helpers.paths import INCIDENT
from helpers.terminal import Terminal

BUNDLED = ["--from", str(INCIDENT), "--registry", str(REGISTRY)]


def bundled(*args: str) -> str:
    """The stdout of ``lockdiag ARGS`` on the bundled incident and its registry."""
    return run(*args, *BUNDLED).stdout


def check_json() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(bundled("check", "--format", "json"))
    return document


def names_the_cause(line: str) -> bool:
    return "4163" in line and "tenant_summary 73" in line


def test_check_heading_names_the_cause() -> None:
    lines = bundled("check").splitlines()
    first_heading = lines[1]
    assert names_the_cause(first_heading), first_heading
    assert first_heading.startswith("CRITICAL session-lock: tenant_summary 73")


def test_json_causes_first_is_the_same_cause() -> None:
    (first, *_) = check_json()["causes"]
    assert first["pid"] == 4163
    assert first["lock"] == "tenant_summary 73"
    assert first["severity"] == "critical"


def test_list_on_a_terminal_shows_the_cause_first(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setenv("LINES", "40")
    diagnosis = Diagnosis(load(INCIDENT), load_registry(str(REGISTRY)))
    terminal = Terminal()
    render(list_output(diagnosis.listing()), "table", terminal)
    text = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("LOCK")
    first_row = lines[2]  # after the header and its rule
    assert names_the_cause(first_row), text


def test_list_on_a_small_terminal_says_once_how_many_it_shows(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("LINES", "16")
    diagnosis = Diagnosis(load(INCIDENT), load_registry(str(REGISTRY)))
    terminal = Terminal()
    render(list_output(diagnosis.listing()), "table", terminal)
    text = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    assert "more row(s) not shown" not in text  # one count, in the summary
    (summary,) = [line for line in text.splitlines() if "lock(s), 3 waiting" in line]
    shown = int(re.search(r"; (\d+) shown here", summary).group(1))  # type: ignore[union-attr]
    rows = [line for line in text.splitlines() if re.search(r"\s(held|WAITING)\s+\d+\s", line)]
    assert shown == len(rows) < 11
    assert summary.startswith("11 lock(s), 3 waiting")
    assert names_the_cause(rows[0])
    # the legend explains the flags of the rows shown, and only those
    legend = [line.split(":")[0] for line in text.splitlines() if re.match(r"^[a-z-]+: ", line)]
    flags = {flag for row in rows for flag in row.split()[-1].split(",") if "-" in flag}
    assert set(legend) == flags, (legend, flags)
    assert "unregistered" not in legend and "outlived-client" not in legend


def test_who_holds_verdict_is_the_cause_in_its_terms() -> None:
    # under the line that says who holds the key, what it is in the incident and what to do
    holding, first, step, *_ = bundled("who-holds", "tenant_summary", "73").splitlines()
    assert holding.startswith("tenant_summary 73 (4102, 73, 2) is held by pid 4163")
    assert names_the_cause(first)
    assert first.startswith(
        "tenant_summary 73: pid 4163 (billing-worker) is the worst root blocker: "
    )
    cause = check_json()["causes"][0]
    assert cause["pid"] == 4163
    assert f"blocks {cause['blocked']} session(s)" in first
    assert step == f"next: {cause['next_step']}"
    document = json.loads(bundled("who-holds", "tenant_summary", "73", "--format", "json"))
    assert document["verdict"] == first
    assert document["next_step"] == cause["next_step"]


def test_who_holds_verdicts_off_the_worst_chain() -> None:
    uncontested = bundled("who-holds", "tenant_summary", "80").splitlines()[1:]
    assert uncontested[0] == "tenant_summary 80: held by pid 13304 (report-api), nobody waits: " \
        "nothing to do"  # fmt: skip
    assert not uncontested[1].startswith("next:")
    # the same holder through another key: nobody waits for this one, but say what it is
    other = bundled("who-holds", "invoice_export", "2041").splitlines()[1]
    assert "nobody waits for it" in other
    assert "the worst root blocker through tenant_summary 73" in other
    second = bundled("who-holds", "tenant_summary", "74").splitlines()[1]
    assert second.startswith("tenant_summary 74: pid 9932 (summary-worker) is a root blocker")
    nobody = bundled("who-holds", "tenant_summary", "75").splitlines()[1]
    assert nobody == "tenant_summary 75: nobody holds it: nothing to do"


def test_severities_and_counts_agree_between_text_and_json() -> None:
    document = check_json()
    lines = bundled("check").splitlines()
    critical, warning = document["summary"]["critical"], document["summary"]["warning"]
    assert lines[0] == (
        f"{document['status']}: {critical} critical, {warning} warning cause(s); "
        f"{document['summary']['waiting']} session(s) waiting"
    )
    headings = [line for line in lines[1:] if re.match(r"^(CRITICAL|WARNING) ", line)]
    assert len(headings) == len(document["causes"]) == critical + warning
    for heading, cause in zip(headings, document["causes"], strict=True):
        assert heading.startswith(f"{cause['severity'].upper()} {cause['kind']}: {cause['lock']}")
        assert f"pid {cause['pid']}" in heading
    assert sum(c["severity"] == "critical" for c in document["causes"]) == critical
