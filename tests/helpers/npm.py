"""Node.js programs the catalogue names, run for real: their npm packages installed once into a
cache and reused, and a script run against them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NPM_CACHE = Path.home() / ".cache" / "lockdiag-tests" / "npm"  # one install per spec, reused


def npm_package(spec: str) -> Path:
    """The directory where ``npm install <spec>`` was run (installed once, then reused). No
    node or npm, or no network the first time: the test fails, it never skips."""
    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm and node, "node and npm are needed (Debian: apt-get install nodejs npm)"
    where = NPM_CACHE / spec.replace("/", "_").replace("@", "_")
    name = spec.rsplit("@", 1)[0] if spec.count("@") > spec.startswith("@") else spec
    if not (where / "node_modules" / name / "package.json").is_file():
        where.mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text('{"name": "lockdiag-test", "private": true}\n')
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", spec],
            cwd=where, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"npm install {spec} failed:\n{result.stderr}"
    return where


def node(where: Path, script: str, *args: str, timeout: float = 60) -> str:
    """What ``script`` (an ES module) printed, run by node in ``where`` with ``args``: where
    ``npm_package`` installed what it imports."""
    (where / "lockdiag-test.mjs").write_text(script)
    result = subprocess.run(
        ["node", "lockdiag-test.mjs", *args],
        cwd=where, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout
