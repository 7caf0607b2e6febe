"""A real headless Chromium for the tests of what the exporter's page shows, driven as
``scripts/exporter_page.py`` drives it for the docs' screenshot. Never a skip: without the
browser the test fails, the page must be seen rendered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import exporter_page


def browse(url: str, profile: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Chromium run headless on ``url`` with ``options`` (``--dump-dom``, a screenshot, a
    window size), its profile in ``profile``; it must end well."""
    try:
        return exporter_page.browse(url, profile, *options)
    except exporter_page.BrowserMissing as error:
        pytest.fail(str(error), pytrace=False)
