"""Bounded input, inert output. A registry or snapshot file (or a recording) nested thousands
deep, larger than its limit, endless (/dev/zero, a FIFO) or random bytes is refused with one
line that names the file, exit 2, never a traceback, never read whole. CSV cells never run as
formulas in a spreadsheet; Prometheus label values never carry raw control characters."""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from lockdiag import registry as registry_module
from lockdiag import settings as settings_module
from lockdiag.cli import cli
from lockdiag.core import snapshot_file
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.evidence import source as fleet
from lockdiag.registry import MAX_DEPTH as TOML_DEPTH
from lockdiag.registry import MAX_SIZE, check_file, nesting_depth, parse_registry
from lockdiag.render import Output, Table, clean, csv_cell, render
from lockdiag.views.metrics import Metric, exposition, inert, labelled

from conftest import Sessions

ROOT = Path(__file__).resolve().parent.parent
INCIDENT = ROOT / "examples" / "incident.json"
JSON_DEPTH = snapshot_file.MAX_DEPTH
HEAD = '{"format": "lockdiag-snapshot", "version": 1, "notes": '  # a snapshot's own start
FAST = settings(max_examples=40)


def refused(result: Result, name: str, reason: str, code: int = 2) -> None:
    """Exit 2 (``check``: 3, UNKNOWN), one line ``lockdiag: error: NAME...REASON`` on stderr,
    no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"lockdiag: error: {name}"), lines[0]
    assert reason in lines[0], lines[0]


def no_traceback(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr


@contextlib.contextmanager
def written(data: bytes | str, suffix: str) -> Iterator[Path]:
    """A file holding ``data`` (hypothesis tests cannot use function-scoped tmp_path)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"f{suffix}"
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        yield path


def deep_json(depth: int, kinds: str, closed: bool) -> str:
    """``depth`` levels of arrays and objects (``kinds``: "[", "{" or both, in turn)."""
    opens = ["[" if kinds[i % len(kinds)] == "[" else '{"k": ' for i in range(depth)]
    closes = ["]" if o == "[" else "}" for o in reversed(opens)] if closed else []
    return "".join(opens) + "0" + "".join(closes)


def json_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    return 0


def nested_message(name: str) -> str:
    return f"{name}: nested more than {JSON_DEPTH} levels deep"


# -- snapshot files: depth ------------------------------------------------------------------


def test_json_depth_limit_is_exact() -> None:
    """A document nested MAX_DEPTH deep is read (and refused for what it is not); one level
    more is refused as nested, arrays and objects alike."""
    for kinds in ("[", "{", "[{"):
        at_limit = HEAD + deep_json(JSON_DEPTH - 1, kinds, closed=True) + "}"
        with pytest.raises(InputError) as caught:
            snapshot_file.loads(at_limit, "f.json")
        assert "nested" not in str(caught.value) and "version" not in str(caught.value)
        beyond = HEAD + deep_json(JSON_DEPTH, kinds, closed=True) + "}"
        with pytest.raises(InputError, match=re.escape(nested_message("f.json"))):
            snapshot_file.loads(beyond, "f.json")


@FAST
@given(
    depth=st.integers(JSON_DEPTH + 1, 20_000),
    kinds=st.sampled_from(["[", "{", "[{", "{["]),
    closed=st.booleans(),
    inside=st.booleans(),
)
def test_deep_json_is_refused_as_nested(depth: int, kinds: str, closed: bool, inside: bool) -> None:
    text = deep_json(depth, kinds, closed)
    if inside:
        text = HEAD + text + ("}" if closed else "")
    for data in (text, text.encode()):
        with pytest.raises(InputError, match=re.escape(nested_message("f.json"))):
            snapshot_file.loads(data, "f.json")


TRICKY = st.text(st.sampled_from(list('[]{}"\\/ab:,\n\t\u2028\x00é')), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=25,
)


# levels wrapped around a value: few, or about the limit; bit i of the kinds: list or object
LEVELS = st.integers(0, 6) | st.integers(JSON_DEPTH - 6, JSON_DEPTH + 6)
KINDS = st.integers(0, 2 ** (JSON_DEPTH + 6))


def wrapped(value: Any, levels: int, kinds: int, key: str) -> Any:
    for level in range(levels):
        value = [value] if kinds >> level & 1 else {key: value}
    return value


