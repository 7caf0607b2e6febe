"""Generated text reads right: no Python reprs, articles that fit, registry names as written,
lower bounds marked with ≥, and every symbol explained where it appears. Over every command
that reads the bundled incident in every format, the catalogue's advice for every software,
and sample's report."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest
import tomllib
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.catalogue import SOFTWARE, Known
from lockdiag.core.catalogue.entry import PROGRAMS
from lockdiag.core.findings import software_step
from lockdiag.core.holding import holding
from lockdiag.render import plain
from lockdiag.views.sample import sample_output

from helpers.cli import run
from helpers.paths import BUNDLED_REGISTRY as REGISTRY
from helpers.paths import INCIDENT
from helpers.samples import sampled, stuck_owner
from helpers.snapshots import known_lock, session

NAMES = list(tomllib.loads(REGISTRY.read_text())["namespaces"])
FORMATS = ["plain", "json", "csv", "markdown"]

REPRS = [r"\(\d+,\)", r"\['", r"\{'", r"\bNone\b", r"<.* object at"]
A_BEFORE_VOWEL = re.compile(r"\b[aA] (?!user|unique|uni|one|usual|eu)[aeiouAEIOU]\w*")
AN_BEFORE_CONSONANT = re.compile(r"\b[aA]n (?!hour|honest)[b-df-hj-np-tv-zB-DF-HJ-NP-TV-Z]\w*")


def problems(text: str) -> list[str]:
    """Every break of the wording rules in ``text``."""
    found = [f"repr {m.group()!r}" for r in REPRS for m in re.finditer(r, text)]
    found += [f"article {m.group()!r}" for m in A_BEFORE_VOWEL.finditer(text)]
    found += [f"article {m.group()!r}" for m in AN_BEFORE_CONSONANT.finditer(text)]
    for name in NAMES:  # a registry name exactly as written, never recased
        found += [
            f"name {m.group()!r}"
            for m in re.finditer(rf"\b{name}\b", text, re.IGNORECASE)
            if m.group() != name
        ]
    return found


def bundled(*args: str) -> str:
    """The stdout of ``lockdiag ARGS`` on the bundled incident and its registry, 200 columns."""
    result = run(*args, "--from", str(INCIDENT), "--registry", str(REGISTRY),
                 env={"LOCKDIAG_SETTINGS": "", "COLUMNS": "200"})  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output  # check exits 2 on critical findings
    assert "Traceback" not in result.output
    return result.stdout


HOLDERS = ["tenant_summary 73", "tenant_summary 74", "tenant_summary 80", "invoice_export 2041",
           "invoice_export 2042", "leader 1"]  # fmt: skip
COMMANDS = [
    ["list"], ["list", "--all"], ["blockers"], ["check"],
    *(["who-holds", *key.split()] for key in HOLDERS),
]  # fmt: skip


CASES = [(c, f) for c in COMMANDS for f in FORMATS if f != "csv" or c[0] == "list"]


@pytest.mark.parametrize(("command", "output_format"), CASES, ids=str)
def test_the_incidents_outputs_read_right(command: list[str], output_format: str) -> None:
    text = bundled(*command, "--format", output_format)
    assert text
    assert problems(text) == []


def cells(text: str, column: str) -> list[str]:
    """The cells of ``column`` in the first plain table whose header names it."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if re.search(rf"  {column}  ", line))
    start = lines[header].index(f"  {column}  ") + 2
    found = []
    for line in lines[header + 1 :]:
        if len(line) <= start or line[start - 2 : start] != "  ":
            break
        found.append(line[start:].split("  ")[0].strip())
    return found


@pytest.mark.parametrize("command", [c for c in COMMANDS if c[0] in ("list", "who-holds")],
                         ids=" ".join)  # fmt: skip
def test_every_hold_is_a_lower_bound_and_every_unknown_age_is_explained(
    command: list[str],
) -> None:
    """A held lock's AGE (HELD in who-holds) is "≥ N" or "?", and a "?" shown is explained."""
    text = bundled(*command, "--format", "plain")
    column = "HELD" if command[0] == "who-holds" else "AGE"
    ages = [age for age in cells(text, column) if not age.startswith("waiting")]
    assert ages, text
    assert all(age == "?" or re.fullmatch(r"≥ \d\S*", age) for age in ages), ages
    explained = any(line.startswith(f"{column} ?: ") for line in text.splitlines())
    assert explained == ("?" in ages), text


