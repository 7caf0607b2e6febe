"""Lint and strict types are part of the test run, so one command checks everything."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def test_ruff_lint_and_format() -> None:
    paths = ["src", "tests", "bench", "scripts"]
    for command in (["check", *paths], ["format", "--check", *paths]):
        result = subprocess.run(
            [tool("ruff"), *command], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = subprocess.run([tool("mypy")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
