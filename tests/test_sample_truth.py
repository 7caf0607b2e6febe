"""`lockdiag sample` tells the truth: stuck owners are not broad keys, a hold lasts at least as
long as the waits it caused, holds already there at the first sample are no acquisitions (in
`sample` and in the exporter's episodes alike), and the report's header and callouts come
before a long per-key table. Unit tests on snapshots built by hand where timing must be exact,
then one run against real sessions."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.model import ServerInfo, Snapshot
from lockdiag.core.observe import Episodes, Sampler, patterns
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import Analysis, Target, paced, reader
from lockdiag.pg.timeout import Timeout
from lockdiag.registry.model import Poolers
from lockdiag.render import plain, render
from lockdiag.views.sample import sample_output

from helpers.samples import REGISTRY, START, STEP, entries, lock, sampled, session, stuck_owner
from helpers.servers import Sessions


def kinds(sampler: Sampler) -> set[tuple[str, str]]:
    return {(p.kind, p.label) for p in patterns(sampler)}


def test_a_stuck_owner_on_a_lone_key_is_no_broad_key() -> None:
    sampler = sampled(stuck_owner())
    assert kinds(sampler) == {("idle-holder", "tenant_summary 2")}


def test_broad_key_needs_other_keys_of_the_namespace_seen_and_mostly_free() -> None:
    """jobs 1 held by a busy (not idle) session, three sessions waiting 5s for it: alone in its
    namespace it says nothing of the namespace's breadth; with the namespace's other keys seen
    and mostly free it is a broad key."""
    since = START - timedelta(seconds=5)
    people = [session(20, "active", START - timedelta(seconds=30), "busy")]
    people += [session(pid, "active", since, f"report-{pid}") for pid in (21, 22, 23)]
    locks = [lock(20, 4300, 1)] + [lock(pid, 4300, 1, since, by=20) for pid in (21, 22, 23)]
    alone = [(people, locks)] * 8
    assert kinds(sampled(alone)) == set()  # no other key of jobs seen: not broad
    sibling = [session(30, "active", START, "other")]
    with_siblings = [(people + sibling, [*locks, lock(30, 4300, 2)]), *alone[1:]]
    assert kinds(sampled(with_siblings)) == {("broad-key", "jobs 1")}
    busy_siblings = [(people + sibling, [*locks, lock(30, 4300, 2)])] * 8
    assert kinds(sampled(busy_siblings)) == set()  # its sibling as busy as it: not broad


def test_the_longest_hold_covers_the_waits_it_caused_and_the_idle_bound() -> None:
    """jobs 1's holder is busy (no idle bound) and was there before sampling; its waiter has
    waited 20s at the first sample. jobs 2's holder has been idle 40s."""
    since = START - timedelta(seconds=20)
    people = [
        session(20, "active", START - timedelta(milliseconds=10), "busy"),
        session(21, "active", since, "waiter"),
        session(30, "idle", START - timedelta(seconds=40), "idle"),
    ]
    locks = [lock(20, 4300, 1), lock(21, 4300, 1, since, by=20), lock(30, 4300, 2)]
    snapshots = [(people, locks)] * 3 + [(people[2:], locks[2:])]
    sampler = sampled(snapshots)
    busy, idle = sampler.keys[("app", "jobs 1")], sampler.keys[("app", "jobs 2")]
    assert busy.longest_wait == 20.5  # at the third sample
    assert busy.longest_hold >= busy.longest_wait  # it held the key all that time
    assert idle.longest_hold >= 40 + 0.75  # idle since 40s before the first of four samples
    episodes = Episodes()
    ended: list[tuple[str, float]] = []
    for number, (who, held) in enumerate(snapshots):
        now = START + number * STEP
        ended += episodes.add(entries(now, who, held), now).holds
    assert ended == [("jobs", busy.longest_hold)]  # the exporter's hold, as long


def test_holds_of_the_first_sample_are_no_acquisitions_in_sample_and_exporter() -> None:
    """jobs 1 is held at the first sample and released; jobs 2 is taken during sampling."""
    people = [session(20, "active", START, "first"), session(30, "active", START, "later")]
    snapshots = [
        (people, [lock(20, 4300, 1)]),
        (people, [lock(20, 4300, 1), lock(30, 4300, 2)]),
        (people, [lock(30, 4300, 2)]),
    ]
    sampler = sampled(snapshots)
    first, later = sampler.keys[("app", "jobs 1")], sampler.keys[("app", "jobs 2")]
    assert (first.acquisitions, first.releases) == (0, 1)
    assert (later.acquisitions, later.releases) == (1, 0)
    episodes = Episodes()
    acquired = []
    for number, (who, held) in enumerate(snapshots):
        now = START + number * STEP
        acquired.append(episodes.add(entries(now, who, held), now).acquired)
    assert acquired == [{}, {"jobs": 1}, {}]
    assert sum(sum(a.values()) for a in acquired) == first.acquisitions + later.acquisitions


