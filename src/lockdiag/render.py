"""The one place that decides how a result looks: a rich table on a terminal, aligned plain
text when piped, JSON on request. Commands hand over an :class:`Output`; nothing else prints.

Every string that came from the server (application_name, query, role and database names) is
passed through :func:`clean` before display: control characters and escape sequences are made
visible. Cells reach rich as ``Text`` objects, so markup in them is never interpreted. JSON
keeps the exact values.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from rich.console import Console

Format = Literal["table", "plain", "json"]
ELLIPSIS_WIDTH = 60  # plain text keeps long cells whole; tables on a terminal cut them
VALUE_STYLES = {"WAITING": "bold red"}
NARROW_LIMIT = 32  # a short column never shrinks below its content, up to this width


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    title: str | None = None
    important: list[bool] | None = None  # rows kept first when a terminal view is capped
    wide: set[int] = field(default_factory=set)  # columns that may be cut on a terminal
    styles: dict[int, str] = field(default_factory=dict)  # rich style of a column's cells
    optional: list[int] = field(default_factory=list)  # dropped in this order when too wide
    empty: str = "(none)"
    left_out: int = 0  # rows the caller left out before building the table (see pick)


@dataclass
class Text:
    lines: list[str]
    style: Literal["plain", "verdict", "note", "error"] = "plain"


Block = Table | Text


@dataclass
class Output:
    """A result: ``blocks`` for people, ``data`` for JSON. Both are built only when needed.

    ``items`` names a list that JSON output streams after the keys of ``data``, one item at a
    time, so a hundred thousand locks never sit in memory as JSON-ready dicts all at once.
    """

    blocks: Callable[[], list[Block]]
    data: Callable[[], Any]
    items: tuple[str, Callable[[], Iterable[Any]]] | None = None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def clean(text: str | None) -> str:
    """A server-provided string made safe to print: no escape sequences, no line breaks."""
    if not text:
        return ""
    if text.isascii() and text.isprintable():  # the common case, checked in C
        return text
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def resolve(fmt: str, stream: TextIO) -> Format:
    if fmt == "auto":
        return "table" if stream.isatty() else "plain"
    return fmt  # type: ignore[return-value]


def render(output: Output, fmt: str = "auto", stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    chosen = resolve(fmt, stream)
    if chosen == "json":
        _json(output, stream)
    elif chosen == "plain":
        stream.write(plain(output.blocks()))
    else:
        _rich(output.blocks(), stream)


def _json(output: Output, stream: TextIO) -> None:
    head = output.data()
    if output.items is None or stream.isatty():  # a terminal gets it whole and indented
        if output.items is not None:
            key, items = output.items
            head = {**head, key: list(items())}
        indent = 2 if stream.isatty() else None
        stream.write(json.dumps(head, indent=indent, ensure_ascii=False) + "\n")
        return
    key, items = output.items
    opening = json.dumps(head, ensure_ascii=False)[:-1]
    stream.write(f"{opening}{', ' if head else ''}{json.dumps(key)}: [")
    encode = json.JSONEncoder(ensure_ascii=False).encode
    for index, item in enumerate(items()):
        stream.write(("," if index else "") + encode(item))
    stream.write("]}\n")


def plain(blocks: list[Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Text):
            parts.extend(block.lines)
            continue
        if block.title:
            parts.append(block.title)
        if not block.rows:
            parts.append(block.empty)
            continue
        parts.extend(_aligned(block.headers, block.rows))
        if block.left_out:
            parts.append(f"{block.left_out} more row(s) not shown")
    return "\n".join(parts) + "\n" if parts else ""


def _aligned(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
    # one format call per row (padding done in C), instead of one ljust per cell
    template = "  ".join([*(f"{{:<{w}}}" for w in widths[:-1]), "{}"])
    return [template.format(*cells).rstrip() for cells in [headers, *rows]]


def _rich(blocks: list[Block], stream: TextIO) -> None:
    from rich.console import Console

    console = Console(file=stream, highlight=False, soft_wrap=False)
    tables = sum(1 for b in blocks if isinstance(b, Table))
    budget = max(10, (console.height - 8) // max(1, tables)) if stream.isatty() else 0
    for renderable in rich_renderables(blocks, console, budget):
        console.print(renderable)


def rich_renderables(blocks: list[Block], console: Console, budget: int | None = None) -> list[Any]:
    """Blocks as rich renderables. ``budget`` caps table rows (None: what fits the screen
    after the text lines, as a live view needs)."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text as RichText

    live = budget is None  # a screen that is redrawn: every text line takes one line of it
    if budget is None:
        text_lines = sum(len(b.lines) for b in blocks if isinstance(b, Text))
        budget = max(3, console.height - text_lines - 5)
    styles = {"plain": "", "verdict": "bold", "note": "yellow", "error": "bold red"}
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, Text):
            out += [
                RichText(text, style=styles[block.style], no_wrap=live, overflow="ellipsis")
                for text in block.lines
            ]
            continue
        if not block.rows:
            if block.title:
                out.append(RichText(block.title, style="bold"))
            out.append(RichText(block.empty, style="dim"))
            continue
        capped, left_out = _cap(block, budget)
        shown, rows = _fit(block, capped, console.width)
        table = RichTable(
            title=shown.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            padding=(0, 1),
            collapse_padding=True,
            show_edge=False,
        )
        for index, header in enumerate(shown.headers):
            if index in shown.wide:
                table.add_column(
                    header, overflow="ellipsis", no_wrap=True, max_width=ELLIPSIS_WIDTH
                )
            else:  # short columns keep their width; the wide ones give way on a narrow screen
                width = max([len(header), *(len(row[index]) for row in rows)])
                table.add_column(header, no_wrap=True, min_width=min(width, NARROW_LIMIT))
        for row in rows:
            table.add_row(
                *(
                    RichText(cell, style=VALUE_STYLES.get(cell) or shown.styles.get(index, ""))
                    for index, cell in enumerate(row)
                )
            )
        out.append(table)
        if left_out:
            out.append(
                RichText(
                    f"{left_out} more row(s) not shown (waiting and flagged rows first); "
                    "--format plain or json gives every row",
                    style="yellow",
                )
            )
    return out


