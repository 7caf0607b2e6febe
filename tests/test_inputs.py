"""Every input file bounded, every string shown as it is: invisible characters (Unicode
category Cf: zero-width spaces, direction marks, the byte order mark...) visible in every
output; a lone surrogate or bytes that are not UTF-8 read as U+FFFD; a file of empty arrays
refused before it is parsed, its memory measured; a FIFO refused at once, never waited on;
registry, settings and targets files bounded by what they hold, not only by their size.

Snapshot files (the bundled incident, changed) stand in for a server: a string reaches every
view the same way from either."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from lockdiag.cli import cli
from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.incident import Incident
from lockdiag.errors import InputError
from lockdiag.evidence import source as fleet
from lockdiag.registry import load_registry, read_bounded
from lockdiag.registry import validation as registry_validation
from lockdiag.render import _INVISIBLE, clean
from lockdiag.settings import MAX_ELEMENTS as SETTINGS_ELEMENTS
from lockdiag.views.exporter import page

ROOT = Path(__file__).resolve().parent.parent
INCIDENT = ROOT / "examples" / "incident.json"
REGISTRY = ROOT / "examples" / "lockdiag.toml"
KEY = "4102,73"  # the incident's most contended key: held by billing-worker, two waiting

INVISIBLE = {
    "zero-width space": "\u200b",
    "zero-width non-joiner": "\u200c",
    "zero-width joiner": "\u200d",
    "left-to-right mark": "\u200e",
    "right-to-left mark": "\u200f",
    "left-to-right embedding": "\u202a",
    "right-to-left override": "\u202e",
    "pop directional formatting": "\u202c",
    "left-to-right isolate": "\u2066",
    "pop directional isolate": "\u2069",
    "Arabic letter mark": "\u061c",
    "byte order mark": "\ufeff",
    "soft hyphen": "\u00ad",
    "word joiner": "\u2060",
    "Mongolian vowel separator": "\u180e",
    "tag latin capital A": "\U000e0041",
}
HIDDEN = "".join(INVISIBLE.values())
SHOWN = {
    name: f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF
    else f"\\U{ord(c):08x}"
    for name, c in INVISIBLE.items()
}  # fmt: skip
APP = f"billing{HIDDEN}worker"
QUERY = f"select pg_advisory_lock(4102, 73) /* {HIDDEN} */"
DATABASE = f"shop{HIDDEN}"


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "250", **(env or {})})


def answered(result: Result, codes: tuple[int, ...] = (0,)) -> str:
    """The command's stdout, after checking that it answered: no exception, no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code in codes, (result.exit_code, result.stderr)
    return result.stdout


def changed_incident(tmp_path: Path, application: str, query: str, database: str) -> Path:
    """The bundled incident with every session's application name and query, and the shop
    database's name, replaced; written with every non-ASCII character escaped."""
    document = json.loads(INCIDENT.read_text())
    for session in document["sessions"]:
        session["application_name"] = application
        session["query"] = query
        session["database"] = database
    server = document["server"]
    oid = next(o for o, name in server["databases"].items() if name == server["database"])
    server["databases"][oid] = server["database"] = database
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(document))
    return path


def hidden_in(text: str) -> list[str]:
    return [name for name, char in INVISIBLE.items() if char in text]


def every_one_shown(text: str) -> None:
    assert not hidden_in(text), hidden_in(text)
    for name, escape in SHOWN.items():
        assert escape in text, (name, escape)


# -- invisible characters --------------------------------------------------------------------


def test_the_class_holds_every_invisible_character_of_this_python() -> None:
    """Every character of Unicode categories Cc, Cf, Cs, Zl and Zp (as this Python's
    unicodedata knows them) is made visible; nothing else is, but characters this Python does
    not know yet (Cn: the list follows Unicode 15.1)."""
    wanted = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        category = unicodedata.category(char)
        matched = _INVISIBLE.match(char) is not None
        if category in wanted:
            assert matched, f"U+{code:04X} ({category}) is not made visible"
        else:
            assert not matched or category == "Cn", f"U+{code:04X} ({category}) is changed"


def test_clean_writes_each_as_python_does() -> None:
    assert clean(f"a{HIDDEN}b") == "a" + "".join(SHOWN.values()) + "b"
    assert clean("é\u00a0計") == "é\u00a0計"  # printable text, non-ASCII too, is kept
    assert clean("\ud800") == "\\ud800"  # a surrogate, which no output could encode