@settings(max_examples=150)
@given(value=JSON_VALUES, levels=LEVELS, kinds=KINDS, ascii=st.booleans())
def test_depth_is_counted_outside_strings_exactly(
    value: Any, levels: int, kinds: int, ascii: bool
) -> None:
    """Brackets, quotes and backslashes inside strings never count; the structure's do: a
    document is refused as nested exactly when it is deeper than MAX_DEPTH."""
    value = wrapped(value, levels, kinds, '[\\"{')
    text = json.dumps(value, ensure_ascii=ascii)
    with pytest.raises(InputError) as caught:
        snapshot_file.loads(text, "f.json")
    assert ("nested more than" in str(caught.value)) == (json_depth(value) > JSON_DEPTH)


@settings(max_examples=300)
@given(
    brackets=st.lists(
        st.sampled_from(["[", "]", "{", "}", "[]", "[[", "]]", "[" * 9, "]" * 9]), max_size=80
    ).map("".join),
    limit=st.integers(0, 12),
)
def test_nesting_depth_is_the_highest_running_sum(brackets: str, limit: int) -> None:
    """Both ways of counting (rounds of innermost pairs, running sums) give the depth: the
    highest running sum, exactly for balanced brackets, at least for others."""
    sums = list(itertools.accumulate(1 if c in "[{" else -1 for c in brackets))
    highest = max([0, *sums])
    found = nesting_depth(brackets.encode(), limit)
    if all(total >= 0 for total in sums) and (not sums or sums[-1] == 0):
        assert found == min(highest, limit + 1)
    else:  # a broken file: never counted less deep than it is
        assert min(highest, limit + 1) <= found <= limit + 1


def test_brackets_in_strings_never_refuse_a_real_snapshot() -> None:
    """A query or application name full of brackets (anyone connecting chooses them) leaves
    the incident file readable."""
    document = json.loads(INCIDENT.read_text())
    document["sessions"][0]["query"] = "[" * 5000 + '\\"{' * 3000
    document["sessions"][1]["application_name"] = '"' + "{" * 63
    document["sessions"][2]["query"] = "]" * 5000 + "}\\"
    for ascii in (True, False):
        loaded = snapshot_file.loads(json.dumps(document, ensure_ascii=ascii), "f.json")
        first = document["sessions"][0]
        assert loaded.sessions[first["pid"]].query == first["query"]


# -- snapshot files: size, endless files, random bytes -----------------------------------


def test_limits_are_documented_values() -> None:
    assert snapshot_file.MAX_FILE_SIZE == 1 << 30
    assert MAX_SIZE == 1 << 20
    assert JSON_DEPTH == TOML_DEPTH == 64
    assert snapshot_file.MAX_ELEMENTS == 8_000_000
    assert registry_module.validation.MAX_ELEMENTS == 50_000
    assert settings_module.MAX_ELEMENTS == 20_000
    assert fleet.MAX_TARGETS == 1000


def test_a_file_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:  # sparse: no disk used, nothing worth reading
        out.truncate(snapshot_file.MAX_FILE_SIZE + 1)
    started = time.monotonic()
    with pytest.raises(InputError, match=r"huge.json: larger than 1 GiB: not a snapshot file"):
        snapshot_file.load(huge)
    assert time.monotonic() - started < 5
    refused(
        CliRunner().invoke(cli, ["list", "--from", str(huge)]),
        str(huge),
        "larger than 1 GiB: not a snapshot file",
    )
    exact = tmp_path / "exact.json"  # at the limit: read (and refused for what it holds)
    with exact.open("wb") as out:
        out.write(b" " * 1024)
    registry_module.read_bounded(exact, 1024, "snapshot file")
    with pytest.raises(InputError, match="larger than 1023 bytes"):
        registry_module.read_bounded(exact, 1023, "snapshot file")


def test_devices_are_refused_unread() -> None:
    """/dev/zero would be endless, /dev/tty would wait for a person: a device is refused
    before a byte is read (a FIFO: see test_inputs.py)."""
    started = time.monotonic()
    for command, what in (("list", "snapshot file"), ("watch --once", "recording")):
        refused(
            CliRunner().invoke(cli, [*command.split(), "--from", "/dev/zero"]),
            f"cannot read {what} /dev/zero",
            "a character device, not a regular file",
        )
    problems = check_file(Path("/dev/zero"))[1]
    assert [str(p) for p in problems] == [
        "/dev/zero: error: cannot read: a character device, not a regular file"
    ]
    assert time.monotonic() - started < 10


