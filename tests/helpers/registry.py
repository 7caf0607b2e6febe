"""Registries as the tests write them: a registry file in a test's folder, and the Registry a
text declares."""

from __future__ import annotations

from pathlib import Path

from lockdiag.registry import Registry, parse_registry


def write_registry(directory: Path, text: str, name: str = "lockdiag.toml") -> Path:
    """``text`` written as the registry file ``name`` in ``directory`` (by default the one
    lockdiag finds there itself); its path."""
    path = directory / name
    path.write_text(text)
    return path


def parsed_registry(text: str) -> Registry:
    """The registry ``text`` declares, which must be usable (its problems shown if not)."""
    registry, problems = parse_registry(text)
    assert registry is not None, problems
    return registry