@pytest.mark.parametrize("fmt", ["plain", "csv", "markdown", "table"])
def test_invisible_characters_are_visible_in_list(tmp_path: Path, fmt: str) -> None:
    crafted = changed_incident(tmp_path, APP, QUERY, DATABASE)
    shown = answered(run("list", "--from", str(crafted), "--format", fmt))
    assert not hidden_in(shown), hidden_in(shown)
    if fmt == "plain":
        every_one_shown(shown)
        assert clean(APP) in shown
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(shown)))
        assert {row["APPLICATION"] for row in rows if row["APPLICATION"]} == {clean(APP)}
    elif fmt == "markdown":
        assert clean(APP).replace("\\", "\\\\") in shown  # md_escape doubles the backslashes
    else:  # a terminal cuts a long cell: its start is enough
        assert "billing\\u200b\\u200c" in shown


@pytest.mark.parametrize("fmt", ["plain", "markdown", "table"])
def test_invisible_characters_are_visible_in_who_holds(tmp_path: Path, fmt: str) -> None:
    crafted = changed_incident(tmp_path, APP, QUERY, DATABASE)
    shown = answered(run("who-holds", "--key", KEY, "--from", str(crafted), "--format", fmt))
    assert not hidden_in(shown), hidden_in(shown)
    assert "billing\\u200b\\u200c" in shown.replace("\\\\", "\\")
    if fmt == "plain":
        every_one_shown(shown)


def test_json_keeps_the_exact_strings(tmp_path: Path) -> None:
    crafted = changed_incident(tmp_path, APP, QUERY, DATABASE)
    document = json.loads(answered(run("list", "--from", str(crafted), "--format", "json")))
    assert {lock["application_name"] for lock in document["locks"] if lock["pid"] == 4163} == {APP}


def test_invisible_characters_are_visible_in_check(tmp_path: Path) -> None:
    crafted = changed_incident(tmp_path, APP, QUERY, DATABASE)
    for fmt in ("plain", "nagios"):
        shown = answered(run("check", "--from", str(crafted), "--format", fmt), (2,))
        assert not hidden_in(shown), (fmt, hidden_in(shown))
        assert f"pid 4163 ({clean(APP)})" in shown, fmt


def test_invisible_characters_are_visible_in_prometheus_labels(tmp_path: Path) -> None:
    crafted = changed_incident(tmp_path, APP, QUERY, DATABASE)
    shown = answered(run("check", "--from", str(crafted), "--format", "prometheus"), (0, 2))
    assert not hidden_in(shown), hidden_in(shown)
    families = text_string_to_metric_families(shown)
    databases = {s.labels.get("database") for f in families for s in f.samples}
    assert clean(DATABASE) in databases


@dataclasses.dataclass
class Target:
    """What the exporter's page reads of a target (views.exporter.TargetState)."""

    name: str
    report: Incident | None
    error: str | None = None
    seconds: float = 0.01
    taken_at: float = dataclasses.field(default_factory=time.monotonic)
    down_since: float | None = None
    stalled: bool = False


def test_invisible_characters_are_visible_on_the_exporter_page(tmp_path: Path) -> None:
    snapshot = snapshot_file.load(changed_incident(tmp_path, APP, QUERY, DATABASE))
    policy = CheckPolicy()
    diagnosis = Diagnosis(snapshot, load_registry(str(REGISTRY)), policy.analysis_policy())
    markup = page([Target(f"db{HIDDEN}:5432", diagnosis.incident(policy))], 1.0)
    assert not hidden_in(markup), hidden_in(markup)
    assert clean(APP) in markup  # the holder
    assert clean(QUERY) in markup  # its last query
    assert f"db{clean(HIDDEN)}:5432" in markup  # the target's name


def test_invisible_characters_are_visible_in_registry_show(tmp_path: Path) -> None:
    registry = tmp_path / "lockdiag.toml"
    text = REGISTRY.read_text().replace('owner = "reporting"', f'owner = "report{HIDDEN}ing"')
    text = text.replace("Rebuild one tenant's", f"Rebuild{HIDDEN} one tenant's")
    registry.write_text(text)
    for fmt in ("plain", "table"):
        shown = answered(run("registry", "show", "--registry", str(registry), "--format", fmt))
        assert not hidden_in(shown), (fmt, hidden_in(shown))
        assert "report\\u200b\\u200c" in shown.replace("\\\\", "\\"), fmt
    decoded = answered(run("decode", "4102", "73", "--registry", str(registry)))
    assert not hidden_in(decoded) and "Rebuild\\u200b" in decoded


