"""Plugins as pip installs them, for the tests of lockdiag's entry points: a module and its
dist-info in a folder the test puts on PYTHONPATH."""

from __future__ import annotations

import textwrap
from pathlib import Path


def install(site: Path, module: str, source: str, points: dict[str, str]) -> None:
    """A distribution as pip leaves it: the module, and a dist-info with its entry points."""
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    lines = [f"{name} = {target}" for name, target in points.items()]
    (info / "entry_points.txt").write_text("[lockdiag.catalogue]\n" + "\n".join(lines) + "\n")
