"""The benchmark's quick mode runs in every test run, so the script cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "targets" in result.stdout
    results = json.loads(out.read_text())
    (server,) = results["server"]
    assert server["locks"] == 1000 and server["snapshot_ms"] > 0
    assert results["client"]["list_plain_s"] > 0 and results["client"]["python_floor_s"] > 0
    assert results["client"]["exporter_scrape_s"] > 0
    assert [c["value"] > 0 for c in results["context"]] == [True, True]
    assert {t["target"][:2] for t in results["targets"]} == {"2.", "3.", "4.", "5.", "6.", "fl"}


def test_chains_benchmark_runs(tmp_path: Path) -> None:
    """bench/chains.py on small shapes: every command answers, from its own files."""
    out = tmp_path / "chains.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chains.py"), "--layers", "4", "--depth", "40",
         "--runs", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["results"]
    assert {r["snapshot"] for r in rows} == {"4 layers of 3", "chain 40 deep"}
    assert {r["command"]: r["exit"] for r in rows if r["snapshot"] == "chain 40 deep"} == {
        "check": 2, "blockers": 0, "blockers --format json": 0, "who-holds": 0, "watch --once": 0
    }  # fmt: skip
    assert all(r["peak_mb"] > 0 and r["output_kb"] > 0 for r in rows)
