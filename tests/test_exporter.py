"""`lockdiag exporter` against real servers, scraped by a real Prometheus: series arrive, a dead
target leaves the others intact, no password is shown, the series come in the format and the
encoding the scraper asks for (OpenMetrics, the classic text format, gzip) and only those name[]
names, the shipped rules pass promtool and one of them fires for a stuck owner, and the
dashboard asks only for series that exist."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PrometheusMetric
from prometheus_client.openmetrics import parser as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from lockdiag.core.findings import CheckPolicy, Threshold
from lockdiag.demo.cluster import Cluster, free_port
from lockdiag.evidence import Target
from lockdiag.exporter import Exporter
from lockdiag.pg.capture import Meanwhile
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Registry, parse_registry
from lockdiag.worker import PrometheusEvents

from helpers.exporter import (
    get,
    healthy,
    prometheus,
    scrape_config,
    series,
    serving,
    up,
)
from helpers.polling import until
from helpers.servers import Sessions

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = ROOT / "contrib"
REGISTRY = '[namespaces.tenant_summary]\nid = 4102\nexpect = "xact"\n'
SECRET = "s3cret-in-a-dsn"


@dataclass
class Running:
    url: str
    live: str  # the live target's name
    dead: str
    owner: int  # pid of the stuck owner


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and the body as sent (compressed if it was), of a GET with these
    headers."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def openmetrics_families(body: bytes) -> list[PrometheusMetric]:
    text = body.decode()
    return list(openmetrics.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def text_families(body: bytes) -> list[PrometheusMetric]:
    return list(text_string_to_metric_families(body.decode()))


@pytest.fixture
def exporter(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    owner = sessions.open("stuck-<owner>", autocommit=False)  # markup: escaped on the page
    owner.run("SELECT pg_advisory_xact_lock(4102, 600)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 600)")
    sessions.waiting(waiter)
    stop = threading.Event()

    # Short holds, so the sampler sees episodes begin and end; and queue's waits behind them.
    # Queue takes the key when churn lets it go, churn takes it back 0.2s later, and queue,
    # back 0.3s after its take, waits the 0.4s left of churn's hold: a wait in every 0.7s, and
    # a 0.3s gap without one, each longer than the sampler's interval (a 0.1s wait went unseen
    # for 30s on a loaded CI machine).
    def churn() -> None:
        with psycopg.connect(cluster.dsn(application_name="churn"), autocommit=True) as c:
            while not stop.is_set():
                c.execute("SELECT pg_advisory_lock(4102, 601)")
                time.sleep(0.5)
                c.execute("SELECT pg_advisory_unlock(4102, 601)")
                time.sleep(0.2)

    def queue() -> None:
        with psycopg.connect(cluster.dsn(application_name="queue"), autocommit=True) as c:
            while not stop.is_set():
                c.execute("SELECT pg_advisory_lock(4102, 601)")
                c.execute("SELECT pg_advisory_unlock(4102, 601)")
                time.sleep(0.3)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    queued = threading.Thread(target=queue, daemon=True)
    queued.start()
    port = free_port()
    dead = f"host=127.0.0.1 port={free_port()} user=x password={SECRET}"
    process = subprocess.Popen(
        [sys.executable, "-m", "lockdiag", "exporter", "--dsn", cluster.dsn(), "--dsn", dead,
         "--listen", f"127.0.0.1:{port}", "--interval", "200ms", "--duty-cycle", "0.5",
         "--idle-age", "1s,1h",
         "--timeout", "2s", "--registry", str(tmp_path / "lockdiag.toml")],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: healthy(url), 20, "the exporter to listen")
        yield Running(url, f"127.0.0.1:{cluster.port}/postgres", "127.0.0.1:" + dead.split()[1][5:],
                      owner.pid)  # fmt: skip
    finally:
        stop.set()
        process.terminate()
        process.wait(10)
        worker.join(5)
        queued.join(5)


def test_metrics_probe_and_page(exporter: Running) -> None:
    status, body = get(f"{exporter.url}/metrics")
    assert status == 200
    assert f'lockdiag_up{{target="{exporter.live}"}} 1.0' in body
    assert f'lockdiag_up{{target="{exporter.dead}"}} 0.0' in body  # dead: the others intact
    assert re.search(
        r'lockdiag_advisory_locks\{database="postgres",namespace="tenant_summary",'
        r'state="held",target="' + re.escape(exporter.live) + r'"\} [1-9]',
        body,
    ), body
    until(lambda: "lockdiag_hold_seconds_bucket" in get(f"{exporter.url}/metrics")[1], 20,
          "a hold episode to end")  # fmt: skip
    body = get(f"{exporter.url}/metrics")[1]
    assert 'namespace="tenant_summary"' in body.split("lockdiag_hold_seconds_bucket", 1)[1]
    assert "lockdiag_acquisitions_total" in body and "lockdiag_sampler_seconds" in body
    assert SECRET not in body
    probe = get(f"{exporter.url}/probe?target={exporter.live}")[1]
    assert exporter.live in probe and exporter.dead not in probe
    assert get(f"{exporter.url}/probe?target=evil.example:5432")[0] == 404  # never dialled
    until(lambda: "stuck-owner" in get(f"{exporter.url}/")[1], 20, "the stuck owner's finding")
    page = get(f"{exporter.url}/")[1]
    assert "stuck-&lt;owner&gt;" in page and "stuck-<owner>" not in page
    assert SECRET not in page and "down" in page and "cannot connect" in page


def test_concurrent_scrapes_share_one_snapshot(cluster: Cluster) -> None:
    registry, _ = parse_registry(REGISTRY)
    assert registry is not None
    policy = CheckPolicy(idle_age=Threshold(1.0))
    one = Target.of(cluster.dsn(), Timeout(5.0), registry, name="one")
    exporter = Exporter([one], policy, 1.0)
    taken = []
    session = exporter.scraper.readers["one"].session
    original = session.snapshot

    def counting(
        scope: str, within: float | None = None, meanwhile: Meanwhile | None = None
    ) -> object:
        taken.append(scope)
        time.sleep(0.3)  # a slow server: the other scrapes arrive meanwhile
        return original(scope, within, meanwhile)  # type: ignore[arg-type]

    session.snapshot = counting  # type: ignore[assignment,method-assign]
    try:
        scrapes = [threading.Thread(target=exporter.exposition, args=(["one"],)) for _ in range(6)]
        for scrape in scrapes:
            scrape.start()
            time.sleep(0.02)
        for scrape in scrapes:
            scrape.join()
    finally:
        exporter.close()
    assert len(taken) <= 2, taken  # the first, and at most one more for the late arrivals


@pytest.mark.parametrize("interval", [1.0, 0.0], ids=["min-read-interval", "none"])
def test_a_burst_of_scrapes_reads_the_lock_table_once_an_interval(
    cluster: Cluster, interval: float
) -> None:
    """One client scraping as fast as it can for 2s (622 reads in 5s before): within the
    minimum interval each scrape is answered with the target's last read, so the server's
    lock table is read at most once a second, however many scrapes come. Without it (0s),
    every scrape read it: the test's own control."""
    exporter = Exporter(
        [Target.of(cluster.dsn(), Timeout(5.0), Registry(), name="one")], CheckPolicy(), 1.0,
        min_read_interval=interval,
    )  # fmt: skip
    taken: list[float] = []
    session = exporter.scraper.readers["one"].session
    original = session.snapshot

    def counting(
        scope: Any, within: float | None = None, meanwhile: Meanwhile | None = None
    ) -> object:
        taken.append(time.monotonic())
        return original(scope, within, meanwhile)

    session.snapshot = counting  # type: ignore[assignment,method-assign]
    answered = 0
    with serving(exporter) as url:
        ends = time.monotonic() + 2.0
        while time.monotonic() < ends:
            status, body = get(f"{url}/metrics")
            assert status == 200 and up(body, "one") == "1.0", body[:300]
            answered += 1
    assert answered > 20, answered  # a real burst
    if interval:
        assert len(taken) <= 3, (len(taken), answered)  # 2s at most one read a second
        # the interval runs from each scrape's start; the read itself begins a little later in
        # the scrape's thread (seen 1.5 µs short of 1 s between two reads' stamps here)
        assert all(b - a >= interval - 0.05 for a, b in itertools.pairwise(taken)), taken
    else:
        assert len(taken) == answered


