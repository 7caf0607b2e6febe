"""The samplers: one thread per target, watching between scrapes, and the series they feed.

Each sampler reads its target over time on a reader of its own (the one paced loop of
:mod:`lockdiag.evidence.paced`: a session reopened after a failure): it probes the backends every
interval (pg_stat_activity only: no lock-manager lock) and reads the lock table when they
changed, within a duty cycle (:class:`lockdiag.core.pacing.Pacer`: the reads and their analysis
take at most ``--duty-cycle`` of the time, whatever the lock count). What it sees becomes
episodes: histograms of hold and wait lengths, counters of acquisitions and contended samples,
per namespace (bounded labels: a registry namespace, a known software, or "unregistered", never
a resource). Its achieved interval and duty cycle are series too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric as PrometheusMetric

from lockdiag.core.analysis import Seen
from lockdiag.core.model import Aggregated, Snapshot
from lockdiag.core.observe import Episodes, Looks, Tick
from lockdiag.core.pacing import Pacer
from lockdiag.evidence import Analysis, Reader, Reading, Target
from lockdiag.evidence.paced import PacedReader
from lockdiag.views.metrics import Metric, families

HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900)


class SharedLooks:
    """When each lock of a target was first seen held, at every read since: the sampler's
    and the scrapes' (both threads look, one at a time)."""

    def __init__(self) -> None:
        self.looks = Looks()
        self.lock = threading.Lock()

    def look(self, snapshot: Snapshot) -> Seen:
        with self.lock:
            return self.looks.look(snapshot)

    def forget(self) -> None:
        with self.lock:
            self.looks.forget()


class Samplers:
    """The sampler threads of the targets, the episodes they saw and what they cost."""

    def __init__(self, targets: list[Target], interval: float, duty: float) -> None:
        self.targets = {target.label: target for target in targets}
        self.interval, self.duty = interval, duty
        self.pacers: dict[str, Pacer] = {}
        self.looks = {target.label: SharedLooks() for target in targets}
        self.stop = threading.Event()
        labels = ["target", "namespace"]
        self.holds = Histogram(
            "lockdiag_hold_seconds",
            "Observed hold episodes, by namespace.",
            labels,
            buckets=HOLD_BUCKETS,
            registry=None,
        )
        self.waits = Histogram(
            "lockdiag_wait_seconds",
            "Observed wait episodes, by namespace.",
            labels,
            buckets=WAIT_BUCKETS,
            registry=None,
        )
        self.acquisitions = Counter(
            "lockdiag_acquisitions", "Holds seen to begin, by namespace.", labels, registry=None
        )
        self.contended = Counter(
            "lockdiag_contended_samples",
            "Samples in which a key of the namespace was waited on.",
            labels,
            registry=None,
        )
        self.sampler_seconds = Histogram(
            "lockdiag_sampler_seconds",
            "The sampler's own cost: one snapshot and its analysis.",
            ["target"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=None,
        )

    def start(self, names: list[str]) -> list[threading.Thread]:
        """A sampler thread for each of these targets, started."""
        threads = [
            threading.Thread(target=self.sample_forever, args=(name,), daemon=True, name=name)
            for name in names
        ]
        for thread in threads:
            thread.start()
        return threads

    def sample_forever(self, name: str) -> None:
        """Every interval a probe of the backends; when they changed, and the duty cycle
        allows it, an advisory snapshot whose episodes go into the histograms. A failure
        (reported by the scrapes) starts the episodes again: what went on while the sampler
        could not look is unknown."""
        # the histograms need the lock table only: no names from tables, no pooler console
        reader = Reader(self.targets[name], enrich=False, read_poolers=False)
        pacer = self.pacers[name] = Pacer(self.duty)
        looking = Analysis(looks=self.looks[name])
        paced = PacedReader(reader, Aggregated(all_types=False), pacer, looking)
        episodes = [Episodes()]

        def each(reading: Reading | None, _: float) -> None:
            if reading is None:
                return
            if reading.snapshot is None:
                episodes[0] = Episodes()
                return
            advisory = reading.diagnosed().advisory
            self.record(name, episodes[0].add(advisory, reading.snapshot.server.now))
            self.sampler_seconds.labels(name).observe(reading.seconds)

        try:
            paced.run(each, self._until_stopped, self.interval)
        finally:
            paced.close()

    def _until_stopped(self, seconds: float) -> bool:
        return not self.stop.wait(seconds)

    def record(self, name: str, seen: Tick) -> None:
        for namespace, seconds in seen.holds:
            self.holds.labels(name, namespace).observe(seconds)
        for namespace, seconds in seen.waits:
            self.waits.labels(name, namespace).observe(seconds)
        for namespace, count in seen.acquired.items():
            self.acquisitions.labels(name, namespace).inc(count)
        for namespace in seen.contended:
            self.contended.labels(name, namespace).inc()

    def sampled(self, names: list[str]) -> Iterator[PrometheusMetric]:
        """The samplers' families, only the samples of these targets."""
        wanted = set(names)
        metrics = self.holds, self.waits, self.acquisitions, self.contended, self.sampler_seconds
        for metric in metrics:
            for family in metric.collect():
                family.samples = [s for s in family.samples if s.labels["target"] in wanted]
                yield family
        yield from families(self.pacing([name for name in names if name in self.pacers]))

    def pacing(self, names: list[str]) -> list[Metric]:
        """What the sampler costs and achieves, per target."""
        now = time.monotonic()
        interval = Metric(
            "lockdiag_sampler_interval_seconds",
            "Mean time between the sampler's reads of the lock table (the last ten).",
        )
        duty = Metric(
            "lockdiag_sampler_duty_cycle",
            "Share of wall time the sampler's reads of the lock table, and their analysis, took.",
        )
        reads = Metric("lockdiag_sampler_reads_total", "Reads of the lock table.", type="counter")
        for name in names:
            pacer = self.pacers[name]
            if pacer.interval is not None:
                interval.add(pacer.interval, target=name)
            duty.add(pacer.duty_cycle(now), target=name)
            reads.add(pacer.reads, target=name)
        return [interval, duty, reads]

    def close(self) -> None:
        """Stop the samplers: each closes its own session when its wait ends."""
        self.stop.set()
