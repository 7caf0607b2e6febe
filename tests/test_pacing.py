"""What watching costs the watched server: the exporter's sampler reads pg_locks within a duty
cycle, and only when a cheap probe of the backends changed; `sample` says the interval it
achieved when it falls behind the one asked for."""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime, timedelta, timezone

from lockdiag.core.findings import CheckPolicy
from lockdiag.core.observe import Sampler
from lockdiag.core.pacing import Pacer
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import Target
from lockdiag.exporter import Exporter
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import parse_registry
from lockdiag.render import plain
from lockdiag.views.sample import sample_output

from conftest import Sessions

REGISTRY = "[namespaces.tenant_summary]\nid = 4102\n"


def test_a_read_buys_its_own_pause() -> None:
    pacer = Pacer(duty=0.01)
    first = frozenset({(1, "idle")})
    assert pacer.due(0.0, first)
    pacer.read(0.0, 0.3, first)  # 0.3 s of the server's lock manager: 30 s of rest
    changed = frozenset({(1, "active")})
    assert not pacer.due(29.9, changed)
    assert pacer.due(30.0, changed)
    pacer.read(30.0, 0.3, changed)
    assert not pacer.due(89.9, changed)  # nothing changed, not stale yet (60 s)
    assert pacer.due(90.0, changed)  # stale: read again
    assert pacer.interval == 30.0


def test_the_duty_cycle_holds_whatever_the_reads_cost() -> None:
    """Activity that changes at every probe, reads of 1 ms to 3 s: the share of time spent
    reading never passes the duty cycle by more than the last read."""
    costs = itertools.cycle((0.001, 0.05, 0.3, 3.0))
    for duty in (0.01, 0.05):
        pacer, now, longest = Pacer(duty=duty), 0.0, 0.0
        for tick in range(20000):
            if pacer.due(now, frozenset({(tick,)})):
                cost = next(costs)
                longest = max(longest, cost)
                pacer.read(now, cost, frozenset({(tick,)}))
            now += 0.25
        assert pacer.duty_cycle(now) <= duty + longest / now, pacer.duty_cycle(now)
        assert pacer.reads > 10


def test_sample_says_the_interval_it_achieved() -> None:
    sampler = Sampler()
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    for second in range(5):  # one sample a second, where every 250 ms was asked
        sampler.add([], start + timedelta(seconds=second), 0.9)
    output = sample_output(sampler, 0.25, duration=4.0)
    header = plain(output.blocks()).splitlines()[0]
    assert "achieved every 1s only" in header, header
    assert output.data()["achieved_interval_seconds"] == 1.0
    keeping = Sampler()
    for tick in range(5):
        keeping.add([], start + timedelta(milliseconds=250 * tick), 0.01)
    kept = sample_output(keeping, 0.25, duration=1.0)
    assert "achieved" not in plain(kept.blocks()).splitlines()[0]
    assert json.dumps(kept.data())  # still a JSON document


def test_the_exporter_reads_the_lock_table_only_when_the_backends_change(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A real server: with nothing changing, the sampler's probes (every 50 ms) lead to no
    more reads of pg_locks; a new waiter does, within the duty cycle; the sampler's series
    say what it achieved and what it cost."""
    registry, _ = parse_registry(REGISTRY)
    assert registry is not None
    holder = sessions.open("holder")
    holder.run("SELECT pg_advisory_lock(4102, 900)")
    exporter = Exporter(
        [Target.of(cluster.dsn(), Timeout(5.0), registry, name="one")],
        CheckPolicy(),
        0.05,
        duty=0.05,
    )
    exporter.start_samplers()
    try:
        deadline = time.monotonic() + 10
        while "one" not in exporter.pacers or exporter.pacers["one"].reads < 1:
            assert time.monotonic() < deadline, "the sampler's first read"
            time.sleep(0.02)
        pacer = exporter.pacers["one"]
        time.sleep(1.5)  # 30 probes, the backends unchanged
        quiet = pacer.reads
        assert quiet <= 2, quiet
        waiter = sessions.open("waiter")
        waiter.start("SELECT pg_advisory_lock(4102, 900)")
        sessions.waiting(waiter)
        deadline = time.monotonic() + 5
        while pacer.reads == quiet:
            assert time.monotonic() < deadline, "a read after the new waiter"
            time.sleep(0.02)
        assert pacer.duty_cycle(time.monotonic()) <= 0.05 + 0.05, pacer.duty_cycle(time.monotonic())
        body = exporter.exposition(["one"]).decode()
        assert 'lockdiag_sampler_duty_cycle{target="one"}' in body, body
        assert 'lockdiag_sampler_reads_total{target="one"}' in body
        assert 'lockdiag_sampler_interval_seconds{target="one"}' in body
    finally:
        exporter.close()
