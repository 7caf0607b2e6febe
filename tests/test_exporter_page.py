"""The exporter's `/` page as an incident page: the bundled incident's causes lead, worst first,
each saying what `check` says in the order it says it; a down target is unknown, never "no
findings"; every server string is escaped; and a real headless browser renders it so.

The screenshot in docs/ and its text are drawn by ``python scripts/exporter_page.py`` (and the
docs build); tests/test_docs.py fails when the page's text is no longer the screenshot's.
"""

from __future__ import annotations

import dataclasses
import html
import re
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lockdiag.views.check import cause_detail, cause_heading
from lockdiag.views.exporter import page

from helpers.browser import browse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from exporter_page import (  # noqa: E402
    DOWN_ERROR,
    FakeTarget,
    bundled_snapshot,
    bundled_targets,
    incident_of,
    text_of,
)

HOSTILE = '<script>alert("x")</script>\'&amp;'


def squeeze(line: str) -> str:
    return " ".join(line.split())


def in_order(text: str, pieces: list[str]) -> None:
    """Every piece in ``text``, each after the one before."""
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        assert found >= 0, f"{piece!r} not after offset {at}: {text[at : at + 400]!r}"
        at = found + len(piece)


# -- unit: page() ------------------------------------------------------------------------------


def test_the_first_cause_leads_before_any_symptom_and_the_other_causes() -> None:
    markup = page(bundled_targets(), 1.0)
    text = text_of(markup)
    first = text.find(
        "CRITICAL session-lock: tenant_summary 73 (+1 more) pid 4163 (billing-worker)"
    )
    assert first >= 0, text[:600]
    symptom = text.find("pid 9933 (summary-worker) has waited")
    assert first < symptom, "a symptom before the first cause"
    for other in ("pid 9932 (summary-worker)", "pid 4164 (etl-nightly)", "pid 11722"):
        assert first < text.find(other), other
    assert text.find("pid 9932 (summary-worker) is idle") > symptom  # its symptom, its cause
    first_card = markup.split("<article", 2)[1]  # the first cause card: the one order
    assert "pid 4163" in first_card and "billing-worker" in first_card
    assert "tenant_summary 73" in first_card and "(+1 more)" in first_card
    # the holder's state, since when (relative to the server's clock), its waiters
    in_order(squeeze(text_of(first_card)), ["holder idle for 17m28s (since 14:03:37 UTC)",
             "waiters 2 (2 directly)", "longest wait 7m28s", "held at least 17m28s"])  # fmt: skip


def test_each_cause_says_what_check_says_in_the_same_order() -> None:
    incident = incident_of(bundled_snapshot())
    text = text_of(page([FakeTarget("db", incident)], 1.0))
    expected = [f"{incident.status}: {incident.summary()}"]
    for cause in incident.alerting:
        heading, _ = cause_heading(cause)
        expected += [squeeze(heading), *(squeeze(line) for line in cause_detail(cause))]
    in_order(text, expected)


def test_a_down_target_is_unknown_never_no_findings() -> None:
    markup = page([FakeTarget("db2", None, DOWN_ERROR, seconds=2.0)], 1.0)
    text = text_of(markup)
    assert "unknown — target down since " in text and "or earlier" in text
    assert "no findings" not in text and "no findings" not in markup
    assert html.escape(DOWN_ERROR) in markup and DOWN_ERROR in text
    went = datetime(2026, 11, 29, 14, 0, 5, tzinfo=timezone.utc).timestamp()
    text = text_of(page([FakeTarget("db2", None, "timed out after 2s", down_since=went)], 1.0))
    assert "unknown — target down since 2026-11-29 14:00:05 UTC: timed out after 2s" in text


def test_server_strings_are_escaped() -> None:
    snapshot = bundled_snapshot()
    sessions = dict(snapshot.sessions)
    sessions[4163] = dataclasses.replace(
        sessions[4163], application_name=HOSTILE, query=f"SELECT '{HOSTILE}' -- \"&\""
    )
    incident = incident_of(dataclasses.replace(snapshot, sessions=sessions))
    assert incident.causes[0].pid == 4163
    markup = page([FakeTarget(HOSTILE, incident), FakeTarget(HOSTILE, None, HOSTILE)], 1.0)
    assert "<script" not in markup and HOSTILE not in markup
    assert html.escape(HOSTILE) in markup
    assert markup.count(html.escape(HOSTILE)) >= 5  # names, app, query, evidence, error
    text = text_of(markup)
    assert f"pid 4163 ({HOSTILE})" in text  # the reader sees the string as it is


def test_the_page_reloads_itself_no_faster_than_a_scrape_is_worth() -> None:
    assert "<meta http-equiv='refresh' content='15'>" in page(bundled_targets(), 0.2)
    assert "<meta http-equiv='refresh' content='60'>" in page(bundled_targets(), 60.0)


def test_an_up_target_without_findings_says_so() -> None:
    snapshot = bundled_snapshot()
    quiet = dataclasses.replace(snapshot, sessions={}, locks=[])
    text = text_of(page([FakeTarget("db", incident_of(quiet))], 1.0))
    assert "db up OK" in text and "OK: no findings" in text and "unknown" not in text


# -- a real browser ----------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[str]:
    """A tiny HTTP server answering ``/`` with page(), as the exporter does."""
    targets = bundled_targets()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page(targets, 1.0).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_headless_browser_renders_the_causes_first(served: str, tmp_path: Path) -> None:
    dom = browse(served, tmp_path / "profile", "--dump-dom").stdout
    assert re.search(r"<title>CRITICAL · lockdiag exporter</title>", dom), dom[:500]
    text = text_of(dom)
    first = text.find(
        "CRITICAL session-lock: tenant_summary 73 (+1 more) pid 4163 (billing-worker)"
    )
    symptom = text.find("pid 9933 (summary-worker) has waited")
    assert 0 <= first < symptom, (first, symptom)
    assert first < text.find("pid 9932 (summary-worker)")
    assert "unknown — target down since" in text and "no findings" not in text
    assert "<script" not in dom  # the error's markup stayed text
    shot = tmp_path / "page.png"
    browse(served, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
