"""One incident in every channel: a session lock leaked through a real transaction-pooling
PgBouncer, the pooler named by the registry's ``[poolers]`` alone, is the same cause (kind,
severity, evidence, pool, counts) in `check`, in `watch --once`, in a real exporter's series as
a real Prometheus scrapes them, and on the exporter's page."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lockdiag.demo.cluster import Bouncer, Cluster, free_port, start_pgbouncer

from helpers.cli import run
from helpers.exporter import get, healthy, prometheus, scrape_config, series
from helpers.polling import until
from helpers.servers import Sessions

KEY = 737373
WAITERS = 3


@pytest.fixture
def leaked(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A worker's session lock left on a pooled server connection, WAITERS sessions waiting
    for it; the pid of that connection, and a registry naming the pooler's console."""
    bouncer: Bouncer = start_pgbouncer(cluster, "transaction")
    registry = tmp_path / "lockdiag.toml"
    registry.write_text(f"[poolers]\npgbouncer = [{json.dumps(bouncer.console_dsn())}]\n")
    with psycopg.connect(
        bouncer.dsn(application_name="leaky-worker"), autocommit=True, prepare_threshold=None
    ) as worker:
        row = worker.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (KEY,)).fetchone()
    assert row is not None and row[0] is True
    for number in range(WAITERS):
        waiter = sessions.open(f"waiter-{number}")
        waiter.start(f"SELECT pg_advisory_lock({KEY})")
        sessions.waiting(waiter)
    try:
        yield int(row[1]), registry
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (row[1],))
        bouncer.stop()


def status_and_stdout(*args: str) -> tuple[int, str]:
    result = run(*args)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result.exit_code, result.stdout


@pytest.fixture
def exporter(cluster: Cluster, leaked: tuple[int, Path]) -> Iterator[str]:
    """A real exporter of the cluster, the registry its only word on the pooler."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "lockdiag", "exporter", "--dsn", cluster.dsn(),
         "--registry", str(leaked[1]), "--listen", f"127.0.0.1:{port}", "--timeout", "3s"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: healthy(url), 20, "the exporter to listen")
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_the_leak_is_one_cause_in_check_watch_the_series_and_the_page(
    cluster: Cluster, leaked: tuple[int, Path], exporter: str, tmp_path: Path
) -> None:
    pid, registry = leaked
    source = ("--dsn", cluster.dsn(), "--registry", str(registry))
    status, text = status_and_stdout("check", *source, "--format", "json")
    document: dict[str, Any] = json.loads(text)
    assert status == 2, text
    (cause,) = [c for c in document["causes"] if c["pid"] == pid]
    assert (cause["kind"], cause["severity"], cause["blocked"]) == (
        "outlived-client", "critical", WAITERS,
    )  # fmt: skip
    assert cause["owner_done"]["level"] == "proven"
    critical, warning = document["summary"]["critical"], document["summary"]["warning"]
    outlived = sum(1 for f in document["findings"] if f["kind"] == "outlived-client")
    assert critical >= 1 and outlived >= 1

    # watch --once: the same cause, in the same words
    frame = subprocess.run(
        [sys.executable, "-m", "lockdiag", "watch", "--once", *source],
        capture_output=True, text=True, check=False, timeout=60,
    ).stdout  # fmt: skip
    causes = [line for line in frame.splitlines() if line.startswith(("CRITICAL ", "WARNING "))]
    assert [line.split()[0] for line in causes] == ["CRITICAL"] * critical + ["WARNING"] * warning
    assert re.match(
        rf"CRITICAL outlived-client: .* pid {pid} .* blocks {WAITERS} session", causes[0]
    )
    assert "owner done: proven" in causes[0], frame

    # the series as a real Prometheus scraped them: the same kind, severity and counts
    config = scrape_config(exporter).replace(
        "scrape_interval: 1s, scrape_timeout: 1s", "scrape_interval: 2s, scrape_timeout: 2s"
    )
    with prometheus(tmp_path, config) as api:

        def value(query: str) -> float | None:
            found = series(api, query)
            return float(found[0]["value"][1]) if found else None

        until(lambda: value('lockdiag_causes{severity="critical"}') is not None, 60,
              "Prometheus to scrape the exporter")  # fmt: skip
        assert value('lockdiag_causes{severity="critical"}') == critical
        assert value('lockdiag_causes{severity="warning"}') == warning
        assert value('sum(lockdiag_findings{kind="outlived-client"})') == outlived
        (leak,) = series(api, 'lockdiag_alerting_causes{kind="outlived-client"}')
        assert leak["metric"]["severity"] == "critical"
        assert leak["metric"]["evidence"] == "proven"
        assert leak["metric"]["pool"] == "postgres/postgres"
        assert float(leak["value"][1]) == 1
        assert value("sum(lockdiag_alerting_causes)") == len(document["causes"])

    # the page: the same verdict, the cause with its pool and its evidence
    page = get(f"{exporter}/")[1]
    assert f"CRITICAL: {critical} critical, {warning} warning" in page, page
    assert "outlived-client" in page and f"pid {pid}" in page
    assert "postgres/postgres (transaction)" in page and "no client attached" in page
    assert "proven" in page
