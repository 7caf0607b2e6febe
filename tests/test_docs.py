"""Generated documentation stays current: completions, the CLI reference, the transcripts of
the README and docs/, and the MkDocs site builds without a warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lockdiag.cli.completion import completion_script
from lockdiag.cli.reference import commands, reference

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_committed_completions_are_current(shell: str) -> None:
    committed = (ROOT / "completions" / f"lockdiag.{shell}").read_text()
    assert committed == completion_script(shell), (
        f"regenerate: lockdiag completion {shell} > completions/lockdiag.{shell}"
    )


def test_cli_reference_is_current() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == reference(), (
        "regenerate: python -m lockdiag.cli.reference > docs/cli.md"
    )


def test_every_command_has_an_example_and_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for path, command in commands():
        assert "Example" in (command.help or ""), path
        assert f"`{path}" in readme or f"{path} " in readme, f"{path} is not in the README"
    assert "docs/cli.md" in readme


def test_namespace_names_complete_from_the_registry(tmp_path: Path) -> None:
    (tmp_path / "lockdiag.toml").write_text(
        "[namespaces.tenant_summary]\nid = 1\n[namespaces.tenant_export]\nid = 2\n"
        "[namespaces.leader]\nid = 3\n"
    )
    environment = {
        **os.environ,
        "_LOCKDIAG_COMPLETE": "bash_complete",
        "COMP_WORDS": "lockdiag who-holds tenant",
        "COMP_CWORD": "2",
    }
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag"], env=environment, cwd=tmp_path,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.stdout.split() == ["plain,tenant_export", "plain,tenant_summary"]


def test_transcripts_in_readme_and_docs_are_what_the_commands_print() -> None:
    """The transcripts of the bundled incident in README.md and docs/, rendered again and
    compared exactly (python scripts/transcripts.py regenerates them)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "transcripts.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_exporter_page_screenshot_shows_the_page_of_today() -> None:
    """The README's picture of the exporter's page is of the page as it is: its text
    (docs/exporter-page.txt, drawn with it) compared with the page's text today; python
    scripts/exporter_page.py (or the docs build) draws both again."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "exporter_page.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_build_strictly(tmp_path: Path) -> None:
    """--strict turns every broken link, missing anchor and page left out of the nav into an
    error, so the site cannot rot unseen."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install -e '.[test]'"
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
