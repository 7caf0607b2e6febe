"""The exporter page's screenshot in the docs (README.md, guides/prometheus.md), drawn again
from the bundled incident so it never goes stale, with the page's text beside it.

    python scripts/exporter_page.py           # docs/exporter-page.png and .txt, in Chromium
    python scripts/exporter_page.py --check   # exit 1 when the page's text is not the .txt's

docs/exporter-page.txt is the text a reader sees on the page the screenshot shows (the time of
the last scrape written HH:MM:SS): a test (tests/test_docs.py) fails when the page's text today
differs from it, so the picture cannot drift from what the exporter draws. The docs build
(mkdocs.yml's hooks) draws both again when they differ and Chromium is there.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.incident import Incident
from lockdiag.core.model import Snapshot
from lockdiag.core.snapshot_file import load
from lockdiag.registry import load_registry
from lockdiag.views.exporter import TargetState, page

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PICTURE = ROOT / "docs" / "exporter-page.png"
TEXT = ROOT / "docs" / "exporter-page.txt"
DOWN_ERROR = 'cannot connect to 127.0.0.1:1: <refused> & "gone"'
WINDOW = "--window-size=1280,900"
DOWN_SINCE = datetime(2026, 11, 29, 14, 12, 0, tzinfo=timezone.utc).timestamp()  # the second
_SCRAPED_AT = re.compile(r"last scrape \d\d:\d\d:\d\d UTC")  # the wall clock of the draw


@dataclasses.dataclass
class FakeTarget:
    """What the page reads of the exporter's Target."""

    name: str
    report: Incident | None
    error: str | None = None
    seconds: float = 0.0123
    taken_at: float = dataclasses.field(default_factory=time.monotonic)
    down_since: float | None = None
    stalled: bool = False


def bundled_snapshot() -> Snapshot:
    return load(EXAMPLES / "incident.json")


def incident_of(snapshot: Snapshot) -> Incident:
    policy = CheckPolicy()
    registry = load_registry(str(EXAMPLES / "lockdiag.toml"))
    return Diagnosis(snapshot, registry, policy.analysis_policy()).incident(policy)


def bundled_targets() -> list[TargetState]:
    """The bundled incident, up, and a second target that is down."""
    return [
        FakeTarget("db1.example:5432/shop", incident_of(bundled_snapshot())),
        FakeTarget("db2.example:5432/shop", None, DOWN_ERROR, seconds=2.0, down_since=DOWN_SINCE),
    ]


class _Text(HTMLParser):
    """The text a reader sees, in document order (no style, no title)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.skip += tag in ("style", "title", "script")
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.skip -= tag in ("style", "title", "script")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


_BLOCKS = frozenset(
    ("p", "div", "section", "header", "li", "tr", "h1", "h2", "h3", "h4", "dt", "dd", "pre")
)


def text_of(markup: str) -> str:
    """The page's text on one line, spaces squeezed."""
    return " ".join(_lines_of(markup).split())


def _lines_of(markup: str) -> str:
    parser = _Text()
    parser.feed(markup)
    lines = (" ".join(line.split()) for line in " ".join(parser.parts).split("\n"))
    return "\n".join(line for line in lines if line)


def page_text() -> str:
    """The bundled page's text, a line per block of the page, the time of the draw masked:
    what docs/exporter-page.txt holds."""
    lines = _lines_of(page(bundled_targets(), 1.0))
    return _SCRAPED_AT.sub("last scrape HH:MM:SS UTC", lines) + "\n"


class BrowserMissing(RuntimeError):
    pass


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise BrowserMissing("chromium not found: apt-get install -y chromium")
    return found


def browse(url: str, profile: Path, *options: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--disable-dev-shm-usage", "--disable-sync",
             "--disable-background-networking", "--disable-component-update"]  # fmt: skip
    if os.geteuid() == 0:
        flags.append("--no-sandbox")
    done = subprocess.run(
        [chromium(), *flags, *options, url], check=False, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed: {done.stderr[-2000:]}")
    return done


def draw(picture: Path = PICTURE, text: Path = TEXT) -> None:
    """The bundled incident's page as a browser shows it at 1280x900, and its text."""
    with tempfile.TemporaryDirectory() as scratch:
        page_file = Path(scratch) / "page.html"
        page_file.write_text(page(bundled_targets(), 1.0))
        browse(page_file.as_uri(), Path(scratch) / "profile", f"--screenshot={picture.resolve()}",
               WINDOW)  # fmt: skip
    text.write_text(page_text())


def drift() -> list[str]:
    """How the page's text today differs from the screenshot's (empty: it does not)."""
    shown = TEXT.read_text() if TEXT.is_file() else ""
    now = page_text()
    if shown == now:
        return []
    return list(difflib.unified_diff(shown.splitlines(), now.splitlines(), "shown", "today"))


def on_pre_build(config: Any, **kwargs: Any) -> None:
    """mkdocs hook: the screenshot drawn again when the page's text changed."""
    if drift():
        try:
            draw()
        except BrowserMissing as error:
            print(f"exporter_page: the screenshot is stale, not redrawn: {error}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only, draw nothing")
    if parser.parse_args().check:
        changed = drift()
        if changed:
            print("\n".join(changed[:80]))
            print("the exporter page changed: python scripts/exporter_page.py", file=sys.stderr)
        return 1 if changed else 0
    draw()
    return 0


if __name__ == "__main__":
    sys.exit(main())
