"""The one place that decides how a result looks: a rich table on a terminal, aligned plain
text when piped, JSON on request. Commands hand over an :class:`Output`; nothing else prints.

Every string that came from the server (application_name, query, role and database names) is
passed through :func:`clean` before display: control characters and escape sequences are made
visible. Cells reach rich as ``Text`` objects, so markup in them is never interpreted. JSON
keeps the exact values.

The rooms, each importing only those before it: ``model`` (the blocks and the Output),
``inert`` (server strings made inert), ``text`` (plain, Markdown, CSV, Nagios, Prometheus),
``json``, ``screen`` (what fits a terminal, pure), ``terminal`` (drawn by rich, the only
importer of rich here). This module maps ``--format`` to them.

It may import tabulate, and rich in ``terminal`` only; nothing else of lockdiag: the views
hand it finished blocks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from lockdiag.render.inert import _INVISIBLE, clean, csv_cell, md_escape, plugin_text
from lockdiag.render.json import write_json
from lockdiag.render.model import (
    DETAIL,
    MORE_ROWS,
    ROWS,
    STEP,
    VERDICT,
    Block,
    Cells,
    Format,
    Items,
    More,
    Output,
    SharedRows,
    Table,
    Text,
)
from lockdiag.render.screen import (
    CUT,
    Plan,
    apply_plan,
    fit,
    fit_screen,
    pick,
    plan_screen,
    table_height,
    text_height,
)
from lockdiag.render.terminal import rich_renderables, write_table
from lockdiag.render.text import (
    CHUNK,
    markdown,
    plain,
    plain_lines,
    write_csv,
    write_markdown,
    write_metrics,
    write_plain,
    write_status,
)

__all__ = [
    "CHUNK",
    "CUT",
    "DETAIL",
    "MORE_ROWS",
    "RENDERERS",
    "ROWS",
    "STEP",
    "VERDICT",
    "_INVISIBLE",
    "Block",
    "Cells",
    "Format",
    "Items",
    "More",
    "Output",
    "Plan",
    "SharedRows",
    "Table",
    "Text",
    "apply_plan",
    "clean",
    "csv_cell",
    "fit",
    "fit_screen",
    "markdown",
    "md_escape",
    "pick",
    "plain",
    "plain_lines",
    "plan_screen",
    "plugin_text",
    "render",
    "resolve",
    "rich_renderables",
    "table_height",
    "text_height",
]


def resolve(fmt: str, stream: TextIO) -> Format:
    if fmt == "auto":
        return "table" if stream.isatty() else "plain"
    return fmt  # type: ignore[return-value]


def render(output: Output, fmt: str = "auto", stream: TextIO | None = None) -> None:
    """The one place that maps ``--format`` to a renderer."""
    stream = stream or sys.stdout
    RENDERERS[resolve(fmt, stream)](output, stream)


RENDERERS: dict[Format, Callable[[Output, TextIO], None]] = {
    "table": write_table,
    "plain": write_plain,
    "json": write_json,
    "markdown": write_markdown,
    "csv": write_csv,
    "nagios": write_status,
    "prometheus": write_metrics,
}