def test_the_header_and_callouts_come_before_a_folded_table() -> None:
    """500 keys of one namespace held by one idle session fold into one row counting them; the
    header (duration, samples, interval) is the first line, the callouts come before the
    table."""
    holder = session(40, "idle", START - timedelta(minutes=2), "exporter")
    many = [lock(40, 4200, key) for key in range(10000, 10500)]
    people, locks = stuck_owner(1)[0]
    sampler = sampled([([*people, holder], [*locks, *many])] * 5)
    text = plain(sample_output(sampler, 0.25).blocks()).splitlines()
    assert text[0].startswith("sampled 1s") and "5 sample(s), every 250ms" in text[0]
    assert sum("500 x invoice_pdf_export 10000..10499" in line for line in text) == 1
    assert not any("invoice_pdf_export 10250" in line for line in text)
    callout = next(i for i, line in enumerate(text) if line.startswith("idle-holder:"))
    table = next(i for i, line in enumerate(text) if line.startswith("Per key"))
    assert callout < table
    assert len(text) < 20
    spreadsheet = io.StringIO()
    render(sample_output(sampler, 0.25), "csv", spreadsheet)
    assert len(spreadsheet.getvalue().splitlines()) == 1 + 501  # CSV: the header, every row
    asked = plain(sample_output(sampler, 0.25, duration=1.25).blocks()).splitlines()
    assert "of 1.25s asked for" in asked[0] and "5 of 5 expected sample(s)" in asked[0]


# -- against a real server -----------------------------------------------------------------

REAL_REGISTRY = (
    '[namespaces.tenant_summary]\nid = 4102\nexpect = "xact"\n\n'
    "[namespaces.jobs]\nid = 4300\n\n[namespaces.invoice_pdf_export]\nid = 4200\n"
)