def _fit(block: Table, rows: list[list[str]], width: int) -> tuple[Table, list[list[str]]]:
    """Drop the optional columns, in their order, until the table fits the screen."""

    def needed(columns: list[int]) -> int:
        sizes = [
            min(max([len(block.headers[c]), *(len(r[c]) for r in rows)]), ELLIPSIS_WIDTH)
            for c in columns
        ]
        return sum(sizes) + len(columns) - 1

    keep = list(range(len(block.headers)))
    for column in block.optional:
        if needed(keep) <= width:
            break
        keep.remove(column)
    if len(keep) == len(block.headers):
        return block, rows
    fitted = Table(
        [block.headers[c] for c in keep],
        [[row[c] for c in keep] for row in block.rows],
        block.title,
        block.important,
        {keep.index(c) for c in block.wide if c in keep},
        {keep.index(c): style for c, style in block.styles.items() if c in keep},
        empty=block.empty,
    )
    return fitted, [[row[c] for c in keep] for row in rows]


def _cap(block: Table, budget: int) -> tuple[list[list[str]], int]:
    """At most ``budget`` rows, important ones first, in their original order; and how many
    were left out, here or by the caller."""
    if not budget or len(block.rows) <= budget:
        return block.rows, block.left_out
    chosen = pick(block.important or [False] * len(block.rows), budget)
    return [block.rows[i] for i in chosen], block.left_out + len(block.rows) - len(chosen)


def pick(important: list[bool], budget: int) -> list[int]:
    """The indexes of at most ``budget`` rows: the important ones first, then the others, in
    their original order. A caller with many rows picks before it builds them."""
    chosen = [i for i, keep in enumerate(important) if keep][:budget]
    if len(chosen) < budget:
        others = [i for i, keep in enumerate(important) if not keep]
        chosen.extend(others[: budget - len(chosen)])
    return sorted(chosen)
