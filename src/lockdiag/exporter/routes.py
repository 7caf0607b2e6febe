"""Which path serves what: /metrics, /probe?target=NAME, / and /-/healthy.

/metrics and /probe answer as prometheus_client's own handlers do (``make_wsgi_app``): the
format the Accept header asks for (OpenMetrics, or the classic text format), gzip when the
Accept-Encoding has it, only the samples ``name[]`` names. /probe serves configured targets
only: any other name is 404, so no connection is ever made to an address taken from a request.
A scraper's ``X-Prometheus-Scrape-Timeout-Seconds`` shortens the scrape's deadline to that,
less a margin for the answer to reach it. The page and the routing are lockdiag's; the server
under them is :mod:`.server`.
"""

from __future__ import annotations

import gzip
import math
from email.message import Message
from typing import Protocol
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from lockdiag.exporter.server import QUEUE, WORKERS, OneRequestHandler, PooledHTTPServer

DEFAULT_PORT = 9714
SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
ANSWER_MARGIN = 0.5  # seconds of the scraper's timeout kept for encoding and sending the answer


class Served(Protocol):
    """What the routes serve: the configured targets, their series, the page."""

    @property
    def names(self) -> list[str]: ...

    def collector(self, names: list[str], within: float | None = None) -> Collector: ...

    def page(self) -> str: ...


def exposition(
    collector: Collector, headers: Message, query: dict[str, list[str]]
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of an answer of ``collector``'s series to a request with these
    headers and query: the steps of prometheus_client's ``_bake_output``, through its public
    helpers (that one is private, and answers in a WSGI status line)."""
    # the collector is described by nothing: only so does restricted_registry() collect it
    registry = CollectorRegistry(support_collectors_without_names=True)
    registry.register(collector)
    encode, kind = choose_encoder(headers.get("Accept", ""))
    body = encode(registry.restricted_registry(query["name[]"]) if "name[]" in query else registry)
    answer = {"Content-Type": kind}
    if gzip_accepted(headers.get("Accept-Encoding", "")):
        body = gzip.compress(body)
        answer["Content-Encoding"] = "gzip"
    return body, answer


def scrape_budget(headers: Message) -> float | None:
    """Seconds the scraper lets a scrape take (its timeout, less :data:`ANSWER_MARGIN`, or
    half of it when it is that short), or None: no header, or not a positive number."""
    try:
        seconds = float(headers.get(SCRAPE_TIMEOUT_HEADER, ""))
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return max(seconds - ANSWER_MARGIN, seconds / 2)


def serve(
    served: Served, host: str, port: int, workers: int = WORKERS, queued: int = QUEUE
) -> PooledHTTPServer:
    """A server of ``served`` listening on ``host``:``port``, its workers started; the caller
    runs its serve_forever() (the accept loop) and finally its server_close()."""

    class Handler(OneRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path == "/metrics":
                self.series(served.names, query)
            elif url.path == "/probe":
                name = (query.get("target") or [""])[0]
                if name not in served.names:  # never an address from the request
                    self.reply(404, b"unknown target: configure it with --dsn or --targets\n")
                    return
                self.series([name], query)
            elif url.path == "/-/healthy":
                self.reply(200, b"OK\n")
            elif url.path == "/":
                self.reply(
                    200, served.page().encode(), {"Content-Type": "text/html; charset=utf-8"}
                )
            else:
                self.reply(404, b"not found\n")

        def series(self, names: list[str], query: dict[str, list[str]]) -> None:
            collector = served.collector(names, scrape_budget(self.headers))
            self.reply(200, *exposition(collector, self.headers, query))

        def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {"Content-Type": "text/plain"}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return PooledHTTPServer((host, port), Handler, workers, queued)
