"""Where the tests find the repository's own files: the bundled incident (a snapshot file) and
its registry, among the examples."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
INCIDENT = EXAMPLES / "incident.json"
BUNDLED_REGISTRY = EXAMPLES / "lockdiag.toml"
