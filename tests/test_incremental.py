"""`watch` and `sample` read incrementally: each interval a probe of pg_stat_activity, a read
of pg_locks only when it changed (or the last read is old) and within a duty cycle. A sample
that finds the backends unchanged counts the last read again, its times moved on: the
statistics are those of reading at every sample. Watch still shows a new waiter promptly."""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from pathlib import Path

import pexpect
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.observe import Sampler
from lockdiag.demo.cluster import Cluster

from helpers.samples import START, STEP, entries, lock, session, stuck_owner
from helpers.servers import Sessions
from helpers.terminal import TERMINAL_ENV

REGISTRY = "[namespaces.tenant_summary]\nid = 4102\n"
REFRESH = re.compile(rb"refresh #(\d+)")


def test_a_sample_that_repeats_a_read_counts_what_reading_would() -> None:
    """The same server state sampled 12 times: read at every sample, or read at the first,
    fifth and ninth and repeated in between, give the same statistics (waits and idle holds
    grow with the time that passed, holds already held are no acquisitions)."""
    since = START - timedelta(seconds=0.5)  # the waits pass PATTERN_WAIT while sampling
    people = [session(10, "idle", START - timedelta(seconds=0.2), "owner")]
    people += [session(pid, "active", since, f"waiter-{pid}") for pid in (11, 12, 13)]
    people += [session(20, "idle", START - timedelta(minutes=3), "other")]
    locks = [lock(10, 4102, 2)] + [lock(pid, 4102, 2, since, by=10) for pid in (11, 12, 13)]
    locks += [lock(20, 4102, key) for key in range(5, 9)]
    reading, repeating = Sampler(), Sampler()
    for number in range(12):
        now = START + number * STEP
        reading.add(entries(now, people, locks), now, 0.001)
        if number % 4 == 0:
            repeating.add(entries(now, people, locks), now, 0.001)
        else:
            repeating.again(now)
    repeating.settle()
    assert (repeating.samples, repeating.reads, reading.reads) == (12, 3, 12)
    assert (repeating.started, repeating.ended) == (reading.started, reading.ended)
    assert repeating.keys == reading.keys
    stuck = repeating.keys[("app", "tenant_summary 2")]
    assert stuck.samples_held == stuck.samples_waited == 12
    assert stuck.idle_holds == 8  # idle 0.2s at the first sample, 1s or more from the 5th
    assert stuck.long_waiter_pids == {11, 12, 13}  # waited 0.5s, then 1s and more
    assert stuck.acquisitions == 0


def test_a_read_between_repeats_sees_what_changed() -> None:
    """Repeats, then a read where a waiter got the lock: acquisitions and releases count from
    the reads, and the repeated samples before it count the old state."""
    state = stuck_owner(1)[0]
    reading, repeating = Sampler(), Sampler()
    later = ([session(11, "active", START)], [lock(11, 4102, 2)])
    for number in range(6):
        now = START + number * STEP
        people, locks = state if number < 5 else later
        reading.add(entries(now, people, locks), now, 0.001)
        if number in (0, 5):
            repeating.add(entries(now, people, locks), now, 0.001)
        else:
            repeating.again(now)
    assert repeating.keys == reading.keys
    stats = repeating.keys[("app", "tenant_summary 2")]
    assert (stats.samples_held, stats.samples_waited) == (6, 5)
    assert (stats.acquisitions, stats.releases) == (1, 1)


def test_sample_reads_pg_locks_only_when_the_backends_change(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """A quiet server: samples every 100 ms, reads of pg_locks far fewer, the statistics of
    every sample as they are (held and waited in all of them); the report says both rates."""
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    owner = sessions.open("owner", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 2)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 2)")
    sessions.waiting(waiter)
    arguments = ["sample", "--duration", "2s", "--interval", "100ms", "--dsn", cluster.dsn(),
                 "--registry", str(tmp_path / "lockdiag.toml")]  # fmt: skip
    result = CliRunner().invoke(cli, [*arguments, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    samples, reads = document["samples"], document["cost"]["pg_locks_reads"]
    assert samples >= 8 and 1 <= reads <= 3, (samples, reads)  # stale after 10 intervals
    stuck = {k["key"]: k for k in document["keys"]}["tenant_summary 2"]
    assert stuck["samples_held"] == stuck["samples_waited"] == samples
    assert stuck["longest_wait_seconds"] >= document["sampled_seconds"]
    text = CliRunner().invoke(cli, arguments)
    assert text.exit_code == 0, text.stderr
    assert "found pg_stat_activity unchanged since the last read" in text.stdout


def test_watch_reads_when_a_waiter_comes_and_says_how_old_its_read_is(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """On a real terminal: with nothing changing the frame says how old its read is; a new
    waiter is on screen within two refreshes of its starting to wait."""
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    sessions.open("holder").run("SELECT pg_advisory_lock(4102, 73)")
    command = ["-m", "lockdiag", "watch", "--interval", "300ms", "--dsn", cluster.dsn()]
    child = pexpect.spawn(sys.executable, command, cwd=str(tmp_path), dimensions=(40, 170),
                          timeout=30, env=TERMINAL_ENV)  # fmt: skip
    try:
        child.expect_exact("tenant_summary 73")
        child.expect(rb"refresh #\d+ \(read \d+\S* ago\)")  # a refresh that did not read
        waiter = sessions.open("late-waiter")
        waiter.start("SELECT pg_advisory_lock(4102, 73)")
        sessions.waiting(waiter)
        child.expect(REFRESH)
        waiting_at = int(child.match.group(1))
        child.expect(rb"late-waiter")
        before = child.before[-4000:]
        shown_at = max(int(n) for n in REFRESH.findall(before)) if REFRESH.findall(before) else 0
        assert shown_at <= waiting_at + 2, (waiting_at, shown_at)
        child.send("q")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