def test_shipped_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/run does)"
    rules = CONTRIB / "prometheus"
    for args in (["check", "rules", "lockdiag-rules.yml"],
                 ["test", "rules", "lockdiag-rules.test.yml"]):  # fmt: skip
        result = subprocess.run(
            [promtool, *args], cwd=rules, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_asks_only_for_series_that_exist(exporter: Running) -> None:
    dashboard = (CONTRIB / "grafana" / "lockdiag-dashboard.json").read_text()
    json.loads(dashboard)
    asked = set(re.findall(r"lockdiag_[a-z_]+", dashboard))
    # the worker helpers' counters come from the application's own /metrics, not the exporter's
    helpers = {name for name in asked if name.startswith("lockdiag_worker_")}
    served = {m.name for m in PrometheusEvents(CollectorRegistry()).attempts.collect()}
    assert helpers == {f"{name}_total" for name in served}, helpers
    asked -= helpers

    def missing() -> set[str]:
        body = get(f"{exporter.url}/metrics")[1]
        return asked - set(re.findall(r"^(lockdiag_[a-z_]+)", body, re.MULTILINE))

    deadline = time.monotonic() + 30  # histograms appear once an episode has ended
    while missing() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not missing(), f"the dashboard asks for series the exporter never serves: {missing()}"


def test_a_real_prometheus_scrapes_and_alerts_on_a_stuck_owner(
    exporter: Running, tmp_path: Path
) -> None:
    rules = (CONTRIB / "prometheus" / "lockdiag-rules.yml").read_text()
    (tmp_path / "rules.yml").write_text(re.sub(r"for: \d+m", "for: 0s", rules))
    with prometheus(tmp_path, scrape_config(exporter.url, rules="rules.yml")) as api:

        def firing() -> set[str]:
            try:
                alerts = json.loads(get(f"{api}/alerts")[1])["data"]["alerts"]
            except (OSError, ValueError, KeyError):
                return set()
            return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

        def scraped_cleanly() -> bool:  # it asked for OpenMetrics and gzip, and parsed the answer
            try:
                targets = json.loads(get(f"{api}/targets")[1])["data"]["activeTargets"]
            except (OSError, ValueError, KeyError):
                return False
            return [(t["health"], t["lastError"]) for t in targets] == [("up", "")]

        until(lambda: len(series(api, "lockdiag_up")) == 2, 60, "Prometheus to scrape both targets")
        until(scraped_cleanly, 30, "Prometheus to report its scrape healthy")
        until(lambda: series(api, 'lockdiag_advisory_locks{namespace="tenant_summary"}'), 30,
              "lock counts per namespace")  # fmt: skip
        until(lambda: series(api, "lockdiag_hold_seconds_bucket"), 30, "hold-time histograms")
        until(lambda: {"LockdiagStuckOwner", "LockdiagTargetDown"} <= firing(), 60,
              "the stuck-owner and target-down alerts to fire")  # fmt: skip


OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PROMETHEUS_ACCEPT = (  # what Prometheus 2.42 (Debian's) sends, with Accept-Encoding: gzip
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


# a sample of each labelled series the sampler feeds: until each has its first child, its
# ``_created`` family is not served, and two scrapes may differ by one
EVERY_SERIES = (b"lockdiag_hold_seconds_bucket", b"lockdiag_wait_seconds_bucket",
                b"lockdiag_acquisitions_total{", b"lockdiag_contended_samples_total{")  # fmt: skip


def every_family_served(exporter: Running) -> None:
    """Waits until the sampler has seen an episode of each kind (a hold's end comes before an
    acquisition is counted: the first read's holds are none)."""
    until(lambda: all(s in fetch(f"{exporter.url}/metrics")[2] for s in EVERY_SERIES), 30,
          "an episode of each kind to be counted")  # fmt: skip


def kinds(families: list[PrometheusMetric]) -> dict[str, str]:
    return {family.name: family.type for family in families}


def test_the_series_come_in_the_format_and_encoding_asked_for(exporter: Running) -> None:
    """Every family lockdiag serves, the sampler's histograms and counters included, encodes
    as OpenMetrics and as the classic text format, and either gzipped."""
    every_family_served(exporter)
    for accept in (OPENMETRICS, PROMETHEUS_ACCEPT):
        status, headers, body = fetch(f"{exporter.url}/metrics", {"Accept": accept})
        assert status == 200
        assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        assert "Content-Encoding" not in headers
        assert body.endswith(b"# EOF\n")
        served = kinds(openmetrics_families(body))
        assert served["lockdiag_up"] == "gauge"
        assert served["lockdiag_hold_seconds"] == served["lockdiag_wait_seconds"] == "histogram"
        assert served["lockdiag_acquisitions"] == served["lockdiag_sampler_reads"] == "counter"
        assert served["lockdiag_advisory_locks"] == "gauge"
    status, headers, body = fetch(f"{exporter.url}/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# EOF" not in body
    plain = kinds(text_families(body))
    assert plain["lockdiag_hold_seconds"] == "histogram" and plain["lockdiag_up"] == "gauge"
    assert plain["lockdiag_acquisitions"] == "counter"
    for accept, parse, unzipped in ((OPENMETRICS, openmetrics_families, served),
                                    ("text/plain", text_families, plain)):  # fmt: skip
        status, headers, body = fetch(
            f"{exporter.url}/metrics", {"Accept": accept, "Accept-Encoding": "gzip, deflate"}
        )
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert int(headers["Content-Length"]) == len(body)
        assert kinds(parse(gzip.decompress(body))) == unzipped


def test_name_filters_the_families_on_metrics_and_on_probe(exporter: Running) -> None:
    for path in ("/metrics?", f"/probe?target={urllib.parse.quote(exporter.live)}&"):
        for accept in (OPENMETRICS, "text/plain"):
            status, _, body = fetch(f"{exporter.url}{path}name[]=lockdiag_up", {"Accept": accept})
            assert status == 200
            families = (openmetrics_families if accept == OPENMETRICS else text_families)(body)
            assert [family.name for family in families] == ["lockdiag_up"], body
            targets = {sample.labels["target"] for sample in families[0].samples}
            assert targets == ({exporter.live, exporter.dead} if path == "/metrics?"
                               else {exporter.live})  # fmt: skip
    status, _, body = fetch(
        f"{exporter.url}/metrics?name[]=lockdiag_up&name[]=lockdiag_waiting_sessions",
        {"Accept": OPENMETRICS},
    )
    assert {f.name for f in openmetrics_families(body)} == {
        "lockdiag_up",
        "lockdiag_waiting_sessions",
    }
    unknown = f"{exporter.url}/probe?target=evil.example:5432&name[]=lockdiag_up"
    assert fetch(unknown, {"Accept": OPENMETRICS})[0] == 404  # the routing stays lockdiag's


def test_the_metrics_reference_lists_every_served_series(exporter: Running) -> None:
    """docs/reference/metrics.md names every family /metrics serves, and each sample name a
    family adds (a counter's and a histogram's ``_created``, a histogram's ``_bucket``...)
    is explained: a series a dashboard finds and the reference does not name is a guess."""
    every_family_served(exporter)
    body = get(f"{exporter.url}/metrics")[1]
    families = {f.name: f for f in text_families(body.encode())}
    reference = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    served = reference.split("## `lockdiag exporter`", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in families if f"`{name}" not in served]
    assert not missing, f"served but not in docs/reference/metrics.md: {missing}"
    suffixes = {
        sample.name.removeprefix(family.name)
        for family in families.values()
        for sample in family.samples
    } - {""}
    unexplained = [suffix for suffix in sorted(suffixes) if f"`{suffix}`" not in served]
    assert not unexplained, f"sample suffixes the reference does not explain: {unexplained}"
