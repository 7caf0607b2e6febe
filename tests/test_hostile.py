"""Hostile input: names and queries chosen by whoever connects, and broken files. Displayed
strings are neutralised, JSON keeps the exact value, parsers reject with a reason."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockdiag.cli import cli
from lockdiag.core import snapshot_file
from lockdiag.core.analysis import analyse
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.evidence import take_snapshot
from lockdiag.keys import parse_numbers
from lockdiag.registry import Registry, parse_registry
from lockdiag.render import render
from lockdiag.views.listing import list_output

from conftest import PASSWORD, Sessions

EVIL_ROLE = "mallory\x1b[31m\x07"
EVIL_DB = "shop\nDROP"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but the line feeds we print


@pytest.fixture(scope="module")
def evil_names(cluster: Cluster) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{EVIL_ROLE}" LOGIN')
        admin.execute(f'CREATE DATABASE "{EVIL_DB}"')


def test_names_and_queries_are_neutralised(
    cluster: Cluster, sessions: Sessions, evil_names: None
) -> None:
    holder = sessions.open("holder", user=EVIL_ROLE, dbname=EVIL_DB, autocommit=False)
    holder.run("SELECT pg_advisory_xact_lock(66, 1) /* \x1b]8;;http://evil\x07click\x1b]8;;\x07 */")
    waiter = sessions.open("waiter\r\n[bold]x", user=EVIL_ROLE, dbname=EVIL_DB)
    waiter.start("SELECT pg_advisory_lock(66, 1) /* \x1b[2J\r\nDROP TABLE x */")
    sessions.waiting(waiter)
    runner = CliRunner()
    base = ["--dsn", cluster.dsn()]
    for command in (["list"], ["who-holds", "--key", "66,1"], ["blockers"], ["check"]):
        shown = runner.invoke(cli, [*command, *base]).stdout
        assert not RAW_CONTROL.search(shown), (command, shown)
        if command[0] in ("list", "who-holds"):
            assert "mallory\\e[31m\\x07" in shown, command
    document = json.loads(runner.invoke(cli, ["list", *base, "--format", "json"]).stdout)
    users = {lock["user"] for lock in document["locks"]}
    assert users == {EVIL_ROLE}  # JSON keeps the exact value
    assert {lock["database"] for lock in document["locks"]} == {EVIL_DB}

    # a real terminal table: cells reach rich as Text, markup in them is not interpreted
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    from lockdiag.registry import Registry as EmptyRegistry

    terminal = Terminal()
    taken = take_snapshot(cluster.dsn(), 5, "advisory")
    render(list_output(Diagnosis(taken, EmptyRegistry()).listing()), "table", terminal)
    text = terminal.getvalue()
    assert "\x1b[2J" not in text and "\x1b]8" not in text and "\x07" not in text


def test_password_never_in_a_snapshot_file(cluster: Cluster, tmp_path: Path) -> None:
    saved = tmp_path / "s.json"
    dsn = f"postgresql://pw_user:{PASSWORD}@127.0.0.1:{cluster.port}/postgres"
    result = CliRunner().invoke(cli, ["snapshot", "-o", str(saved), "--dsn", dsn])
    assert result.exit_code == 0, result.stderr
    assert PASSWORD not in saved.read_text()
    assert PASSWORD not in result.stderr + result.stdout


def test_huge_registry_is_refused(tmp_path: Path) -> None:
    huge = tmp_path / "lockdiag.toml"
    huge.write_text("# padding\n" * 200_000)
    result = CliRunner().invoke(cli, ["registry", "check"])
    assert result.exit_code == 1
    assert "not a registry" in result.stdout


def test_truncated_snapshot_file(cluster: Cluster, tmp_path: Path) -> None:
    text = snapshot_file.dumps(take_snapshot(cluster.dsn(), 5, "all"))
    truncated = tmp_path / "t.json"
    truncated.write_text(text[: len(text) // 2])
    result = CliRunner().invoke(cli, ["list", "--from", str(truncated)])
    assert result.exit_code == 2
    assert re.match(
        rf"lockdiag: error: {re.escape(str(truncated))}:\d+: not a snapshot file", result.stderr
    )


# -- property-based: the parsers never fail in any other way than a clear InputError ---------

TOML_ALPHABET = st.sampled_from(list("[]{}=\",.'#\n \tabcdeinmpsftx0123456789-_é\x00\x1b"))


@given(st.text(TOML_ALPHABET, max_size=300))
def test_registry_parser_never_crashes(text: str) -> None:
    registry, problems = parse_registry(text, "r.toml")
    assert registry is not None or any(p.severity == "error" for p in problems)
    for problem in problems:
        assert problem.line is None or 1 <= problem.line <= text.count("\n") + 1


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip


@given(
    name=st.text(min_size=1, max_size=20),
    fields=st.dictionaries(
        st.sampled_from(["id", "form", "expect", "max_hold", "max_wait", "owner", "colour"]),
        VALUES,
        max_size=5,
    ),
)
def test_registry_values_of_any_type(name: str, fields: dict[str, Any]) -> None:
    lines = [f"[namespaces.{json.dumps(name)}]"]
    for key, value in fields.items():
        lines.append(f"{key} = {_toml(value)}")
    registry, problems = parse_registry("\n".join(lines) + "\n")
    assert registry is not None or problems


def _toml(value: Any) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {v}" for k, v in value.items()) + "}"


@given(st.text(max_size=200))
def test_snapshot_loader_never_crashes_on_text(text: str) -> None:
    with contextlib.suppress(InputError):
        snapshot_file.loads(text, "f.json")


@pytest.fixture(scope="module")
def real_document(cluster: Cluster) -> dict[str, Any]:
    with psycopg.connect(cluster.dsn(application_name="doc"), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(3, 3), pg_advisory_lock(-9)")
        document: dict[str, Any] = json.loads(
            snapshot_file.dumps(take_snapshot(cluster.dsn(), 5, "all"))
        )
    return document


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=150)
@given(data=st.data())
def test_snapshot_loader_on_mutated_files(
    real_document: dict[str, Any], data: st.DataObject
) -> None:
    document = json.loads(json.dumps(real_document))
    section = data.draw(
        st.sampled_from(["server", "sessions", "locks", "pool", "derived", "source", "scope"])
    )
    value = data.draw(VALUES)
    if section in ("sessions", "locks") and document[section]:
        item = data.draw(st.sampled_from(document[section]))
        item[data.draw(st.sampled_from(sorted(item)))] = value
    elif section == "server":
        document["server"][data.draw(st.sampled_from(sorted(document["server"])))] = value
    else:
        document[section] = value
    try:
        loaded = snapshot_file.loads(json.dumps(document), "f.json")
    except InputError:
        return
    # whatever the loader let through: at worst a clear refusal, never a traceback
    with contextlib.suppress(InputError):
        analyse(loaded, Registry(), advisory_only=False)


@given(st.lists(st.text(max_size=30), min_size=0, max_size=4))
def test_key_parser_never_crashes(numbers: list[str]) -> None:
    with contextlib.suppress(InputError):
        parse_numbers(numbers)
