"""Seen held over time (issue 39): the same pattern, the same verdict.

A leader library that pings its lock connection (SELECT 1 every half second) has a state bound
of half a second at most, however long it has held its lock; a silent leader's grows. The
commands that read over time date a lock by how long every look saw it held by the same
backend (pid and backend_start), so --session-age judges both alike.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner
from snapshots import STARTED, advisory, session, snapshot

from lockdiag.cli import cli
from lockdiag.core.analysis import Flag, analyse
from lockdiag.core.findings import CheckPolicy, Kind, Threshold
from lockdiag.core.incident import Incident
from lockdiag.core.observe import Looks
from lockdiag.evidence import Analysis, Target, diagnose, take_snapshot
from lockdiag.exporter import Exporter
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Registry
from lockdiag.render import plain
from lockdiag.views import watch

from conftest import Sessions, Worker, keep_alive

SESSION_AGE = 2.0
POLICY = CheckPolicy(session_age=Threshold(SESSION_AGE, 3600))


@pytest.fixture
def leaders(sessions: Sessions) -> Iterator[tuple[Worker, Worker]]:
    """A pinging leader (pair 4242, 1) and a silent one (4242, 2), both holding their lock."""
    pinging, silent = sessions.open("pinging-leader"), sessions.open("silent-leader")
    pinging.run("SELECT pg_advisory_lock(4242, 1)")
    silent.run("SELECT pg_advisory_lock(4242, 2)")
    with keep_alive(pinging):
        yield pinging, silent


def scrape(exporter: Exporter) -> Incident:
    target = exporter.targets["db"]
    run = exporter.scraper.scrape(target, time.monotonic())
    assert run.done.wait(10), "the scrape did not finish"
    assert run.report is not None, run.error
    return run.report


def first_read(exporter: Exporter, timeout: float = 15.0) -> None:
    """Wait until the exporter's sampler has read the lock table once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pacer = exporter.samplers.pacers.get("db")
        if pacer is not None and pacer.reads:
            return
        time.sleep(0.05)
    raise AssertionError("the sampler never read the lock table")


def session_locks(incident: Incident) -> dict[int | None, tuple[str, str]]:
    return {
        f.pid: (f.severity, f.evidence)
        for f in incident.report.findings
        if f.kind == Kind.SESSION_LOCK
    }


def test_a_pinging_leader_and_a_silent_one_get_the_same_findings(
    cluster: object, leaders: tuple[Worker, Worker]
) -> None:
    pinging, silent = leaders
    dsn = cluster.dsn()  # type: ignore[attr-defined]
    target = Target.of(dsn, Timeout(5.0), Registry(), name="db")
    exporter = Exporter([target], POLICY, 0.25, duty=0.5)
    # the same scrapes with no earlier look: only the state bound, as before
    blind = Exporter([target], POLICY, 0.25)
    blind.scraper.looks = None
    exporter.start_samplers()
    try:
        # the leaders are dated from the sampler's first read: on a loaded machine connecting
        # and reading took long enough that a fixed sleep scraped too early (CI, PostgreSQL 14)
        first_read(exporter)
        time.sleep(SESSION_AGE + 1.0)
        found = session_locks(scrape(exporter))
        state_only = session_locks(scrape(blind))
    finally:
        exporter.close()
        blind.close()
    assert set(found) == {pinging.pid, silent.pid}, found
    assert found[pinging.pid][0] == found[silent.pid][0] == "warning"
    evidence = found[pinging.pid][1]
    assert "seen held at every look since" in evidence, evidence
    assert "ran statements between looks: maybe released and retaken" in evidence, evidence
    assert "seen held" not in found[silent.pid][1]  # its state bound is the longer
    # without looks the pinging leader is never dated: the verdict depended on its pings
    assert set(state_only) == {silent.pid}, state_only


