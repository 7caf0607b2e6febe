"""`lockdiag exporter`: advisory-lock contention for Prometheus, for one server or a fleet.

A long-running service above the layers: it holds sessions (pg), analyses (core) and turns
them into series and a page (views); the CLI only parses its options.

Each configured target has one read-only DiagnosticSession for scrapes and one for its
sampler (reopened after a failure). A scrape takes at most one snapshot per target:
concurrent scrapes of a target wait for the one under way and share it. The sampler probes
the backends every interval (pg_stat_activity only: no lock-manager lock) and reads the lock
table when they changed, within a duty cycle (:class:`lockdiag.core.observe.Pacer`: the reads
keep the server busy at most ``--duty-cycle`` of the time, whatever the lock count); what it
sees becomes episodes: histograms of hold and wait lengths, counters of acquisitions and
contended samples, per namespace (bounded labels: a registry namespace, a known software, or
"unregistered", never a resource). Its achieved interval and duty cycle are series too.

Endpoints: /metrics (every target, each series labelled ``target``), /probe?target=NAME (one
configured target; any other name is 404: no connection is ever made to an address taken from
a request), / (a small HTML page), /-/healthy.

A stalled target never delays the others: each scrape of a target has a deadline (--timeout
plus the session's margin); a target not done by then is reported down ("timed out after
...") and the answer goes without it. At most one snapshot of a target is under way at a
time, so a stalled one piles up neither threads nor sessions. A snapshot that fails because
the kept connection was lost (a restarted server) is taken again at once on a fresh one.

The HTTP side is :mod:`lockdiag.http_server`: bursts and slow clients cannot starve it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.incident import Incident
from lockdiag.core.model import Snapshot
from lockdiag.core.observe import Episodes, Pacer, Tick, collect_now_and_then
from lockdiag.errors import LockdiagError, ServerError
from lockdiag.http_server import QUEUE, WORKERS, OneRequestHandler, PooledHTTPServer
from lockdiag.pg.deadline import client_deadline
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Registry
from lockdiag.views.check import check_metrics
from lockdiag.views.exporter import page
from lockdiag.views.metrics import Metric, families, inert, labelled, merged

DEFAULT_PORT = 9714
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900)


@dataclass(eq=False)
class Scrape:
    """One snapshot of a target under way (or done), shared by the scrapes that wait for it."""

    started: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    report: Incident | None = None
    error: str | None = None
    seconds: float = 0.0
    finished: float = 0.0


@dataclass
class Target:
    """One configured server: its name (never a password), its sessions, what it said last."""

    name: str
    dsn: str | None
    scrape: threading.Lock = field(default_factory=threading.Lock)  # guards what follows
    report: Incident | None = None  # of the last scrape
    taken_at: float = 0.0  # time.monotonic() when that scrape's snapshot was taken
    seconds: float = 0.0  # how long it took
    error: str | None = None  # of the last scrape, or None
    down_since: float | None = None  # time.time() of the first failed scrape after a good one
    running: Scrape | None = None  # the snapshot under way: at most one at a time
    last: Scrape | None = None  # the last one done


class Exporter:
    def __init__(
        self,
        targets: list[Target],
        registry: Registry,
        policy: CheckPolicy,
        timeout: float,
        interval: float,
        duty: float = 0.01,
    ) -> None:
        self.targets = {target.name: target for target in targets}
        self.registry, self.policy, self.timeout, self.interval = (
            registry, policy, timeout, interval,
        )  # fmt: skip
        self.duty = duty
        self.pacers: dict[str, Pacer] = {}
        # of each target's scrape: the session's own deadline for one statement
        self.deadline = client_deadline(timeout)
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

    def scrape(self, target: Target, asked: float) -> Scrape:
        """The snapshot of ``target`` that a scrape asked at ``asked`` waits for: the one
        under way if there is one (concurrent scrapes share it, and a stalled one is never
        joined by a second), else one done since ``asked``, else a new one in its own thread."""
        with target.scrape:
            if target.running is not None:
                return target.running
            if target.last is not None and target.last.finished >= asked:
                return target.last
            run = target.running = Scrape(time.monotonic())
        thread = threading.Thread(
            target=self._take, args=(target, run), daemon=True, name=f"scrape {target.name}"
        )
        try:
            thread.start()
        except RuntimeError as error:  # no thread to be had: down, and never left "running"
            run.error = f"cannot start a scrape: {error}"
            self._finish(target, run)
        return run

    def _take(self, target: Target, run: Scrape) -> None:
        session = self.sessions[target.name]
        try:
            snapshot = self._snapshot(session, run.started + self.deadline)
            diagnosis = Diagnosis(snapshot, self.registry, self.policy.analysis_policy())
            run.report = diagnosis.incident(self.policy)
        except LockdiagError as error:
            run.error = str(error).splitlines()[0]
        except Exception as error:  # a bug: reported, and the target is never left "running"
            run.error = f"internal error: {error!r}"
            raise
        finally:
            self._finish(target, run)
            if self.stop.is_set():
                session.close()

    @staticmethod
    def _finish(target: Target, run: Scrape) -> None:
        run.finished = time.monotonic()
        run.seconds = run.finished - run.started
        with target.scrape:
            target.running, target.last = None, run
            target.report, target.error = run.report, run.error
            target.taken_at, target.seconds = run.finished, run.seconds
            target.down_since = _down_since(target.down_since, run.report is not None)
        run.done.set()

    @staticmethod
    def _snapshot(session: DiagnosticSession, deadline: float) -> Snapshot:
        """One snapshot; once more at once on a fresh connection if the kept one was lost
        (the server restarted, the connection was terminated) and the deadline allows."""
        try:
            return session.snapshot("all")
        except ServerError as error:
            if "connection lost" not in str(error) or time.monotonic() >= deadline:
                raise
        session.close()
        return session.snapshot("all")

    def metrics(self, names: list[str]) -> list[Metric]:
        """Every series of these targets, each labelled ``target``. Waits for each target until
        the deadline at most: one not done by then is down, and the answer goes without it."""
        asked = time.monotonic()
        deadline = asked + self.deadline
        runs = [(self.targets[name], self.scrape(self.targets[name], asked)) for name in names]
        up = Metric("lockdiag_up", "Whether the target's last scrape read its server (1) or not.")
        took = Metric("lockdiag_scrape_duration_seconds", "How long the target's scrape took.")
        groups: list[list[Metric]] = [[up, took]]
        for target, run in runs:
            if run.done.wait(max(0.0, deadline - time.monotonic())):
                report, seconds = run.report, run.seconds
            else:
                report, seconds = None, time.monotonic() - asked
                with target.scrape:
                    if target.running is run:  # still stalled: the page shows it down too
                        target.report, target.seconds = None, seconds
                        target.error = f"timed out after {self.deadline:g}s"
                        target.down_since = _down_since(target.down_since, False)
            up.add(1 if report is not None else 0, target=target.name)
            took.add(seconds, target=target.name)
            if report is not None:
                groups.append(labelled(check_metrics(report), "target", target.name))
        return merged(groups)

    def exposition(self, names: list[str]) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self, names))
        return generate_latest(registry)

    # -- the sampler --------------------------------------------------------------------------

    def sample_forever(self, target: Target) -> None:
        """Every interval a probe of the backends; when they changed, and the duty cycle
        allows it, an advisory snapshot whose episodes go into the histograms."""
        session = DiagnosticSession(target.dsn, self.timeout)
        episodes, rounds = Episodes(), 0
        pacer = self.pacers[target.name] = Pacer(self.duty)
        try:
            while not self.stop.is_set():
                tick = time.monotonic()
                try:
                    activity = session.activity()
                    if pacer.due(tick, activity):
                        rounds += 1
                        collect_now_and_then(rounds)
                        began = time.monotonic()
                        snapshot = session.snapshot("advisory")
                        pacer.read(began, snapshot.query_seconds, activity)
                        advisory = Diagnosis(snapshot, self.registry).advisory
                        self.record(target.name, episodes.add(advisory, snapshot.server.now))
                        self.sampler_seconds.labels(target.name).observe(time.monotonic() - began)
                except LockdiagError:
                    session.close()  # reopened at the next tick; the scrape reports the error
                    episodes = Episodes()
                    pacer.last = None  # a full read first, after the reconnection
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
            "Share of wall time the sampler's reads kept the server's lock manager busy.",
        )
        reads = Metric("lockdiag_sampler_reads_total", "Reads of the lock table.", type="counter")
        for name in names:
            pacer = self.pacers[name]
            if pacer.interval is not None:
                interval.add(pacer.interval, target=name)
            duty.add(pacer.duty_cycle(now), target=name)
            reads.add(pacer.reads, target=name)
        return [interval, duty, reads]

    # -- the server ---------------------------------------------------------------------------

    def serve(
        self, host: str, port: int, workers: int = WORKERS, queued: int = QUEUE
    ) -> PooledHTTPServer:
        """A server listening on ``host``:``port``, its workers started; the caller runs its
        serve_forever() (the accept loop) and finally its server_close()."""
        exporter = self

        class Handler(OneRequestHandler):
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

        return PooledHTTPServer((host, port), Handler, workers, queued)

    def start_samplers(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self.sample_forever, args=(t,), daemon=True, name=t.name)
            for t in self.targets.values()
        ]
        for thread in threads:
            thread.start()
        return threads

    def close(self) -> None:
        """Stop the samplers, close the scrape sessions; one still under way is closed by its
        own thread when it ends (never from here, while it is in use)."""
        self.stop.set()
        for target in self.targets.values():
            with target.scrape:
                busy = target.running is not None
            if not busy:
                self.sessions[target.name].close()


def _down_since(since: float | None, up: bool) -> float | None:
    """When a target went down: kept while it stays down, cleared when it is up again."""
    return None if up else since or time.time()


class _Families:
    def __init__(self, exporter: Exporter, names: list[str]) -> None:
        self.exporter, self.names = exporter, names

    def collect(self) -> Iterator[PrometheusMetric]:
        yield from families(self.exporter.metrics(self.names))
        yield from map(inert, self.exporter.sampled(self.names))