@FAST
@given(st.binary(max_size=3000))
def test_random_bytes_are_refused_cleanly(data: bytes) -> None:
    with written(data, ".json") as path:
        with pytest.raises(InputError):
            snapshot_file.load(path)
        with contextlib.suppress(InputError):
            snapshot_file.read_recording(path)
        refused(CliRunner().invoke(cli, ["list", "--from", str(path)]), "", str(path))


JSONISH = st.lists(
    st.sampled_from([*'[]{}",:\\ 0123456789.-eEtruefalsn\n\x00é', "true", "null", HEAD]),
    max_size=300,
).map("".join)


@FAST
@given(JSONISH)
def test_jsonish_text_never_gives_a_traceback(text: str) -> None:
    with contextlib.suppress(InputError):
        snapshot_file.loads(text, "f.json")
    with written(text, ".json") as path:
        result = CliRunner().invoke(cli, ["list", "--from", str(path)])
        no_traceback(result)
        refused(result, "", str(path))


def test_cli_refuses_deep_snapshot_files_and_recordings(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    for kinds in ("[", "{"):
        deep.write_text(HEAD + deep_json(4000, kinds, closed=True) + "}")
        for command in ("list", "blockers", "check", "who-holds --key 1"):
            refused(
                CliRunner().invoke(cli, [*command.split(), "--from", str(deep)]),
                str(deep),
                "nested more than 64 levels deep: not a snapshot file",
                3 if command == "check" else 2,
            )
    recording = tmp_path / "watch.jsonl"
    recording.write_text("[" * 5000 + "\n")
    refused(
        CliRunner().invoke(cli, ["watch", "--once", "--from", str(recording)]),
        f"{recording}:1",
        "nested more than 64 levels deep",
    )


# -- registry files --------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return "true" if value is True else "false" if value is False else str(value)


TOML_TEXT = st.text(st.sampled_from(list("[]{}\"'#\\ab=\n\té")), max_size=10)
TOML_VALUES = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | TOML_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TOML_TEXT, inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=120)
@given(value=TOML_VALUES, levels=LEVELS, kinds=KINDS)
def test_toml_depth_limit_is_exact(value: Any, levels: int, kinds: int) -> None:
    """A registry is refused as nested exactly when a value nests deeper than MAX_DEPTH;
    brackets, quotes and # in strings never count."""
    value = wrapped(value, levels, kinds, "[#'")
    text = f"# [[[ {{{{\nx = {toml_value(value)}\n"
    registry, problems = parse_registry(text, "r.toml")
    nested = [p for p in problems if "nested more than 64 levels deep" in p.message]
    assert bool(nested) == (json_depth(value) > TOML_DEPTH)  # x's value is at level 1
    if nested:
        assert registry is None and problems == nested


DEEP_TOML: dict[str, Callable[[int], str]] = {
    "arrays": lambda n: "x = " + "[" * n + "1" + "]" * n + "\n",
    "unclosed arrays": lambda n: "x = " + "[" * n + "\n",
    "inline tables": lambda n: "x = " + "{a = " * n + "1" + " }" * n + "\n",
    "arrays of tables": lambda n: "x = " + "[{a = " * n + "1" + "}]" * n + "\n",
    "table headers": lambda n: "[" + ".".join(["a"] * n) + "]\nb = 1\n",
    "dotted keys": lambda n: ".".join(["a"] * n) + " = 1\n",
    "namespace values": lambda n: "[namespaces.n]\nid = 1\nvalues = " + "[" * n + "]" * n + "\n",
}


@FAST
@given(kind=st.sampled_from(sorted(DEEP_TOML)), depth=st.integers(TOML_DEPTH + 2, 6000))
def test_deep_toml_is_refused_as_nested(kind: str, depth: int) -> None:
    registry, problems = parse_registry(DEEP_TOML[kind](depth), "r.toml")
    assert registry is None
    assert [str(p) for p in problems] == [
        "r.toml: error: nested more than 64 levels deep: not a registry file"
    ]


