"""A frozen target costs one deadline, once: against a real server beside targets that accept
TCP and never answer, scraped over real HTTP. The first scrape reports them down after one
deadline; the next ones answer without waiting for them, the healthy target's lock series
present; a frozen target that comes back is up again after its background retry; Prometheus's
scrape timeout header lowers the deadline."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

from lockdiag.demo.cluster import Cluster
from lockdiag.exporter.routes import SCRAPE_TIMEOUT_HEADER, scrape_budget

from conftest import Sessions
from freezer import FreezingProxy
from test_exporter import (
    get,
    make_exporter,
    prometheus,
    scrape_config,
    scrape_threads,
    series,
    serving,
    until,
    up,
)

TIMEOUT = 2.0  # --timeout: a frozen target's attempt fails after this at the soonest
KEY = (4102, 633)  # the healthy target's lock


@pytest.fixture
def silent() -> Iterator[str]:
    """A DSN of a port that accepts TCP (the kernel completes the handshake) and never says a
    word: what a stopped server or a black-holed path looks like to a client."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield f"host=127.0.0.1 port={listener.getsockname()[1]} user=x dbname=x"


def value(body: str, metric: str, name: str) -> float | None:
    prefix = f'{metric}{{target="{name}"}} '
    line = next((line for line in body.splitlines() if line.startswith(prefix)), None)
    return float(line.removeprefix(prefix)) if line is not None else None


def timed_get(url: str, headers: dict[str, str] | None = None) -> tuple[float, str]:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - loopback
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
        body = response.read().decode()
    return time.monotonic() - began, body


def held_series(name: str) -> str:
    labels = f'database="postgres",namespace="unregistered",state="held",target="{name}"'
    return f"lockdiag_advisory_locks{{{labels}}} 1.0"


def test_frozen_targets_cost_one_deadline_then_none(
    cluster: Cluster, sessions: Sessions, silent: str
) -> None:
    owner = sessions.open("owner")
    owner.run(f"SELECT pg_advisory_lock({KEY[0]}, {KEY[1]})")
    with FreezingProxy(cluster.port) as proxy:
        proxy.freeze()  # from the start: it never answered
        exporter = make_exporter(
            {"healthy": cluster.dsn(), "silent": silent, "frozen": proxy.dsn(cluster.dsn())},
            TIMEOUT,
        )  # fmt: skip
        with serving(exporter) as url:
            took, body = timed_get(f"{url}/metrics")
            assert took >= TIMEOUT, "the first scrape waits for the frozen targets, once"
            assert up(body, "healthy") == "1.0" and held_series("healthy") in body
            assert up(body, "silent") == up(body, "frozen") == "0.0"
            assert value(body, "lockdiag_down_seconds", "healthy") == 0.0
            first = value(body, "lockdiag_down_seconds", "frozen")
            assert first is not None and first > 0
            for _ in range(4):
                took, body = timed_get(f"{url}/metrics")
                # waiting for either frozen target would cost TIMEOUT at least
                assert took < TIMEOUT, f"a scrape waited {took:.2f}s for a frozen target"
                assert up(body, "healthy") == "1.0" and held_series("healthy") in body
                assert up(body, "silent") == up(body, "frozen") == "0.0"
                assert scrape_threads("silent") <= 1 and scrape_threads("frozen") <= 1
                time.sleep(0.5)
            later = value(body, "lockdiag_down_seconds", "frozen")
            assert later is not None and later > first + 1.5, "it counts the time down"
            page = get(f"{url}/", timeout=TIMEOUT)[1]  # the page does not wait either
            assert "retried in the background" in page
            assert exporter.targets["silent"].stalled and exporter.targets["frozen"].stalled

            proxy.thaw()  # it answers again: a background attempt reads it

            def frozen_is_up() -> bool:
                took, body = timed_get(f"{url}/metrics")
                assert took < TIMEOUT, f"a scrape waited {took:.2f}s for a frozen target"
                return up(body, "frozen") == "1.0"

            until(frozen_is_up, 30, "the thawed target to be up again")
            body = timed_get(f"{url}/metrics")[1]
            assert held_series("frozen") in body and held_series("healthy") in body
            assert value(body, "lockdiag_down_seconds", "frozen") == 0.0
            assert up(body, "silent") == "0.0" and not exporter.targets["frozen"].stalled