def test_sample_against_real_sessions(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """A stuck owner on a lone key; a broad key (jobs 1, held by a busy session, the other
    jobs keys briefly taken); a hold taken during sampling; then 500 keys of one session.

    The JSON run reads a small lock table: its reads are cheap, so the duty cycle lets it read
    at nearly every change and the siblings' brief holds are seen and measured closely (with
    the 500 keys a read took about 0.1 s of analysis here, a read every 0.5 s, slower on CI,
    where a 0.3 s hold went unseen). The text run, after, shows the 500 keys folded."""
    (tmp_path / "lockdiag.toml").write_text(REAL_REGISTRY)
    owner = sessions.open("stuck", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 2)")
    idle_since = time.monotonic()
    busy = sessions.open("busy")
    busy.run("SELECT pg_advisory_lock(4300, 1)")
    busy.start("SELECT pg_sleep(30)")
    for key, name in ((4102, "report"), (4300, "job")):
        for number in range(3):
            waiter = sessions.open(f"{name}-{number}")
            waiter.start(f"SELECT pg_advisory_lock({key}, {(2, 1)[key == 4300]})")
            sessions.waiting(waiter)
    time.sleep(1.1)  # every waiter has waited a second or more
    late, siblings = sessions.open("late"), sessions.open("sibling")

    def during() -> None:
        time.sleep(0.6)
        late.run("SELECT pg_advisory_lock(7000, 1)")  # taken while sampling, kept
        for key in (2, 3, 4):  # the other jobs keys, each held briefly (10% of the run)
            siblings.run(f"SELECT pg_advisory_lock(4300, {key})")
            time.sleep(0.4)
            siblings.run(f"SELECT pg_advisory_unlock(4300, {key})")

    thread = threading.Thread(target=during, daemon=True)
    thread.start()
    before = time.monotonic() - idle_since
    try:
        result = CliRunner().invoke(
            cli,
            ["sample", "--duration", "4s", "--interval", "100ms", "--dsn", cluster.dsn(),
             "--format", "json"],
        )  # fmt: skip
        many = sessions.open("exporter")
        many.run("SELECT pg_advisory_lock(4200, g) FROM generate_series(10000, 10499) g")
        text = CliRunner().invoke(
            cli, ["sample", "--duration", "1500ms", "--interval", "250ms", "--dsn", cluster.dsn()]
        )
    finally:
        thread.join(5)
    assert result.exit_code == 0, result.stderr
    print(
        "DEBUG",
        json.loads(result.stdout)["cost"],
        [(k["key"], k["samples_held"]) for k in json.loads(result.stdout)["keys"]],
    )
    assert text.exit_code == 0, text.stderr
    document = json.loads(result.stdout)
    keys = {k["key"]: k for k in document["keys"]}
    found = {(p["kind"], p["key"]) for p in document["patterns"]}
    lines = text.stdout.splitlines()
    callout = next(i for i, line in enumerate(lines) if line.startswith("idle-holder:"))
    table = next(i for i, line in enumerate(lines) if line.startswith("Per key"))
    stuck = keys["tenant_summary 2"]
    spanned = (
        datetime.fromisoformat(document["ended"]) - datetime.fromisoformat(document["started"])
    ).total_seconds()
    assert document.get("sampled_seconds", spanned) == spanned
    checks = {  # every rule checked, every broken one named
        "stuck owner called": ("idle-holder", "tenant_summary 2") in found,
        "stuck owner not broad": ("broad-key", "tenant_summary 2") not in found,
        "broad key called": ("broad-key", "jobs 1") in found,
        "busy holder not stuck": ("idle-holder", "jobs 1") not in found,
        "waits before sampling": keys["jobs 1"]["longest_wait_seconds"] > spanned + 1,
        "hold >= waits it caused": all(
            k["longest_hold_seconds"] >= k["longest_wait_seconds"] for k in keys.values()
        ),
        "hold >= idle time": stuck["longest_hold_seconds"] >= before + spanned - 0.1,
        "first-sample holds: 0 acquisitions": [
            keys[name]["acquisitions"] for name in ("tenant_summary 2", "jobs 1")
        ]
        == [0, 0],
        "hold taken while sampling: 1": keys["unregistered pair (7000, 1)"]["acquisitions"] == 1,
        "header first": lines[0].startswith("sampled ") and "sample(s), every 250ms" in lines[0],
        "keys folded": any("500 x invoice_pdf_export 10000..10499" in line for line in lines),
        "callouts before the table": callout < table,
        "a short report": len(lines) < 30,
    }
    seen = {name: keys[name]["samples_held"] for name in keys if name.startswith("jobs")}
    assert [name for name, ok in checks.items() if not ok] == [], (
        f"{text.stdout}\nJSON run: patterns {sorted(found)}, jobs keys held {seen}, "
        f"{document['samples']} samples, cost {document['cost']}"
    )


class SlowToConnect:
    """A diagnostic session whose first probe connects, slowly; the backends change at every
    probe after it, and a read of the lock table is instant."""

    def __init__(self) -> None:
        self.probes = 0

    def __enter__(self) -> SlowToConnect:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def activity(self, within: float | None = None) -> frozenset[tuple[object, ...]]:
        self.probes += 1
        if self.probes == 1:
            time.sleep(0.4)
        return frozenset({(self.probes,)})

    def snapshot(
        self, scope: object, within: float | None = None, meanwhile: object = None
    ) -> Snapshot:
        server = ServerInfo(
            150000, datetime.now(timezone.utc), "postgres", 1, False, True, {}, "app"
        )
        return Snapshot(server, "test", "advisory", {}, [])

    def close(self) -> None:
        pass


def test_connecting_is_no_read_in_the_duty_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """sample reads when the backends changed, within a duty cycle of its reads. Connecting
    (the first probe) is not a read: counted as one, a 0.4 s connection barred reads for 2 s,
    and CI's sample missed the brief holds of that time."""
    monkeypatch.setattr(reader, "open_session", lambda target, **_: SlowToConnect())
    server = Target("test", None, Timeout(5.0), REGISTRY, Poolers())
    pacer = paced.sample(server, 1.0, 0.05, lambda *_: None, Sampler())
    assert pacer.reads >= 8  # a read at nearly every probe after the connection


def test_watch_counts_no_connection_in_its_duty_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """watch's feed, likewise: after a slow connection, a change is read at the next refresh."""
    monkeypatch.setattr(reader, "open_session", lambda target, **_: SlowToConnect())
    feed = paced.watching(Target("test", None, Timeout(5.0), REGISTRY, Poolers()), Analysis(), 0.05)
    reads = 0
    for _ in range(10):
        reads += feed.tick() is not None
        time.sleep(0.05)
    assert reads >= 8
