"""Snapshots of real lock situations, built by real concurrent sessions."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core import model, snapshot_file
from lockdiag.core.analysis import Flag, Policy, analyse
from lockdiag.core.diagnosis import Diagnosis, WhoHolds, narrow
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.evidence import take_snapshot
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.pg import queries
from lockdiag.registry import Registry
from lockdiag.views.who_holds import verdict

from helpers.registry import parsed_registry
from helpers.servers import OBSERVER, OTHER_DB, Sessions

REGISTRY_TEXT = """\
[namespaces.tenant_summary]
id = 4102
expect = "xact"
max_hold = "1s"

[namespaces.leader]
id = 9
form = "bigint"
expect = "session"
"""


@pytest.fixture
def registry() -> Registry:
    return parsed_registry(REGISTRY_TEXT)


def capture(
    cluster: Cluster, user: str = "postgres", scope: model.Scope = "advisory"
) -> model.Snapshot:
    return take_snapshot(cluster.dsn(user=user), 5.0, scope)


def test_idle_session_locks_are_certain_session_locks(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    idle = sessions.open("billing-worker")
    idle.run(
        "SELECT pg_advisory_lock(4102, 73), pg_advisory_lock(-1), "
        "pg_advisory_lock_shared(-5, 7), pg_advisory_lock((9::bigint << 32) | 1)"
    )
    taken = capture(cluster)
    entries = {e.decoded.triple: e for e in analyse(taken, registry, Policy(session_age=0))}  # type: ignore[union-attr]
    assert set(entries) == {
        from_pair(4102, 73),
        from_bigint(-1),
        from_pair(-5, 7),
        from_bigint((9 << 32) | 1),
    }
    for entry in entries.values():
        assert entry.lock.pid == idle.pid
        assert entry.lifetime == "session"
        assert entry.held_at_least is not None and entry.held_at_least >= 0
        assert entry.session is not None and entry.session.application_name == "billing-worker"
    assert entries[from_pair(-5, 7)].lock.mode == "ShareLock"
    summary = entries[from_pair(4102, 73)]
    assert summary.decoded is not None and summary.decoded.label == "tenant_summary 73"
    assert {Flag.LONG_SESSION_LOCK, Flag.EXPECT_XACT} <= set(summary.flags)
    assert Flag.UNREGISTERED in entries[from_bigint(-1)].flags
    # a leader lock declared as an expected session lock raises no flag
    assert entries[from_bigint((9 << 32) | 1)].flags == ()


def test_transaction_holder_lifetime_is_unknown(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    worker = sessions.open("summary-worker", autocommit=False)
    worker.run("SELECT pg_advisory_xact_lock(4102, 74)")
    (entry,) = analyse(capture(cluster), registry)
    assert entry.lifetime == "unknown"
    assert entry.session is not None and entry.session.state == "idle in transaction"
    # idle in transaction: the lock was taken before it went idle, a certain lower bound
    assert entry.held_at_least is not None
    assert Flag.STUCK_OWNER not in entry.flags  # nobody waits


def test_chain_of_waiters(cluster: Cluster, sessions: Sessions, registry: Registry) -> None:
    owner = sessions.open("owner", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 75)")
    first, second = sessions.open("first"), sessions.open("second")
    first.start("SELECT pg_advisory_lock(4102, 75)")
    sessions.waiting(first)
    second.start("SELECT pg_advisory_lock(4102, 75)")
    sessions.waiting(second)

    taken = capture(cluster)
    entries = analyse(taken, registry)
    holder, *waiters = entries
    assert holder.lock.pid == owner.pid and holder.lock.granted
    assert holder.blocks == (first.pid, second.pid)
    assert Flag.STUCK_OWNER in holder.flags
    assert [w.lock.pid for w in waiters] == [first.pid, second.pid]
    assert waiters[0].waits_for == (owner.pid,) and waiters[0].queued_behind == ()
    assert waiters[1].waits_for == (owner.pid,) and waiters[1].queued_behind == (first.pid,)
    assert all(w.waited is not None and w.lifetime is None for w in waiters)

    report = who_holds_of(taken, registry, from_pair(4102, 75))
    assert [h.lock.pid for h in report.holders] == [owner.pid]
    assert [w.lock.pid for w in report.waiters] == [first.pid, second.pid]
    assert verdict(report).startswith("tenant_summary 75 (4102, 75, 2) is held by pid")
    assert "2 waiting" in verdict(report)

    owner.connection.commit()  # the owner lets go: the first waiter gets the lock
    assert first.done()
    later = who_holds_of(capture(cluster), registry, from_pair(4102, 75))
    assert [h.lock.pid for h in later.holders] == [first.pid]
    assert [w.lock.pid for w in later.waiters] == [second.pid]


def test_locks_in_two_databases_are_different_locks(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    here = sessions.open("here")
    there = sessions.open("there", dbname=OTHER_DB)
    here.run("SELECT pg_advisory_lock(4102, 76)")
    there.run("SELECT pg_advisory_lock(4102, 76)")  # no conflict: another database
    report = who_holds_of(capture(cluster), registry, from_pair(4102, 76))
    assert sorted(h.database or "" for h in report.holders) == [OTHER_DB, "postgres"]
    assert report.waiters == []
    assert any("per database" in note for note in report.notes)


def test_observer_without_privileges_sees_hidden_sessions(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    idle = sessions.open("secret-worker")
    idle.run("SELECT pg_advisory_lock(4102, 77)")
    taken = capture(cluster, user=OBSERVER)
    assert not taken.server.read_all_stats
    (entry,) = analyse(taken, registry)
    assert entry.lock.pid == idle.pid  # pg_locks is readable by everyone
    assert entry.session is not None and entry.session.hidden
    assert entry.session.application_name == "secret-worker"  # kept without privileges
    assert entry.lifetime == "unknown"  # never claimed without the evidence
    assert entry.held_at_least is None
    (note,) = who_holds_of(taken, registry, from_pair(4102, 77)).notes
    assert f"GRANT pg_monitor (or pg_read_all_stats) TO {OBSERVER}" in note


def test_all_lock_types_and_own_session_left_out(cluster: Cluster, sessions: Sessions) -> None:
    writer = sessions.open("writer", autocommit=False)
    writer.run("UPDATE items SET note = 'y' WHERE id = 1")
    taken = capture(cluster, scope="all")
    assert taken.scope == "all"
    assert taken.server.backend_pid not in {lock.pid for lock in taken.locks}
    kinds = {lock.locktype for lock in taken.locks if lock.pid == writer.pid}
    assert {"relation", "virtualxid", "transactionid"} <= kinds
    assert capture(cluster).locks == []  # advisory scope: nothing


def test_snapshot_query_reads_pg_locks_once() -> None:
    for versions in queries.VERSIONS.values():
        for _, name in versions:
            sql = re.sub(r"--[^\n]*", "", queries.load(name))
            assert sql.count("pg_locks") <= 1


def test_unsupported_version_is_refused() -> None:
    with pytest.raises(Exception, match="needs PostgreSQL 14"):
        queries.query("snapshot", 130012)


def test_file_round_trip(
    cluster: Cluster, sessions: Sessions, tmp_path: Path, registry: Registry
) -> None:
    worker = sessions.open("file-worker")
    worker.run("SELECT pg_advisory_lock(4102, 78), pg_advisory_lock(-9)")
    taken = capture(cluster, scope="all")
    path = tmp_path / "incident.json"
    snapshot_file.save(taken, path)
    loaded = snapshot_file.load(path)
    assert loaded.locks == taken.locks
    assert loaded.sessions == taken.sessions
    assert loaded.server == taken.server
    assert analyse(loaded, registry) == analyse(taken, registry)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", ":1: not a snapshot file: invalid JSON"),
        ("[]", "not a lockdiag snapshot file"),
        ('{"format": "lockdiag-snapshot", "version": 99}', "version 99 is not supported"),
        (
            '{"format": "lockdiag-snapshot", "version": 1, "scope": "advisory", "source": "x", '
            '"server": {}, "sessions": [], "locks": []}',
            "server.version_num: expected an integer",
        ),
    ],
)
def test_bad_snapshot_files(text: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        snapshot_file.loads(text, "f.json")


def test_bad_field_is_named(cluster: Cluster, sessions: Sessions) -> None:
    sessions.open("w").run("SELECT pg_advisory_lock(1)")
    document = snapshot_file.dumps(capture(cluster))
    broken = re.sub(r'"pid": (\d+)', r'"pid": "\1"', document, count=1)
    with pytest.raises(InputError, match=r"f.json: sessions\[0\].pid: expected an integer"):
        snapshot_file.loads(broken, "f.json")


def test_max_hold_needs_a_certain_lower_bound(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    worker = sessions.open("slow-summary", autocommit=False)
    worker.run("SELECT pg_advisory_xact_lock(4102, 79)")
    sessions.until(
        lambda admin: bool(admin.execute(
            "SELECT now() - state_change > interval '1.1 s' FROM pg_stat_activity WHERE pid = %s",
            (worker.pid,),
        ).fetchone()[0]),  # type: ignore[index]
        5,
        "the worker to be idle in transaction for over a second",
    )  # fmt: skip
    (entry,) = analyse(capture(cluster), registry)
    assert entry.lifetime == "unknown"
    assert (
        Flag.MAX_HOLD in entry.flags
    )  # idle in transaction since > 1s: held > max_hold, certainly


def test_a_screenful_keeps_waiters_and_their_holders(
    cluster: Cluster, sessions: Sessions, registry: Registry
) -> None:
    sessions.open("many").run("SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, 500) g")
    owner = sessions.open("owner", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 500)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 500)")
    sessions.waiting(waiter)
    taken = capture(cluster)
    narrowed = narrow(taken, 20)
    assert narrowed is not None
    report = Diagnosis(*narrowed[:1], registry, total=narrowed[1]).listing()
    assert report.narrowed and report.total == 502
    assert len(report.entries) == 20
    pids = {
        e.lock.pid for e in report.entries if e.decoded and e.decoded.triple == from_pair(4102, 500)
    }
    assert pids == {owner.pid, waiter.pid}
    holder = next(e for e in report.entries if e.lock.pid == owner.pid)
    assert holder.blocks == (waiter.pid,)
    assert narrow(capture(cluster), 1000) is None


def who_holds_of(snapshot: model.Snapshot, registry: Registry, key: LockTriple) -> WhoHolds:
    return Diagnosis(snapshot, registry).who_holds(key)


# -- the snapshot file written in pieces -------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HOSTILE = ["},\n   {", '"},\n  {"', "\\", "é日本", "\u2028", "\x7f", "\x1b[2J", ""]


def as_written_whole(text: str) -> str:
    """The text json.dumps(indent=1) gives for the document ``text`` holds: what the file's
    text was when it was made whole, before it was written in pieces."""
    return json.dumps(json.loads(text), indent=1, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 4096])
def test_the_file_in_pieces_is_the_whole_text(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    """Hostile strings (a lock separator's text, quotes, line separators), waiters (whose
    lists of blockers have lines of their own) and a span, in pieces that split them
    anywhere: the text is the one json.dumps(indent=1) makes, and it loads the same locks."""
    monkeypatch.setattr(snapshot_file, "PIECE", piece)
    shot, saved = snapshot_file.load_with_registry(EXAMPLES / "incident.json")
    names = saved[0] if saved else None
    locks = list(shot.locks)
    for index, text in enumerate(HOSTILE):
        locks.insert(2 * index, locks[index]._replace(virtualtransaction=text, mode=text))
    first = locks[0]
    locks.append(first._replace(keys=5, objid_last=(first.objid or 0) + 4, blocked_by=()))
    assert any(lock.blocked_by for lock in locks) and not locks[-1].blocked_by
    for variant in (dataclasses.replace(shot, locks=locks), dataclasses.replace(shot, locks=[])):
        text = "".join(snapshot_file.pieces(variant, names))
        assert text == as_written_whole(text) == snapshot_file.dumps(variant, names)
        assert ("registry" in json.loads(text)) == (names is not None)
        assert snapshot_file.loads(text).locks == variant.locks


def test_a_snapshot_streamed_is_the_whole_text(
    cluster: Cluster, sessions: Sessions, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`snapshot -o -` and `-o FILE` of a real incident (a holder of many keys, a waiter),
    written 7 locks at a time."""
    monkeypatch.setattr(snapshot_file, "PIECE", 7)
    holder = sessions.open("many")
    holder.run("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 50) AS g")
    waiter = sessions.open("queued")
    waiter.start("SELECT pg_advisory_lock(25)")
    sessions.waiting(waiter)
    saved = tmp_path / "incident.json"
    streamed = CliRunner().invoke(cli, ["snapshot", "-o", "-", "--dsn", cluster.dsn()])
    written = CliRunner().invoke(cli, ["snapshot", "-o", str(saved), "--dsn", cluster.dsn()])
    assert streamed.exit_code == written.exit_code == 0, streamed.stderr + written.stderr
    for text in (streamed.stdout, saved.read_text(encoding="utf-8")):
        assert text == as_written_whole(text)
        locks = snapshot_file.loads(text).locks
        assert sum(lock.pid == holder.pid for lock in locks) == 50
        (queued,) = [lock for lock in locks if lock.pid == waiter.pid and not lock.granted]
        assert queued.blocked_by == (holder.pid,)
    assert [p.name for p in tmp_path.iterdir()] == ["incident.json"]


def test_a_piece_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "kept.json"
    path.write_text("old\n")

    def pieces() -> Iterator[str]:
        yield "new, "
        raise RuntimeError("a piece could not be made")

    with pytest.raises(RuntimeError, match="could not be made"):
        snapshot_file.write_whole(path, pieces(), "snapshot file")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]


@pytest.mark.parametrize(
    ("arguments", "noted"),
    [(["blockers"], True), (["check"], True), (["list", "--all"], True), (["list"], False)],
)
def test_a_file_of_advisory_locks_only_is_said_where_every_lock_is_read(
    tmp_path: Path, arguments: list[str], noted: bool
) -> None:
    """A file saved with --advisory-only, read by a command that reads every lock type."""
    saved = json.loads((EXAMPLES / "incident.json").read_text())
    path = tmp_path / "advisory.json"
    path.write_text(json.dumps(dict(saved, scope="advisory")))
    result = CliRunner().invoke(cli, [*arguments, "--from", str(path)])
    assert ("holds advisory locks only" in result.stderr) is noted, result.stderr