def test_a_pid_reused_by_a_new_backend_restarts_the_clock() -> None:
    looks = Looks()
    busy = session(7, "idle", timedelta(seconds=-0.2))  # ran a statement just now
    lock = advisory(7, 1)
    first = snapshot([busy], [lock])
    looks.look(first)
    later = STARTED + timedelta(minutes=10)
    again = dataclasses.replace(first, server=dataclasses.replace(first.server, now=later))
    moved = dataclasses.replace(busy, state_change=later - timedelta(seconds=0.2))
    again = dataclasses.replace(again, sessions={7: moved})
    [entry] = analyse(again, Registry(), seen=looks.look(again))
    assert entry.seen is not None and entry.seen.since == STARTED and entry.seen.busy
    assert entry.held_for == 600.0 and entry.held_at_least == pytest.approx(0.2)
    # the same pid, another backend: a new session that took the same key
    reborn = dataclasses.replace(moved, backend_start=later - timedelta(seconds=1))
    newer = dataclasses.replace(again, sessions={7: reborn})
    [entry] = analyse(newer, Registry(), seen=looks.look(newer))
    assert entry.seen is not None and entry.seen.seconds == 0.0
    assert entry.held_for == pytest.approx(0.2)


def test_watch_judges_and_shows_the_seen_bound(
    cluster: object, leaders: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    pinging, silent = leaders
    monkeypatch.setattr(watch, "CHECK", POLICY)
    state = watch.State(Registry())
    dsn = cluster.dsn()  # type: ignore[attr-defined]
    analysis = Analysis(POLICY.analysis_policy(), Looks())  # watch's: dated by its looks
    state.take(diagnose(take_snapshot(dsn, 5, "all"), Registry(), analysis))
    time.sleep(SESSION_AGE + 0.5)
    state.take(diagnose(take_snapshot(dsn, 5, "all"), Registry(), analysis))
    entries = {e.lock.pid: e for e in state.entries}
    ping, quiet = entries[pinging.pid], entries[silent.pid]
    assert ping.seen is not None and ping.seen.busy and ping.seen.seconds >= SESSION_AGE
    assert ping.held_at_least is not None and ping.held_at_least < 1.0  # its state bound
    assert Flag.LONG_SESSION_LOCK in ping.flags and Flag.LONG_SESSION_LOCK in quiet.flags
    shown = plain(watch.frame(state))
    # the table's row (finding lines have a "·" between heading and evidence)
    [row] = [line for line in shown.splitlines() if f" {pinging.pid} " in line and "·" not in line]
    assert re.search(r"seen [23]s", row), row  # the SEEN column: the seen bound
    assert state.report is not None
    [finding] = [
        f for f in state.report.findings if f.pid == pinging.pid and f.kind == Kind.SESSION_LOCK
    ]
    assert "seen held at every look since" in finding.evidence


@pytest.mark.usefixtures("leaders")
def test_sample_keeps_what_it_saw_apart_from_the_lower_bound(cluster: object) -> None:
    time.sleep(1.0)  # the silent leader's state bound is older than the sampling
    result = CliRunner().invoke(
        cli,
        ["sample", "--duration", "2s", "--interval", "250ms", "--format", "json",
         "--dsn", cluster.dsn()],  # type: ignore[attr-defined]
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    keys = {k["key"]: k for k in json.loads(result.stdout)["keys"]}
    ping, quiet = keys["unregistered pair (4242, 1)"], keys["unregistered pair (4242, 2)"]
    # seen: within the sampling window, for both alike
    assert 1.0 <= ping["seen_held_seconds"] <= 2.5 and 1.0 <= quiet["seen_held_seconds"] <= 2.5
    # the lower bound: since the silent one went idle, before sampling; the pinging one's is
    # at most its ping interval
    assert quiet["held_at_least_seconds"] > quiet["seen_held_seconds"]
    assert ping["held_at_least_seconds"] < 1.0
    text = CliRunner().invoke(
        cli,
        ["sample", "--duration", "1s", "--interval", "250ms", "--dsn", cluster.dsn()],  # type: ignore[attr-defined]
    )
    assert "SEEN HELD" in text.stdout and "LOWER BOUND" in text.stdout, text.stdout