# -- text that is not UTF-8, lone surrogates ----------------------------------------------------


LONE = {"high": "lone\ud800high", "low": "lone\udc00low", "pair": "pair\U0001f600ok"}


def lone_surrogates(tmp_path: Path) -> Path:
    """json.dumps writes a lone surrogate as an escape, ``"\\ud800"``, as any JSON writer may."""
    path = changed_incident(tmp_path, LONE["high"], LONE["low"], "shop")
    assert "\\ud800" in path.read_text() and "\\ud83d\\ude00" not in path.read_text()
    document = json.loads(path.read_text())
    document["sessions"][1]["application_name"] = LONE["pair"]
    path.write_text(json.dumps(document))
    assert "\\ud83d\\ude00" in path.read_text()  # a pair, also escaped: one character
    return path


@pytest.mark.parametrize(
    "command",
    [
        "list --format plain", "list --format csv", "list --format json",
        "list --format markdown", "list --format table", f"who-holds --key {KEY}",
        f"who-holds --key {KEY} --format json", "blockers", "check", "check --format nagios",
        "check --format prometheus", "check --format json", "snapshot",
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_read_as_a_replacement_character(tmp_path: Path, command: str) -> None:
    crafted = lone_surrogates(tmp_path)
    shown = answered(run(*command.split(), "--from", str(crafted)), (0, 2))
    if command.startswith(("list", "who-holds")):
        assert "lone\ufffdhigh" in shown
    if "json" in command:
        text = json.dumps(json.loads(shown), ensure_ascii=False)
        assert "lone\ufffdhigh" in text or command.startswith("check")
    if command.startswith("list --format json"):
        assert LONE["pair"] in text  # a pair is one character, kept


def test_a_lone_surrogate_becomes_one_replacement_character(tmp_path: Path) -> None:
    snapshot = snapshot_file.load(lone_surrogates(tmp_path))
    applications = {s.application_name for s in snapshot.sessions.values()}
    queries = {s.query for s in snapshot.sessions.values()}
    assert applications == {"lone\ufffdhigh", LONE["pair"]}
    assert queries == {"lone\ufffdlow"}


def test_bytes_that_are_not_utf8_are_read_as_replacement_characters(tmp_path: Path) -> None:
    """A snapshot file edited in another encoding (Latin-1), or with an encoded surrogate
    (which the json module would have taken as it is)."""
    text = changed_incident(tmp_path, "caf-APP", "q-QUERY", "shop").read_bytes()
    crafted = tmp_path / "latin1.json"
    crafted.write_bytes(text.replace(b"-APP", b"\xe9").replace(b"-QUERY", b"\xed\xa0\x80"))
    snapshot = snapshot_file.load(crafted)
    assert {s.application_name for s in snapshot.sessions.values()} == {"caf\ufffd"}
    assert {s.query for s in snapshot.sessions.values()} == {"q\ufffd\ufffd\ufffd"}
    for fmt in ("plain", "json", "csv"):
        assert "caf\ufffd" in answered(run("list", "--from", str(crafted), "--format", fmt))
    recording = tmp_path / "watch.jsonl"
    recording.write_bytes(b"\xff" + text.replace(b"\n", b"") + b"\n")
    answered(run("watch", "--once", "--from", str(recording)), (0, 2))


def test_registry_settings_and_targets_files_in_another_encoding(tmp_path: Path) -> None:
    registry = tmp_path / "lockdiag.toml"
    registry.write_bytes(REGISTRY.read_bytes().replace(b"reporting period", b"p\xe9riode"))
    shown = answered(run("registry", "show", "--registry", str(registry)))
    assert "p\ufffdriode" in shown
    settings_file = tmp_path / "settings.toml"
    settings_file.write_bytes(b"# r\xe9glages\n[defaults]\nformat = 'json'\n")
    shown = answered(
        run("list", "--from", str(INCIDENT), env={"LOCKDIAG_SETTINGS": str(settings_file)})
    )
    assert json.loads(shown)["locks"]
    targets = tmp_path / "targets"
    targets.write_bytes(b"# \xe9quipe\nhost=db1\n")
    assert fleet.read_targets(targets) == ["host=db1"]


# -- element counts ----------------------------------------------------------------------------

HEAD = '{"format": "lockdiag-snapshot", "version": 1, "notes": '


def elements(value: Any) -> int:
    """What the bound counts: each array or object's items or members (one, for an empty
    one), its own and those of everything inside it."""
    if isinstance(value, list):
        return max(1, len(value)) + sum(map(elements, value))
    if isinstance(value, dict):
        return max(1, len(value)) + sum(map(elements, value.values()))
    return 0


TRICKY = st.text(st.sampled_from(list('[]{}",:\\ab\n\u2028é')), max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150)
@given(value=VALUES, ascii=st.booleans())
def test_elements_are_counted_outside_strings_exactly(value: Any, ascii: bool) -> None:
    """Commas and brackets in strings never count; a document is refused for its elements
    exactly when it has more than the bound."""
    text = HEAD + json.dumps([value], ensure_ascii=ascii) + "}"
    counted = elements(json.loads(text))
    for bound, refused in ((counted, False), (counted - 1, True)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(snapshot_file, "MAX_ELEMENTS", bound)
            with pytest.raises(InputError) as caught:
                snapshot_file.loads(text, "f.json")
        assert ("elements" in str(caught.value)) == refused, (bound, str(caught.value))


def big_snapshot(locks: int) -> dict[str, Any]:
    """The incident's advisory locks and sessions multiplied: a hundred locks a session, one
    lock in two waiting with its blocker listed (more elements a lock than a real one)."""
    document: dict[str, Any] = json.loads(INCIDENT.read_text())
    lock = next(row for row in document["locks"] if row["locktype"] == "advisory")
    session = document["sessions"][0]
    document["sessions"], document["locks"] = [], []
    for number in range(locks // 100):
        pid = 100_000 + number
        document["sessions"].append(
            dict(session, pid=pid, application_name=f"worker-{number}",
                 query=f"select pg_advisory_lock({number}, $1) from jobs where id = {number}")
        )  # fmt: skip
        for index in range(100):
            waiting = index % 2 == 1
            document["locks"].append(
                dict(lock, pid=pid, classid=number, objid=index, granted=not waiting,
                     waitstart=lock["waitstart"] if waiting else None,
                     blocked_by=[pid - 1] if waiting else None)
            )  # fmt: skip
    return document


def test_a_snapshot_of_300k_locks_is_within_the_bound() -> None:
    """Counted on a snapshot of 2,000 locks and scaled: 300,000 such locks stay well within
    the bound (a 300,000-lock snapshot, 110 MB, loads in some 5 s and 460 MB)."""
    document = big_snapshot(2000)
    text = snapshot_file.dumps(snapshot_file.loads(json.dumps(document), "big.json"))
    per_lock = elements(json.loads(text)) / 2000
    assert 17 <= per_lock < 20
    assert per_lock * 300_000 < 0.75 * snapshot_file.MAX_ELEMENTS


PEAK_PROBE = (
    "import resource, subprocess, sys;"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
    "print(done.stderr, end='')"
)


def peak(*args: str) -> tuple[int, float, str]:
    """Exit code, peak memory in MB and stderr of a lockdiag process, measured by a fresh
    process that runs only it."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, sys.executable, "-m", "lockdiag", *args],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    first, _, stderr = done.stdout.partition("\n")
    code, kilobytes = first.split()
    return int(code), int(kilobytes) / 1024, stderr


def test_a_file_of_empty_arrays_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """16 MB of empty arrays: 5.6 million of them, which the json module would build in some
    450 MB. Refused for its elements, in about the memory of reading it."""
    bomb = tmp_path / "arrays.json"
    bomb.write_text(HEAD + "[" + "[]," * (16 * 2**20 // 3) + "[]]}")
    code, megabytes, stderr = peak("list", "--from", str(bomb))
    assert code == 2
    assert stderr == (
        f"lockdiag: error: {bomb}: more than 8,000,000 elements (array items, object members): "
        "not a snapshot file\n"
    )
    _, baseline, _ = peak("list", "--from", str(INCIDENT))
    assert megabytes - baseline < 80, (megabytes, baseline)


def registry_answer(path: Path) -> str:
    return answered(run("registry", "check", "--registry", str(path)), (0, 1))


def test_registry_settings_and_targets_are_bounded_by_what_they_hold(tmp_path: Path) -> None:
    registry = tmp_path / "lockdiag.toml"
    bound = registry_validation.MAX_ELEMENTS
    registry.write_text("".join(f"[t{i}]\n" for i in range(bound + 1)))  # 400 KB, under 1 MiB
    assert (
        f"{registry}: error: more than {bound:,} elements (values, items, tables): "
        "not a registry file"
    ) in registry_answer(registry)
    registry.write_text(REGISTRY.read_text() + "# " + "[{,=." * 20_000 + "\n")
    assert "error" not in registry_answer(registry)  # in a comment, nothing counts
    settings_file = tmp_path / "settings.toml"
    settings_file.write_text("[defaults]\nformat = [" + "0," * SETTINGS_ELEMENTS + "]\n")
    result = run("list", "--from", str(INCIDENT), env={"LOCKDIAG_SETTINGS": str(settings_file)})
    assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[0] == (
        f"lockdiag: error: settings file {settings_file}: more than {SETTINGS_ELEMENTS:,} "
        "elements (values, items, tables): not a settings file"
    )
    settings_file.write_text("[defaults]\nformat = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = run("list", "--from", str(INCIDENT), env={"LOCKDIAG_SETTINGS": str(settings_file)})
    assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[0].endswith(
        "nested more than 64 levels deep: not a settings file"
    )
    targets = tmp_path / "targets"
    targets.write_text("".join(f"host=db{i}\n" for i in range(fleet.MAX_TARGETS)))
    assert len(fleet.read_targets(targets)) == fleet.MAX_TARGETS
    targets.write_text(targets.read_text() + "# a comment\nhost=one-more\n")
    result = run("list", "--targets", str(targets))
    assert result.exit_code == 2
    # the registry this test left in the working directory is said first (found, not named)
    assert result.stderr.splitlines()[-1] == (
        f"lockdiag: error: {targets}: names more than 1000 servers, the most one command reads"
    )
    assert len(result.stderr.splitlines()) == 2 and "(found in the working directory" in (
        result.stderr
    )


# -- FIFOs and devices -------------------------------------------------------------------------

HANG = 30  # seconds: a command still running then has waited on the FIFO


def lockdiag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lockdiag in a process of its own, so that one that waits forever fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "lockdiag", *args], capture_output=True, text=True,
        timeout=HANG, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """No writer: opening it to read would wait for one forever. Refused in well under a
    second, by every reader of a file the user names."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    probe = (
        "import sys, time; from pathlib import Path; from lockdiag.registry import read_bounded;"
        "started = time.monotonic()\n"
        "try: read_bounded(Path(sys.argv[1]), 1024, 'file')\n"
        "except Exception as error: print(error, time.monotonic() - started)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(fifo)],
        capture_output=True, text=True, timeout=HANG, check=True,
    )  # fmt: skip
    reason, seconds = done.stdout.rsplit(" ", 1)
    assert reason == "a FIFO, not a regular file"
    assert float(seconds) < 1.0
    settings_file = {"LOCKDIAG_SETTINGS": str(fifo)}
    expected = [
        (f"list --from {fifo}", {}, f"cannot read snapshot file {fifo}: a FIFO"),
        (f"watch --once --from {fifo}", {}, f"cannot read recording {fifo}: a FIFO"),
        (f"list --targets {fifo}", {}, f"{fifo}: a FIFO"),
        (f"list --from {INCIDENT}", settings_file, f"settings file {fifo}: a FIFO"),
    ]
    registry = lockdiag("registry", "show", "--registry", str(fifo))  # looked at first
    assert registry.returncode == 2
    assert registry.stderr.endswith(f"{fifo} (from --registry) is not a file\n")
    for command, env, message in expected:
        result = lockdiag(*command.split(), env=env)
        assert result.returncode == 2, (command, result.stderr)
        first = result.stderr.splitlines()[0]  # a bad settings file has a hint after it
        assert first == f"lockdiag: error: {message}, not a regular file", command


def test_a_fifo_with_a_writer_is_refused_too(tmp_path: Path) -> None:
    """A writer on the other end (a snapshot piped in) changes nothing: a file is needed."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({str(fifo)!r}, 'w').write(open({str(INCIDENT)!r}).read())"]
    )
    try:
        result = lockdiag("list", "--from", str(fifo))
        assert result.returncode == 2
        assert result.stderr.endswith("a FIFO, not a regular file\n")
    finally:
        writer.kill()
        writer.wait()


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^a directory, not a regular file$"):
        read_bounded(tmp_path, 1024, "snapshot file")
