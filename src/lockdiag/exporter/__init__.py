"""`lockdiag exporter`: advisory-lock contention for Prometheus, for one server or a fleet.

A long-running service above the layers: it holds sessions (pg), analyses (core) and turns
them into series and a page (views); the CLI only parses its options. One room per job:

- :mod:`.scraping`: a scrape takes at most one snapshot per target, the targets
  concurrently, within a deadline; a stalled target costs that deadline once, then is reported
  down at once while it is retried in the background.
- :mod:`.sampling`: a sampler per target watches between scrapes, within a duty cycle, for the
  hold and wait histograms.
- :mod:`.routes`: which path serves what (/metrics, /probe?target=NAME, /, /-/healthy), the
  series through prometheus_client's exposition helpers; :mod:`.server` under them holds up
  against bursts and slow clients.

:class:`Exporter` ties them together for the configured targets.

It may import ``lockdiag.evidence`` (its readers and their paced loop), ``lockdiag.pg`` (the
types of its errors and timeouts), ``core``, ``views`` (series and the page), the registry and
prometheus_client; never ``cli`` or click.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from email.message import Message

from prometheus_client.metrics_core import Metric as PrometheusMetric

from lockdiag.core.findings import CheckPolicy
from lockdiag.core.pacing import Pacer
from lockdiag.evidence import Target
from lockdiag.exporter import routes
from lockdiag.exporter.routes import DEFAULT_PORT
from lockdiag.exporter.sampling import Samplers
from lockdiag.exporter.scraping import MIN_READ_INTERVAL, Scraper
from lockdiag.exporter.server import QUEUE, WORKERS, PooledHTTPServer
from lockdiag.views import exporter as exporter_view
from lockdiag.views.metrics import families, inert

__all__ = ["DEFAULT_PORT", "MIN_READ_INTERVAL", "Exporter"]


class Exporter:
    """The scraper and the samplers of the same targets (each complete, as every command's:
    --timeout, the registry, its [poolers] and those of --pgbouncer and --pooler-addr), and
    what the routes serve of them."""

    def __init__(
        self,
        targets: list[Target],
        policy: CheckPolicy,
        interval: float,
        duty: float = 0.01,
        min_read_interval: float = MIN_READ_INTERVAL,
    ) -> None:
        self.samplers = Samplers(targets, interval, duty)
        # the scrapes' reads are looks too: what the samplers saw held dates their locks
        self.scraper = Scraper(targets, policy, self.samplers.looks, min_read_interval)
        self.targets = self.scraper.targets
        self.interval = interval

    @property
    def names(self) -> list[str]:
        return list(self.targets)

    @property
    def pacers(self) -> dict[str, Pacer]:
        return self.samplers.pacers

    def collector(self, names: list[str], within: float | None = None) -> _Families:
        """These targets' series, each collection a scrape of ``within`` seconds at most
        (else the scraper's deadline)."""
        return _Families(self, names, within)

    def exposition(self, names: list[str]) -> bytes:
        """These targets' series as /metrics answers a request that names no format: the
        classic text format."""
        return routes.exposition(self.collector(names), Message(), {})[0]

    def page(self) -> str:
        self.scraper.metrics(self.names)  # the page shows the targets as they are now
        return exporter_view.page(list(self.targets.values()), self.interval)

    def serve(
        self, host: str, port: int, workers: int = WORKERS, queued: int = QUEUE
    ) -> PooledHTTPServer:
        return routes.serve(self, host, port, workers, queued)

    def start_samplers(self) -> list[threading.Thread]:
        return self.samplers.start(list(self.targets))

    def close(self) -> None:
        self.samplers.close()
        self.scraper.close()


class _Families:
    """The series of some targets, read afresh at each collection."""

    def __init__(self, exporter: Exporter, names: list[str], within: float | None) -> None:
        self.exporter, self.names, self.within = exporter, names, within

    def collect(self) -> Iterator[PrometheusMetric]:
        yield from families(self.exporter.scraper.metrics(self.names, self.within))
        yield from map(inert, self.exporter.samplers.sampled(self.names))
