"""The bundled server log (examples/postgresql.log, written by scripts/sample_log.py from a real
server) reads whole, names every namespace of the bundled registry, and holds the deadlock and
the lock timeout the log guide shows."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib
from click.testing import CliRunner

from lockdiag.cli import cli

ROOT = Path(__file__).resolve().parent.parent
LOG, REGISTRY = ROOT / "examples" / "postgresql.log", ROOT / "examples" / "lockdiag.toml"


def test_the_sample_log_reads_whole_and_names_the_registrys_keys() -> None:
    assert LOG.stat().st_size < 200_000
    result = CliRunner().invoke(
        cli, ["log", str(LOG), "--registry", str(REGISTRY), "--format", "json"],
        env={"LOCKDIAG_SETTINGS": ""},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (read,) = report["files"]
    assert read["format"] == "stderr" and read["prefix"] == "%m [%p] %q%u@%d/%a "
    assert read["unparsed_lines"] == 0 and not read["last_line_cut_short"]
    assert report["notes"] == []
    declared = set(tomllib.loads(REGISTRY.read_text())["namespaces"])
    assert {key["namespace"] for key in report["keys"]} == declared
    assert all(key["database"] == "shop" for key in report["keys"])
    assert report["deadlock_count"] == 1 and report["cancellation_count"] == 1
    (cancelled,) = report["cancellations"]
    assert cancelled["key"] == "leader 1"