def test_cli_refuses_a_deep_registry(tmp_path: Path) -> None:
    deep = tmp_path / "lockdiag.toml"
    deep.write_text("[namespaces.n]\nid = 1\nvalues = " + "[" * 3000 + "\n")
    message = "nested more than 64 levels deep: not a registry file"
    runner = CliRunner()
    checked = runner.invoke(cli, ["registry", "check", "--registry", str(deep)])
    no_traceback(checked)  # registry check reports its findings: exit 1 (errors found)
    assert checked.exit_code == 1
    assert f"{deep}: error: {message}" in checked.stdout
    for command in (["registry", "show"], ["key", "n", "1"]):
        refused(runner.invoke(cli, [*command, "--registry", str(deep)]), str(deep), message)
    listed = runner.invoke(cli, ["list", "--from", str(INCIDENT), "--registry", str(deep)])
    no_traceback(listed)  # a command that can go on without the registry says why, goes on
    assert listed.exit_code == 0
    assert f"lockdiag: warning: registry not used: {deep}: {message}" in listed.stderr


def test_a_registry_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    huge = tmp_path / "lockdiag.toml"
    huge.write_text("# padding\n" * (MAX_SIZE // 10 + 1))
    refused(
        CliRunner().invoke(cli, ["registry", "show", "--registry", str(huge)]),
        str(huge),
        "larger than 1 MiB: not a registry file",
    )


@FAST
@given(st.binary(max_size=2000))
def test_random_bytes_as_a_registry(data: bytes) -> None:
    with written(data, ".toml") as path:
        registry, problems = check_file(path)
        assert registry is not None or any(p.severity == "error" for p in problems)
        result = CliRunner().invoke(cli, ["registry", "show", "--registry", str(path)])
        no_traceback(result)
        assert result.exit_code in (0, 2)
        if result.exit_code:
            assert result.stderr.startswith(f"lockdiag: error: {path}")


TOMLISH = st.lists(
    st.sampled_from([*"[]{}=\"',.#\n \tabnmsi01-_\\\x00é", '"""', "'''", "[namespaces.a]\n",
                     "id = 1\n", "values = "]),
    max_size=200,
).map("".join)  # fmt: skip


@FAST
@given(TOMLISH)
def test_tomlish_text_never_gives_a_traceback(text: str) -> None:
    registry, problems = parse_registry(text, "r.toml")
    assert registry is not None or problems
    with written(text, ".toml") as path:
        result = CliRunner().invoke(cli, ["registry", "check", "--registry", str(path)])
        no_traceback(result)
        assert result.exit_code in (0, 1)


# -- CSV ------------------------------------------------------------------------------------

FORMULAS = ['=HYPERLINK("http://x","y")', "@SUM(1)", "+cmd|' /C calc'!A0", "-2+3", "=1+1"]
# a spreadsheet skips leading whitespace, any Unicode whitespace, before it sees a formula
AFTER_SPACE = [" =1+1", "\u00a0=1+1", "\u3000@SUM(1)", "\u2003 +cmd", "\n-2+3", "  \u2028=1"]


def test_csv_cells_never_start_a_formula() -> None:
    cells: list[Any] = [*FORMULAS, "\t=1", "\r=1", "-", "-12", "+3", "-0.5", "-5,7", "1e5",
                        "-1e5", "a=b", "", -12, 3.5, "x", *AFTER_SPACE, "a =1", "1 -2"]  # fmt: skip
    expected: list[Any] = [*("'" + c for c in FORMULAS), "'\t=1", "'\r=1", "'-", "-12", "+3",
                           "-0.5", "'-5,7", "1e5", "'-1e5", "a=b", "", -12, 3.5, "x",
                           *("'" + c for c in AFTER_SPACE), "a =1", "1 -2"]  # fmt: skip
    assert [csv_cell(c) for c in cells] == expected
    # through render: every table cell and header (a lone carriage return is left out here:
    # Python 3.11's csv writer leaves a cell holding one unquoted when lines end in "\n")
    texts = [c for c in cells if isinstance(c, str) and "\r" not in c]
    out = io.StringIO()
    table = Table(["=HEAD", "APPLICATION"], [[c, "ok"] for c in texts])
    render(Output(lambda: [table], dict), "csv", out)
    rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert rows[0] == ["'=HEAD", "APPLICATION"]
    assert [r[0] for r in rows[1:]] == [csv_cell(c) for c in texts]
    assert [r[0] for r in rows[1:6]] == ["'" + c for c in FORMULAS]


def test_csv_of_real_sessions_is_inert(cluster: Cluster, sessions: Sessions) -> None:
    names = [*FORMULAS, " =1+1", "-12", "plain"]  # PostgreSQL keeps ASCII names only
    pids = {}
    for number, name in enumerate(names):
        worker = sessions.open(name)
        worker.run(f"SELECT pg_advisory_lock(-91, {number})")
        pids[str(worker.pid)] = name
    result = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(), "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    header = rows[0]
    pid, application = header.index("PID"), header.index("APPLICATION")
    shown = {row[pid]: row[application] for row in rows[1:] if row[pid] in pids}
    assert shown == {p: csv_cell(name) for p, name in pids.items()}
    assert shown[next(p for p, n in pids.items() if n == "-12")] == "-12"  # a number stays
    assert all(not cell.lstrip().startswith(("=", "+", "@")) for row in rows for cell in row)


# -- Prometheus label values ----------------------------------------------------------------

RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # the line feeds between series only
EVIL = 'ns\x1b[31m\r\x00\x07\n"\\ \u202e'
EVIL_DSN = "db\x1b[31m\r\x07\n\u202e"  # a command line holds no NUL


def parsed_labels(lines: list[str]) -> list[dict[str, str]]:
    text = "\n".join(lines) + "\n"
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples]


@settings(max_examples=150)
@given(st.lists(st.text(max_size=20), min_size=1, max_size=4))
def test_label_values_reach_the_exposition_inert(values: list[str]) -> None:
    metric = Metric("lockdiag_x", "A test series.")
    for value in values:
        metric.add(1, namespace=value, application=EVIL)
    lines = exposition(labelled([metric], "target", values[0]))
    assert not RAW_CONTROL.search("\n".join(lines))
    assert len(lines) == 2 + len(values)  # HELP, TYPE and one line per series: no line broken
    expected = [
        {"target": clean(values[0]), "namespace": clean(v), "application": clean(EVIL)}
        for v in values
    ]
    assert parsed_labels(lines) == expected


def test_inert_cleans_any_prometheus_client_family() -> None:
    """The exporter's sampler histograms are prometheus_client's own: inert() serves them."""
    histogram = Histogram("lockdiag_h", "A test.", ["target", "namespace"],
                          registry=CollectorRegistry())  # fmt: skip
    histogram.labels("db\x1b]8;;x\x07", "n\r").observe(1)
    for family in histogram.collect():
        for sample in inert(family).samples:
            assert sample.labels["target"] == "db\\e]8;;x\\x07"
            assert sample.labels["namespace"] == "n\\r"


def test_cli_prometheus_labels_are_inert(tmp_path: Path) -> None:
    document = json.loads(INCIDENT.read_text())
    oid = next(o for o, name in document["server"]["databases"].items() if name == "shop")
    document["server"]["databases"][oid] = EVIL
    for session in document["sessions"]:
        session["database"] = EVIL
    crafted = tmp_path / "evil.json"
    crafted.write_text(json.dumps(document))
    runner = CliRunner()
    checked = runner.invoke(cli, ["check", "--from", str(crafted), "--format", "prometheus"])
    assert "lockdiag_advisory_locks" in checked.stdout, checked.stderr
    fleet = runner.invoke(cli, ["check", "--format", "prometheus", "--timeout", "2",
                                "--dsn", f"host=127.0.0.1 port=1 dbname='{EVIL_DSN}'",
                                "--dsn", "host=127.0.0.1 port=1 dbname=other"])  # fmt: skip
    assert "lockdiag_up" in fleet.stdout, fleet.stderr
    for result in (checked, fleet):
        assert not RAW_CONTROL.search(result.stdout.rstrip("\n"))
        labels = parsed_labels(result.stdout.splitlines())
        values = {v for found in labels for v in found.values()}
        assert clean(EVIL) in values or f"127.0.0.1:1/{clean(EVIL_DSN)}" in values


def test_a_targets_file_is_read_with_a_bound(tmp_path: Path) -> None:
    """--targets /dev/zero: refused at once, one line naming the file, never read."""
    result = CliRunner().invoke(cli, ["list", "--targets", "/dev/zero"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "lockdiag: error: /dev/zero: a character device, not a regular file"
    ]
    zeros = tmp_path / "zeros"
    zeros.write_bytes(b"db1\n\0")
    result = CliRunner().invoke(cli, ["list", "--targets", str(zeros)])
    assert result.stderr.splitlines() == [
        f"lockdiag: error: {zeros}: binary data (a NUL byte at byte 4)"
    ]