def test_key_and_decode_read_right() -> None:
    texts = []
    for args in (["key", "tenant_summary", "73"], ["key", "tenant_period", "73", "2026-11"],
                 ["decode", "4102", "73"], ["decode", "30064773113"]):  # fmt: skip
        result = CliRunner().invoke(
            cli, [*args, "--registry", str(REGISTRY)], env={"LOCKDIAG_SETTINGS": ""}
        )
        assert result.exit_code == 0, result.output
        texts.append(result.stdout)
    assert problems("\n".join(texts)) == []


def step_of(known: Known, state: str = "idle", query: str = "q") -> str:
    """The step check gives for ``known``'s lock held by a session in ``state``."""
    holder = replace(
        session(4242, state, timedelta(minutes=-5), in_transaction=state != "idle"), query=query
    )
    entry, snapshot = known_lock(known, holder)
    found = holding(entry, snapshot)
    assert found is not None
    return software_step(found, snapshot)


@pytest.mark.parametrize("state", ["idle", "idle in transaction", "active"])
@pytest.mark.parametrize("software", sorted(SOFTWARE))
def test_every_softwares_advice_reads_right(software: str, state: str) -> None:
    held = [hold for program in PROGRAMS if program.name == software for hold in program.holds]
    for meaning in ("its lock", *(m for hold in held for m in hold.keys)):
        step = step_of(Known(software, meaning, "exact"), state)
        assert problems(step) == []
        assert software in step  # the name as written, never recased


def test_a_name_that_ends_with_its_kind_is_not_said_twice() -> None:
    from lockdiag.core.catalogue import Software

    deploy = Software("deploy", "pg_try_advisory_lock", "held for the whole deploy")
    step = step_of(Known("Acme Deploy", "deploy lock", "plugin", "acme", deploy))
    assert step.startswith("an Acme Deploy is running, or died"), step
    step = step_of(Known("Sqitch", "deploy lock", "exact"))
    assert step.startswith("a Sqitch deploy is running"), step


def test_the_rules_catch_what_they_name() -> None:
    """The checks above can fail: each rule finds its break."""
    assert problems("unlock failed for (30064771081,)")
    assert problems("a Acme Deploy deploy is running")
    assert problems("next: Tenant_summary declares")
    assert problems("an Sqitch deploy")
    assert problems("value None")
    assert not problems("a user, an hour, a unique key, an Apache Airflow migration")


def test_samples_report_reads_right() -> None:
    """sample's callout is no stuck-owner (list's term for idle in transaction only), and its
    longest hold and wait are marked as lower bounds."""
    text = plain(sample_output(sampled(stuck_owner()), 0.25).blocks())
    assert problems(text) == []
    assert "stuck-owner" not in text and "idle-holder: tenant_summary 2" in text
    row = next(line for line in text.splitlines() if line.startswith("tenant_summary 2"))
    assert re.search(r"≥ \d", row), row
    assert not re.search(r"(?<!≥ )\b\d+(\.\d+)?(ms|s)\b", row.split("%", 2)[-1]), row


def test_evidence_that_opens_a_sentence_keeps_the_names_case() -> None:
    """The step 'next: ...' opens with the evidence as a sentence: a namespace's name in it
    stays as the registry writes it (never 'Tenant_summary declares')."""
    from datetime import timedelta

    from lockdiag.core.analysis import Flag, analyse
    from lockdiag.core.ownership import ownership
    from lockdiag.registry import parse_registry

    from helpers.snapshots import advisory, session, snapshot

    registry, _ = parse_registry('[namespaces.tenant_summary]\nid = 4102\nexpect = "xact"\n')
    assert registry is not None
    holder, waiter = (
        session(10, "idle", -timedelta(minutes=10)),
        session(11, "active", -timedelta(0)),
    )
    locks = [advisory(10, 73), advisory(11, 73, False, (10,))]
    entries = analyse(snapshot([holder, waiter], locks), registry)
    held = next(e for e in entries if e.lock.granted)
    assert Flag.EXPECT_XACT in held.flags
    sentence = ownership([held]).sentence
    assert "tenant_summary declares" in sentence and problems(sentence) == [], sentence
