"""The exporter's HTTP side holds up and its targets cannot stall each other, against a real
server over real HTTP: a burst of scrapes is answered, half-sent requests hold no thread and
are dropped, a full queue is answered 503 at once, a stalled target is reported down within its
deadline without piling up threads, and the first scrape after a restart reads the server."""

from __future__ import annotations

import socket
import threading
import time

import psycopg

from lockdiag.core.model import Aggregated, Scope
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import ServerError
from lockdiag.exporter.server import REQUEST_TIMEOUT

from helpers.exporter import get, make_exporter, scrape_threads, serving, up
from helpers.freezer import FreezingProxy
from helpers.polling import until

MARGIN = 5.0  # generous: every bound on time below is a deadline plus this


def test_a_hundred_concurrent_scrapes_are_all_answered(cluster: Cluster) -> None:
    results: list[tuple[int, float, str | None]] = []
    lock = threading.Lock()
    go = threading.Event()
    with serving(make_exporter({"one": cluster.dsn()})) as url:
        assert get(f"{url}/metrics")[0] == 200

        def scrape() -> None:
            go.wait()
            began = time.monotonic()
            try:
                status, body = get(f"{url}/metrics", timeout=10)
            except OSError as error:  # a timeout or a reset: counted as not answered
                status, body = 0, str(error)
            with lock:
                results.append((status, time.monotonic() - began, up(body, "one")))

        clients = [threading.Thread(target=scrape) for _ in range(100)]
        for client in clients:
            client.start()
        go.set()
        for client in clients:
            client.join(30)
    assert len(results) == 100
    assert [r for r in results if r[0] != 200] == [], "every scrape is answered"
    assert all(value == "1.0" for _, _, value in results)
    took = sorted(seconds for _, seconds, _ in results)
    assert took[94] < MARGIN, f"p95 {took[94]:.2f}s"  # about 0.3s here; a backlog of 5: > 10s


def test_half_open_requests_hold_no_thread_and_are_dropped(cluster: Cluster) -> None:
    with serving(make_exporter({"one": cluster.dsn()})) as url:
        port = int(url.rsplit(":", 1)[1])
        assert get(f"{url}/metrics")[0] == 200
        threads = threading.active_count()
        half_open = []
        try:
            for _ in range(200):  # more than the workers, than Python's old backlog of 5
                client = socket.create_connection(("127.0.0.1", port), timeout=10)
                client.sendall(b"GET /metr")  # half a request line, and nothing more
                half_open.append(client)
            began = time.monotonic()
            status, body = get(f"{url}/metrics")
            assert status == 200 and up(body, "one") == "1.0"
            assert time.monotonic() - began < MARGIN, "a normal scrape is answered promptly"
            assert threading.active_count() <= threads + 2, "no thread per waiting connection"
            began = time.monotonic()
            for client in half_open:  # each is answered 408 and closed (or just closed)
                client.settimeout(REQUEST_TIMEOUT + MARGIN - (time.monotonic() - began))
                answer = client.recv(1024)
                assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
            assert time.monotonic() - began < REQUEST_TIMEOUT + MARGIN
        finally:
            for client in half_open:
                client.close()


def test_a_full_queue_is_answered_503_at_once(cluster: Cluster, proxy: FreezingProxy) -> None:
    exporter = make_exporter({"stalled": proxy.dsn(cluster.dsn())}, timeout=1.0)
    with serving(exporter, workers=1, queued=1) as url:
        assert up(get(f"{url}/metrics")[1], "stalled") == "1.0"
        proxy.freeze()
        answers: list[int] = []

        def scrape() -> None:
            answers.append(get(f"{url}/metrics", timeout=exporter.scraper.deadline * 2 + MARGIN)[0])

        busy = [threading.Thread(target=scrape) for _ in range(2)]  # the worker, the queue
        for client in busy:
            client.start()
            time.sleep(0.3)
        began = time.monotonic()
        assert get(f"{url}/-/healthy", timeout=MARGIN)[0] == 503
        assert time.monotonic() - began < 1.0 + MARGIN / 2  # at once, not after the others
        for client in busy:
            client.join(exporter.scraper.deadline * 2 + MARGIN)
        assert answers == [200, 200]
        proxy.close()  # the stalled conversation ends: its scrape too
        until(lambda: scrape_threads("stalled") == 0, 30, "the stalled scrape to end")