def test_a_target_that_refuses_at_once_is_not_stalled() -> None:
    """A refused connection is an answer: such a target is down but waited for, so a scrape
    sees it the moment it is back (no background retry to wait for)."""
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]  # closed below: connections to it are refused
    refused = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    exporter = make_exporter({"refused": refused}, TIMEOUT)
    with serving(exporter) as url:
        for _ in range(2):
            assert up(get(f"{url}/metrics")[1], "refused") == "0.0"
            assert "refused" in (exporter.targets["refused"].error or "")
            assert not exporter.targets["refused"].stalled


def test_the_scrape_timeout_header_lowers_the_deadline(cluster: Cluster) -> None:
    with FreezingProxy(cluster.port) as proxy:
        exporter = make_exporter(
            {"healthy": cluster.dsn(), "stalled": proxy.dsn(cluster.dsn())},
            TIMEOUT,
        )
        assert exporter.scraper.deadline > TIMEOUT
        with serving(exporter) as url:
            body = get(f"{url}/metrics")[1]
            assert up(body, "stalled") == "1.0"
            proxy.freeze()  # its kept connection stays open; its next statement never returns
            took, body = timed_get(f"{url}/metrics", {SCRAPE_TIMEOUT_HEADER: "1.5"})
            assert up(body, "healthy") == "1.0" and up(body, "stalled") == "0.0"
            assert exporter.targets["stalled"].error == "timed out after 1s"
            assert took < TIMEOUT, "the statement's own deadline was not waited for"
            proxy.close()  # the stalled conversation ends: its scrape too
            until(lambda: scrape_threads("stalled") == 0, 30, "the stalled scrape to end")


def test_a_real_prometheus_gets_every_scrape_in_time(
    cluster: Cluster, silent: str, tmp_path: Path
) -> None:
    """Prometheus gives each scrape 1s (and says so in the header); a frozen target would cost
    TIMEOUT: not one scrape fails, the first included, and the healthy target's series come."""
    exporter = make_exporter({"healthy": cluster.dsn(), "silent": silent}, TIMEOUT)
    with serving(exporter) as url, prometheus(tmp_path, scrape_config(url, "1s")) as api:

        def value(query: str) -> list[str]:
            return [result["value"][1] for result in series(api, query)]

        until(lambda: value('lockdiag_up{target="silent"}') == ["0"], 60, "the frozen target")
        until(lambda: value('lockdiag_up{target="healthy"}') == ["1"], 30, "the healthy target")
        scrapes = 'count_over_time(up{job="lockdiag"}[1m])'
        until(lambda: int((value(scrapes) or ["0"])[0]) >= 4, 30, "four scrapes")
        assert value('min_over_time(up{job="lockdiag"}[1m])') == ["1"], "a scrape failed"
        assert value('lockdiag_waiting_sessions{target="healthy"}') == ["0"]
        assert float(value('lockdiag_down_seconds{target="silent"}')[0]) > 0


@pytest.mark.parametrize(
    ("header", "budget"),
    [("10", 9.5), ("1.5", 1.0), ("0.5", 0.25), ("", None), ("soon", None), ("0", None),
     ("-3", None), ("nan", None), ("inf", None)],
)  # fmt: skip
def test_the_scrape_budget_is_the_header_less_a_margin(header: str, budget: float | None) -> None:
    headers = Message()
    if header:
        headers[SCRAPE_TIMEOUT_HEADER] = header
    assert scrape_budget(headers) == budget


def test_concurrent_scrapes_of_a_stalled_target_share_one_attempt(
    cluster: Cluster, silent: str
) -> None:
    exporter = make_exporter({"healthy": cluster.dsn(), "silent": silent}, TIMEOUT)
    with serving(exporter) as url:
        get(f"{url}/metrics", timeout=30)
        answers: list[str | None] = []
        scrapes = [
            threading.Thread(target=lambda: answers.append(up(get(f"{url}/metrics")[1], "silent")))
            for _ in range(8)
        ]
        for scrape in scrapes:
            scrape.start()
        for scrape in scrapes:
            scrape.join(30)
        assert answers == ["0.0"] * 8
        assert scrape_threads("silent") <= 1


def test_the_benchmark_runs_and_holds() -> None:
    """bench/exporter_frozen.py exits 1 when a scrape after the first waits for a frozen
    target; run small here so that it cannot rot."""
    script = Path(__file__).resolve().parent.parent / "bench" / "exporter_frozen.py"
    result = subprocess.run(
        [sys.executable, str(script), "--frozen", "2", "--scrapes", "3", "--timeout", "1s"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "first scrape:" in result.stdout and "next 3 scrapes: median" in result.stdout
