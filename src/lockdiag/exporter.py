"""`lockdiag exporter`: advisory-lock contention for Prometheus, for one server or a fleet.

A long-running service above the layers: it holds sessions (pg), analyses (core) and turns
them into series and a page (views); the CLI only parses its options.

Each configured target has one read-only DiagnosticSession for scrapes and one for its
sampler (reopened after a failure). A scrape takes at most one snapshot per target:
concurrent scrapes of a target wait for the one under way and share it. The sampler takes
one advisory snapshot per interval and turns what it sees into episodes: histograms of hold
and wait lengths, counters of acquisitions and contended samples, per namespace (bounded
labels: a registry namespace, a known software, or "unregistered", never a resource).

Endpoints: /metrics (every target, each series labelled ``target``), /probe?target=NAME (one
configured target; any other name is 404: no connection is ever made to an address taken from
a request), / (a small HTML page), /-/healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric as PrometheusMetric

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, CheckReport
from lockdiag.core.observe import Episodes, Tick, collect_now_and_then
from lockdiag.errors import LockdiagError
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Registry
from lockdiag.views.check import check_metrics
from lockdiag.views.exporter import page
from lockdiag.views.metrics import Metric, families, labelled, merged

DEFAULT_PORT = 9714
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900)


@dataclass
class Target:
    """One configured server: its name (never a password), its sessions, what it said last."""

    name: str
    dsn: str | None
    scrape: threading.Lock = field(default_factory=threading.Lock)
    report: CheckReport | None = None  # of the last scrape
    taken_at: float = 0.0  # time.monotonic() when that scrape's snapshot was taken
    seconds: float = 0.0  # how long it took
    error: str | None = None  # of the last scrape, or None


class Exporter:
    def __init__(
        self,
        targets: list[Target],
        registry: Registry,
        policy: CheckPolicy,
        timeout: float,
        interval: float,
    ) -> None:
        self.targets = {target.name: target for target in targets}
        self.registry, self.policy, self.timeout, self.interval = (
            registry, policy, timeout, interval,
        )  # fmt: skip
        self.sessions = {t.name: DiagnosticSession(t.dsn, timeout, registry) for t in targets}
        self.stop = threading.Event()
        labels = ["target", "namespace"]
        self.holds = Histogram("lockdiag_hold_seconds", "Observed hold episodes, by namespace.",
                               labels, buckets=HOLD_BUCKETS, registry=None)  # fmt: skip
        self.waits = Histogram("lockdiag_wait_seconds", "Observed wait episodes, by namespace.",
                               labels, buckets=WAIT_BUCKETS, registry=None)  # fmt: skip
        self.acquisitions = Counter(
            "lockdiag_acquisitions", "Holds seen to begin, by namespace.", labels, registry=None
        )
        self.contended = Counter(
            "lockdiag_contended_samples", "Samples in which a key of the namespace was waited on.",
            labels, registry=None,
        )  # fmt: skip
        self.sampler_seconds = Histogram(
            "lockdiag_sampler_seconds", "The sampler's own cost: one snapshot and its analysis.",
            ["target"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=None,
        )  # fmt: skip

    # -- scrapes ------------------------------------------------------------------------------

    def scrape(self, target: Target) -> None:
        """A fresh snapshot, unless a scrape that began after ours is already done: the
        scrapes that wait for this lock share its snapshot."""
        asked = time.monotonic()
        with target.scrape:
            if target.taken_at >= asked:
                return
            started = time.monotonic()
            try:
                snapshot = self.sessions[target.name].snapshot("all")
                diagnosis = Diagnosis(snapshot, self.registry, self.policy.analysis_policy())
                target.report, target.error = diagnosis.findings(self.policy), None
            except LockdiagError as error:
                target.report, target.error = None, str(error).splitlines()[0]
            target.taken_at = time.monotonic()
            target.seconds = target.taken_at - started

    def metrics(self, names: list[str]) -> list[Metric]:
        """Every series of these targets, each labelled ``target``."""
        threads = [threading.Thread(target=self.scrape, args=(self.targets[n],)) for n in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        up = Metric("lockdiag_up", "Whether the target's last scrape read its server (1) or not.")
        took = Metric("lockdiag_scrape_duration_seconds", "How long the target's scrape took.")
        groups: list[list[Metric]] = [[up, took]]
        for name in names:
            target = self.targets[name]
            up.add(1 if target.report is not None else 0, target=name)
            took.add(target.seconds, target=name)
            if target.report is not None:
                groups.append(labelled(check_metrics(target.report), "target", name))
        return merged(groups)

    def exposition(self, names: list[str]) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self, names))
        return generate_latest(registry)

    # -- the sampler --------------------------------------------------------------------------

    def sample_forever(self, target: Target) -> None:
        """One advisory snapshot per interval, its episodes into the histograms."""
        session = DiagnosticSession(target.dsn, self.timeout)
        episodes, rounds = Episodes(), 0
        try:
            while not self.stop.is_set():
                tick = time.monotonic()
                rounds += 1
                collect_now_and_then(rounds)
                try:
                    snapshot = session.snapshot("advisory")
                except LockdiagError:
                    session.close()  # reopened at the next tick; the scrape reports the error
                    episodes = Episodes()
                else:
                    advisory = Diagnosis(snapshot, self.registry).advisory
                    seen = episodes.add(advisory, snapshot.server.now)
                    self.record(target.name, seen)
                    self.sampler_seconds.labels(target.name).observe(time.monotonic() - tick)
                self.stop.wait(max(0.0, self.interval - (time.monotonic() - tick)))
        finally:
            session.close()

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
        """The sampler's families, only the samples of these targets."""
        wanted = set(names)
        for metric in (self.holds, self.waits, self.acquisitions, self.contended,
                       self.sampler_seconds):  # fmt: skip
            for family in metric.collect():
                family.samples = [s for s in family.samples if s.labels["target"] in wanted]
                yield family

    # -- the server ---------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> ThreadingHTTPServer:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/metrics":
                    self.reply(
                        200, exporter.exposition(list(exporter.targets)), CONTENT_TYPE_LATEST
                    )
                elif url.path == "/probe":
                    name = (parse_qs(url.query).get("target") or [""])[0]
                    if name not in exporter.targets:  # never an address from the request
                        self.reply(404, b"unknown target: configure it with --dsn or --targets\n")
                        return
                    self.reply(200, exporter.exposition([name]), CONTENT_TYPE_LATEST)
                elif url.path == "/-/healthy":
                    self.reply(200, b"OK\n")
                elif url.path == "/":
                    exporter.metrics(list(exporter.targets))  # the page shows them now
                    body = page(list(exporter.targets.values()), exporter.interval)
                    self.reply(200, body.encode(), "text/html; charset=utf-8")
                else:
                    self.reply(404, b"not found\n")

            def reply(self, status: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass  # scrapes every few seconds would flood the terminal

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        return server

    def start_samplers(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self.sample_forever, args=(t,), daemon=True, name=t.name)
            for t in self.targets.values()
        ]
        for thread in threads:
            thread.start()
        return threads

    def close(self) -> None:
        self.stop.set()
        for session in self.sessions.values():
            session.close()


class _Families:
    def __init__(self, exporter: Exporter, names: list[str]) -> None:
        self.exporter, self.names = exporter, names

    def collect(self) -> Iterator[PrometheusMetric]:
        yield from families(self.exporter.metrics(self.names))
        yield from self.exporter.sampled(self.names)
