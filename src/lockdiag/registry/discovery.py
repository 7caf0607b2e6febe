"""Where the registry file is (``--registry``, the environment, the working directory, the
user's config directory) and loading it for a command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lockdiag.errors import InputError
from lockdiag.registry.model import FILE_NAME, Registry
from lockdiag.registry.validation import check_file

ENV_VAR = "LOCKDIAG_REGISTRY"


class RegistryError(InputError):
    """The registry file cannot be used; the message names the file, line and reason."""


def find_registry(explicit: str | None = None, missing_ok: bool = False) -> Path | None:
    """Where the registry is: ``--registry``, ``$LOCKDIAG_REGISTRY``, ``./lockdiag.toml``, then
    the user's config directory. An explicit path must exist; the defaults may be absent.
    With ``missing_ok`` an explicit path is returned even when it is not a file, for the
    caller to say so, naming what gave the path (the CLI: ``cli.common.registry_file``)."""
    chosen = explicit or os.environ.get(ENV_VAR)
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file() and not missing_ok:
            source = "" if explicit else f" (from {ENV_VAR})"
            raise RegistryError(f"registry file {path}{source} does not exist")
        return path
    found = found_unnamed()
    return found[0] if found is not None else None


WORKING_DIRECTORY, CONFIG_DIRECTORY = "the working directory", "your config directory"


def unnamed_candidates() -> list[tuple[Path, str]]:
    """Where a registry file nobody named is looked for, in order, and how each is said."""
    return [
        (Path.cwd() / FILE_NAME, WORKING_DIRECTORY),
        (config_dir() / FILE_NAME, CONFIG_DIRECTORY),
    ]


def found_unnamed() -> tuple[Path, str] | None:
    """The registry file found when none is named, and where (WORKING_DIRECTORY or
    CONFIG_DIRECTORY); None when neither has one."""
    return next(((path, where) for path, where in unnamed_candidates() if path.is_file()), None)


def config_dir() -> Path:
    if sys.platform == "win32":  # pragma: no cover
        return Path(os.environ.get("APPDATA", Path.home())) / "lockdiag"
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "lockdiag"


def load_registry(explicit: str | None = None) -> Registry:
    """The registry found by :func:`find_registry`, or an empty one when there is none.

    Raises RegistryError listing every error when the file is invalid.
    """
    path = find_registry(explicit)
    if path is None:
        return Registry()
    registry, problems = check_file(path)
    errors = [p for p in problems if p.severity == "error"]
    if registry is None or errors:
        raise RegistryError("\n".join(p.located for p in errors))
    return registry