def test_a_stalled_target_does_not_delay_the_others(cluster: Cluster, proxy: FreezingProxy) -> None:
    exporter = make_exporter({"healthy": cluster.dsn(), "stalled": proxy.dsn(cluster.dsn())}, 1.0)
    with serving(exporter) as url:
        body = get(f"{url}/metrics")[1]
        assert up(body, "healthy") == "1.0" and up(body, "stalled") == "1.0"
        proxy.freeze()  # connections stay open, nothing comes back
        counts = []
        for _ in range(5):
            began = time.monotonic()
            status, body = get(f"{url}/metrics", timeout=exporter.scraper.deadline + MARGIN)
            took = time.monotonic() - began
            assert status == 200 and took < exporter.scraper.deadline + MARGIN, took
            assert up(body, "healthy") == "1.0" and up(body, "stalled") == "0.0"
            assert 'lockdiag_waiting_sessions{target="healthy"}' in body
            assert 'lockdiag_waiting_sessions{target="stalled"}' not in body
            assert scrape_threads("stalled") <= 1, "one conversation with it at a time"
            counts.append(threading.active_count())
        assert max(counts) <= counts[0] + 2, f"threads grow with each scrape: {counts}"
        page = get(f"{url}/", timeout=exporter.scraper.deadline + MARGIN)[1]
        assert "<h2>stalled <span class='badge unknown'>UNKNOWN</span></h2>" in page
        assert "<h2>healthy <span class='badge up'>up</span>" in page
        proxy.close()  # the stalled conversation ends: its scrape too
        until(lambda: scrape_threads("stalled") == 0, 30, "the stalled scrape to end")


def test_a_snapshot_past_its_deadline_is_timed_out_and_never_doubled(cluster: Cluster) -> None:
    """Whatever the session's own limits: a snapshot that never returns."""
    exporter = make_exporter({"one": cluster.dsn(), "hung": cluster.dsn()}, 1.0)
    deadline = exporter.scraper.deadline
    release = threading.Event()
    taken: list[Scope] = []

    def hanging(scope: Scope, within: float | None = None, meanwhile: object = None) -> object:
        taken.append(scope)
        release.wait(60)
        raise ServerError("connection lost: released by the test")

    session = exporter.scraper.readers["hung"].session
    session.snapshot = hanging  # type: ignore[assignment,method-assign]
    try:
        with serving(exporter) as url:
            for _ in range(3):
                began = time.monotonic()
                status, body = get(f"{url}/metrics", timeout=deadline + MARGIN)
                assert time.monotonic() - began < deadline + MARGIN
                assert status == 200 and up(body, "one") == "1.0" and up(body, "hung") == "0.0"
                duration = 'lockdiag_scrape_duration_seconds{target="hung"} '
                assert float(body.split(duration, 1)[1].split()[0]) >= deadline - 0.1
            assert taken == [Aggregated()], "one snapshot under way at a time, never a second"
            assert exporter.targets["hung"].error == f"timed out after {deadline:g}s"
            page = get(f"{url}/", timeout=deadline + MARGIN)[1]
            assert f"timed out after {deadline:g}s" in page
            release.set()  # it fails at last: no retry, the deadline has passed
            until(lambda: scrape_threads("hung") == 0, 10, "the hung scrape to end")
            assert taken == [Aggregated()]
            assert exporter.targets["hung"].error == "connection lost: released by the test"
    finally:
        release.set()


def test_the_first_scrape_after_a_restart_reads_the_server(cluster: Cluster) -> None:
    with serving(make_exporter({"one": cluster.dsn()})) as url:
        assert up(get(f"{url}/metrics")[1], "one") == "1.0"
        cluster.restart()  # the exporter's kept connection is now broken
        assert up(get(f"{url}/metrics")[1], "one") == "1.0"


def test_the_first_scrape_after_its_session_is_terminated_reads_the_server(
    cluster: Cluster,
) -> None:
    with serving(make_exporter({"one": cluster.dsn()})) as url:
        assert up(get(f"{url}/metrics")[1], "one") == "1.0"
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'lockdiag' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert ended == (1,)
        assert up(get(f"{url}/metrics")[1], "one") == "1.0"
