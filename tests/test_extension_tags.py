"""Advisory locks with an objsubid other than 1 or 2: an extension's C code takes them
(``SET_LOCKTAG_ADVISORY``: pg_auto_failover's monitor 10 and 11, Citus 4 and up). Built by
hand here, for the pure paths; tests/test_auto_failover.py takes real ones.

Each is listed by its numbers as an extension's tag, takes part in wait chains, is counted,
and is never named from the registry or the catalogue, never a session lock of the team's,
never an unregistered key."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockdiag.cli import cli
from lockdiag.core import snapshot_file
from lockdiag.core.analysis import Flag, namespace_of
from lockdiag.core.decoding import spans_decodable
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, Kind
from lockdiag.core.model import LockRow, Snapshot, tag_label
from lockdiag.errors import InputError
from lockdiag.keys import AdvisoryTag, InvalidKey, LockTriple, parse_lock, parse_numbers
from lockdiag.logs import LogReader, Tally
from lockdiag.logs.report import report as log_report
from lockdiag.registry import Registry
from lockdiag.views.common import EntryEncoder, entry_data

from helpers.cli import run
from helpers.registry import parsed_registry
from helpers.snapshots import advisory, session, snapshot

FORMATION = 822708183  # pg_auto_failover: string_hash('default'), the formation's number
# a registry whose namespaces' ids are a tag's classid, in both forms, and a key equal to a
# tag's classid and objid: none of them may name a tag
REGISTRY = f"""
[namespaces.group_pair]
id = {FORMATION}
[namespaces.group_bigint]
id = {FORMATION}
form = "bigint"
[namespaces.small]
id = 0
"""


def tag(
    pid: int, classid: int, objid: int, objsubid: int, granted: bool = True, **more: Any
) -> LockRow:
    row = advisory(pid, objid, granted, namespace=classid, **more)
    return row._replace(objsubid=objsubid)


def registry() -> Registry:
    return parsed_registry(REGISTRY)


def incident() -> Snapshot:
    """pg_auto_failover's shape: pid 10 idle in transaction holds the formation (10, Share)
    and a node group (11); 11 waits for the formation (Exclusive), 12 queues behind it; pid
    20, idle outside a transaction for an hour, holds Citus-like tags 4 and 5 (certain
    session-level)."""
    sessions = [
        session(10, "idle in transaction", -timedelta(minutes=8), True, "holder"),
        session(11, "active", -timedelta(minutes=8), application="register"),
        session(12, "active", -timedelta(minutes=7), application="node-active"),
        session(20, "idle", -timedelta(hours=1), application="citus"),
    ]
    locks = [
        tag(10, 0, FORMATION, 10)._replace(mode="ShareLock"),
        tag(10, FORMATION, 0, 11),
        tag(11, 0, FORMATION, 10, granted=False, blocked_by=(10,), waited=480),
        tag(12, 0, FORMATION, 10, False, blocked_by=(11,), waited=420)._replace(mode="ShareLock"),
        tag(20, 0, 102008, 4)._replace(mode="RowExclusiveLock"),
        tag(20, 0, 102008, 5)._replace(mode="ShareUpdateExclusiveLock"),
    ]  # fmt: skip
    return snapshot(sessions, locks)


def test_a_tag_is_its_numbers_never_a_key() -> None:
    assert parse_lock(["0,822708183,10"]) == AdvisoryTag(0, FORMATION, 10)
    assert isinstance(parse_lock(["0", "822708183", "10"]), AdvisoryTag)
    assert parse_lock(["4102,73,2"]) == LockTriple(4102, 73, 2)  # a key stays a key
    assert parse_lock(["0"]) == LockTriple(0, 0, 1)
    assert str(AdvisoryTag(0, FORMATION, 10)) == "0,822708183,10"
    assert AdvisoryTag(0, 5, 0).label == "extension advisory tag 0,5,0"  # 0 is no key form
    for numbers in ((0, 1, 65536), (0, 2**32, 10), (-1, 0, 10), (0, 0, 1), (0, 0, 2)):
        with pytest.raises(InvalidKey):
            AdvisoryTag(*numbers)
    with pytest.raises(InvalidKey, match="objsubid 10 is not an advisory key form"):
        parse_numbers(["0,1,10"])  # what takes a key only still says what a key is


def test_tags_are_listed_by_their_numbers_never_named_never_flagged() -> None:
    diagnosis = Diagnosis(incident(), registry(), CheckPolicy().analysis_policy())
    entries = diagnosis.listing().entries  # list's default: every advisory lock, tags too
    assert [(e.lock.pid, tag_label(e.lock)) for e in entries] == [
        (20, "extension advisory tag 0,102008,4"),
        (20, "extension advisory tag 0,102008,5"),
        (10, "extension advisory tag 0,822708183,10"),
        (11, "extension advisory tag 0,822708183,10"),
        (12, "extension advisory tag 0,822708183,10"),
        (10, "extension advisory tag 822708183,0,11"),
    ]
    for entry in entries:
        assert entry.decoded is None  # never named: not the registry's pair nor bigint id
        assert entry.lock.advisory_key is None
        assert namespace_of(entry) == "(extension tag)"
        assert Flag.UNREGISTERED not in entry.flags and Flag.LONG_SESSION_LOCK not in entry.flags
    citus = [e for e in entries if e.lock.pid == 20]
    assert {e.lifetime for e in citus} == {"session"}  # a fact of the backend, said as it is
    assert all(e.flags == () for e in citus)  # ... but no session lock of the team's
    report = diagnosis.findings(CheckPolicy())
    kinds = {f.kind for f in report.findings}
    assert Kind.UNREGISTERED not in kinds and Kind.SESSION_LOCK not in kinds
    assert report.census.advisory == {
        ("app", "(extension tag)", "held"): 4,
        ("app", "(extension tag)", "waiting"): 2,
    }
    assert report.census.oldest_session_lock == 0.0  # not one of the team's session locks


def test_a_tag_takes_part_in_the_wait_chain() -> None:
    diagnosis = Diagnosis(incident(), registry())
    (root,) = diagnosis.graph.roots
    assert (root.tree.pid, root.direct, root.total) == (10, 1, 2)
    cause = diagnosis.incident(CheckPolicy()).causes[0]
    assert cause.pid == 10 and cause.label == "extension advisory tag 0,822708183,10"
    findings = diagnosis.findings(CheckPolicy()).findings
    waits = {(f.kind, f.pid, f.lock) for f in findings if f.kind == Kind.LONG_WAIT}
    assert (Kind.LONG_WAIT, 11, "extension advisory tag 0,822708183,10") in waits
    assert any(f.kind == Kind.STUCK_OWNER and f.pid == 10 for f in findings)
    report = diagnosis.who_holds(AdvisoryTag(0, FORMATION, 10))
    assert report.decoded is None and report.label == "extension advisory tag 0,822708183,10"
    assert [e.lock.pid for e in report.holders] == [10]
    assert [e.lock.pid for e in report.waiters] == [11, 12]
    assert not diagnosis.who_holds(AdvisoryTag(0, FORMATION, 12)).held
    # the key with the same numbers in a SQL form is another lock, with no holder
    assert not diagnosis.who_holds(LockTriple(0, FORMATION, 2)).held


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "incident.json"
    snapshot_file.save(incident(), path)
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    return path


def test_every_command_reads_them_from_a_file(saved: Path) -> None:
    where = ("--from", str(saved))
    listed = run("list", *where)
    assert listed.exit_code == 0, listed.output
    assert "extension advisory tag 0,822708183,10" in listed.stdout
    assert "6 lock(s), 2 waiting" in listed.stdout and "unregistered" not in listed.stdout
    document = json.loads(run("list", *where, "--format", "json").stdout)
    formation = next(lock for lock in document["locks"] if lock["pid"] == 11)
    unnamed = ("namespace", "resource", "form", "known", "key")
    assert [formation[k] for k in unnamed] == [None] * len(unnamed)
    assert (formation["classid"], formation["objid"], formation["objsubid"]) == (0, FORMATION, 10)
    assert formation["extension_tag"] is True and formation["waits_for"] == [10]
    assert all(lock["extension_tag"] is True for lock in document["locks"])
    blockers = run("blockers", *where)
    assert "waits 8m for extension advisory tag 0,822708183,10 (ExclusiveLock)" in blockers.stdout
    held = run("who-holds", "--key", "0,822708183,10", *where)
    assert held.exit_code == 0, held.output
    assert (
        "tag: pg_locks classid=0 objid=822708183 objsubid=10: taken by an extension's C code"
        in held.stdout
    )
    answer = json.loads(
        run("who-holds", "--key", "0,822708183,10", *where, "--format", "json").stdout
    )
    assert answer["key"]["extension_tag"] is True and answer["key"]["sql"] is None
    assert [h["pid"] for h in answer["holders"]] == [10] and answer["namespace"] is None
    assert run("who-holds", "--key", "1,2,10", *where).exit_code == 1  # nobody holds it
    checked = run("check", *where)
    assert checked.exit_code == 2 and "extension advisory tag 0,822708183,10" in checked.stdout
    nagios = run("check", *where, "--format", "nagios")
    assert (
        nagios.stdout.startswith("LOCKDIAG CRITICAL") and "extension advisory tag" in nagios.stdout
    )
    series = run("check", *where, "--format", "prometheus").stdout
    assert 'namespace="(extension tag)",state="waiting"} 2.0' in series
    assert 'lockdiag_findings{kind="unregistered",severity="info"} 0.0' in series
    assert json.loads(run("check", *where, "--format", "json").stdout)["status"] == "CRITICAL"
    watched = run("watch", *where, "--once")
    assert watched.exit_code == 0 and "extension advisory tag 822708183,0,11" in watched.stdout
    again = snapshot_file.load(saved)  # the round trip keeps every number
    assert again.locks == incident().locks


@pytest.mark.parametrize(
    ("numbers", "reason"),
    [
        ({"objsubid": 65536}, "locks[0].objsubid: 65536 is outside -32768..65535"),
        # pg_locks.objsubid is an int2: a field4 past 32767 shows negative, never below
        ({"objsubid": -32769}, "locks[0].objsubid: -32769 is outside -32768..65535"),
        ({"classid": 2**32}, "locks[0].classid: 4294967296 is outside 0..4294967295"),
    ],
)
def test_numbers_no_lock_tag_holds_are_refused(
    tmp_path: Path, numbers: dict[str, int], reason: str
) -> None:
    document = json.loads(snapshot_file.dumps(incident()))
    document["locks"][0].update(numbers)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        snapshot_file.load(path)
    result = CliRunner().invoke(cli, ["list", "--from", str(path)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("lockdiag: error: ") and "Traceback" not in result.output


def test_decode_says_what_a_tag_is_in_one_line() -> None:
    result = run("decode", "0", "822708183", "10")
    assert result.exit_code == 0
    assert result.stdout == (
        "extension advisory tag 0,822708183,10: taken by an extension's C code with objsubid 10 "
        "(the SQL functions take only 1 and 2): not a key, and never named (two extensions may "
        "use the same objsubid)\n"
    )
    data = json.loads(run("decode", "1,2,11", "--format", "json").stdout)
    assert data["extension_tag"] is True and data["objsubid"] == 11 and data["args"] is None
    wrong = CliRunner().invoke(cli, ["decode", "1", "2", "70000"])
    assert wrong.exit_code == 2
    assert wrong.stderr == "lockdiag: error: objsubid 70000 is outside -32768..65535\n"


def test_a_span_of_tags() -> None:
    """An aggregated read groups a backend's granted locks nobody waits for by key space
    (classid, objsubid): 70 formation tags are one span, labelled by its ends, and need no
    full read (no name can be inside one)."""
    span = tag(20, 0, 98839241, 10)._replace(keys=70, objid_last=4203148425)
    taken = snapshot([session(20, "idle in transaction", -timedelta(minutes=1), True)], [span])
    assert spans_decodable(taken, registry())
    (entry,) = Diagnosis(taken, registry()).entries
    assert tag_label(entry.lock) == (
        "extension advisory tags 0,98839241,10..0,4203148425,10 (70 tags)"
    )
    report = Diagnosis(taken, registry()).findings(CheckPolicy())
    assert report.census.advisory == {("app", "(extension tag)", "held"): 70}


def test_json_of_spans_and_tags_is_entry_data() -> None:
    """Each item EntryEncoder writes is entry_data()'s, with no field twice: a tag's and a
    span's fields were written twice (a tag's span), or left out (a span after a key of the
    same holder and namespace, whose template it took)."""
    sessions = [
        session(10, "idle", -timedelta(minutes=5)),
        session(11, "active", -timedelta(seconds=5)),
    ]
    locks = [
        advisory(10, 7),
        advisory(10, 100)._replace(keys=70, objid_last=169),
        tag(10, 0, 1, 5)._replace(keys=64, objid_last=64),
        tag(10, 0, FORMATION, 10),
        tag(11, 0, FORMATION, 10, granted=False, blocked_by=(10,)),
    ]  # fmt: skip
    encoder = EntryEncoder()

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in pairs]
        assert len(names) == len(set(names)), names
        return dict(pairs)

    for entry in Diagnosis(snapshot(sessions, locks), Registry()).entries:
        written = json.loads(encoder.encode(entry), object_pairs_hook=once)
        assert written == json.loads(json.dumps(entry_data(entry), default=str))


HEAD = "2026-12-05 08:46:{} UTC [{}] postgres@app/{} "
FORMATION_TAG = "advisory lock [16384,0,822708183,10]"
GROUP_TAG = "advisory lock [16384,822708183,0,11]"
LOG = "".join(
    (
        HEAD.format("26.140", 2586, "register")
        + f"LOG:  process 2586 still waiting for ExclusiveLock on {FORMATION_TAG} after 200.3 ms\n",
        HEAD.format("26.140", 2586, "register")
        + "DETAIL:  Process holding the lock: 2585. Wait queue: 2586.\n",
        HEAD.format("29.140", 2586, "register")
        + f"LOG:  process 2586 acquired ExclusiveLock on {FORMATION_TAG} after 2998.6 ms\n",
        HEAD.format("31.140", 2597, "node-active")
        + f"LOG:  process 2597 detected deadlock while waiting for ExclusiveLock on {GROUP_TAG} "
        "after 200.1 ms\n",
        HEAD.format("31.140", 2597, "node-active") + "ERROR:  deadlock detected\n",
        HEAD.format("31.140", 2597, "node-active")
        + f"DETAIL:  Process 2597 waits for ExclusiveLock on {GROUP_TAG}; "
        "blocked by process 2598.\n",
        f"\tProcess 2598 waits for ShareLock on {FORMATION_TAG}; blocked by process 2597.\n",
    )
)


def test_the_log_names_a_tag_by_its_numbers(tmp_path: Path) -> None:
    path = tmp_path / "postgresql.log"
    path.write_text(LOG)
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    data = json.loads(run("log", str(path), "--format", "json").stdout)
    keys = {k["key"]: k for k in data["keys"]}
    formation = keys["extension advisory tag 0,822708183,10"]
    assert formation["namespace"] == "(extension tag)" and formation["locktype"] == "advisory"
    assert (formation["classid"], formation["objid"], formation["objsubid"]) == (0, FORMATION, 10)
    assert formation["waits"] == 1 and formation["outcomes"] == {"acquired": 1}
    assert "extension advisory tag 822708183,0,11" in keys
    text = run("log", str(path), "--key", "0,822708183,10").stdout
    assert "Timeline of extension advisory tag 0,822708183,10" in text
    assert "acquired ExclusiveLock" in text
    assert "waits for ExclusiveLock on extension advisory tag 822708183,0,11" in text
    tally = Tally()
    tally.read(LogReader(LOG.splitlines(keepends=True), "lines"))
    assert {k.label for k in log_report(tally, registry()).keys} == set(keys)


SUBIDS = st.integers(0, 65535)
OIDS = st.integers(0, 2**32 - 1)


@st.composite
def tagged(draw: st.DrawFn) -> Snapshot:
    """A snapshot of advisory locks of any objsubid (keys and tags alike), held and waited
    for, single or spans."""
    sessions = [
        session(10, "idle in transaction", -timedelta(minutes=9), True),
        session(11, "idle", -timedelta(hours=2)),
        session(12, "active", -timedelta(seconds=3)),
    ]
    locks = []
    for _ in range(draw(st.integers(1, 6))):
        classid, objid, objsubid = (
            draw(OIDS),
            draw(OIDS),
            draw(st.one_of(SUBIDS, st.sampled_from([0, 1, 2, 3, 10, 11]))),
        )
        row = tag(draw(st.sampled_from([10, 11])), classid, objid, objsubid)
        if draw(st.booleans()) and objid < 2**32 - 5:
            row = row._replace(keys=draw(st.integers(2, 5)), objid_last=objid + 5)
        locks.append(row)
        if draw(st.booleans()):
            locks.append(
                tag(12, classid, objid, objsubid, granted=False, blocked_by=(row.pid or 0,))
            )
    return snapshot(sessions, locks)


COMMANDS = [
    ["list"], ["list", "--all", "--format", "json"], ["list", "--format", "csv"], ["blockers"],
    ["blockers", "--format", "json"], ["check"], ["check", "--format", "nagios"],
    ["check", "--format", "prometheus"], ["check", "--format", "json"], ["watch", "--once"],
    ["list", "--format", "markdown"],
]  # fmt: skip


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(taken=tagged(), command=st.sampled_from(COMMANDS))
def test_any_objsubid_never_raises(tmp_path: Path, taken: Snapshot, command: list[str]) -> None:
    path = tmp_path / "any.json"
    snapshot_file.save(taken, path)
    assert snapshot_file.load(path).locks == taken.locks
    diagnosis = Diagnosis(taken, registry())
    diagnosis.listing()
    diagnosis.findings(CheckPolicy())
    for row in taken.locks:
        key = row.advisory_key or row.advisory_tag
        assert key is not None
        diagnosis.who_holds(key)
    encoder = EntryEncoder()
    for entry in diagnosis.entries:
        assert json.loads(encoder.encode(entry)) == json.loads(
            json.dumps(entry_data(entry), default=str)
        )
    result = CliRunner().invoke(cli, [*command, "--from", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 1, 2) and "Traceback" not in result.output
    assert "error" not in result.stderr, result.stderr
    first = taken.locks[0]
    numbers = f"{first.classid},{first.objid},{first.objsubid}"
    held = CliRunner().invoke(cli, ["who-holds", "--key", numbers, "--from", str(path)])
    assert held.exit_code in (0, 1), held.output


def test_tags_sort_with_the_advisory_locks() -> None:
    """The order is by database, lock type, then the lock: an objsubid is 16 bits (the sort
    key kept 2 for it, and objsubid 5 or 10 sorted among the relation and tuple locks)."""
    relation = LockRow(
        "relation", 5, 16384, None, None, None, None, None, None, None, "9/1", 30,
        "AccessShareLock", True,
    )  # fmt: skip
    other = [relation, relation._replace(locktype="tuple", page=0, tuple=1)]
    tags = [tag(20, 0, 5, 10), tag(20, 0, 5, 5), tag(20, 0, 5, 1), tag(20, 0, 5, 4)]
    sessions = [session(pid, "active", -timedelta(seconds=1)) for pid in (20, 30)]
    taken = snapshot(sessions, [*other, relation._replace(relation=5), *tags])
    order = [
        (e.lock.locktype, e.lock.objsubid, e.lock.relation)
        for e in Diagnosis(taken, Registry()).entries
    ]
    assert order == [
        ("advisory", 1, None), ("advisory", 4, None), ("advisory", 5, None), ("advisory", 10, None),
        ("relation", None, 5), ("relation", None, 16384), ("tuple", None, 16384),
    ]  # fmt: skip
