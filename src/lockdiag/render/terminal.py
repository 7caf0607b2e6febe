"""A terminal's form: the blocks fitted to the screen and drawn by rich (the only module of
the renderers that imports it, and only when a table is drawn)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, TextIO

from lockdiag.render.model import Block, Output, Text
from lockdiag.render.screen import fit_screen, layout

if TYPE_CHECKING:
    from rich.console import Console

VALUE_STYLES = {"WAITING": "bold red"}  # a cell's style by its value
TEXT_STYLES = {  # a text block's style as rich draws it
    "plain": "",
    "verdict": "bold",
    "note": "yellow",
    "error": "bold red",
    "critical": "bold red",
    "warning": "yellow",
}


def write_table(output: Output, stream: TextIO) -> None:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """rich exits 1 of its own when the reader goes away: the CLI's one rule
            (lockdiag.cli.group) decides what a broken pipe ends in, for every format."""
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

    console = _Console(file=stream, highlight=False, soft_wrap=False)
    lines = console.height if stream.isatty() else 0
    blocks = output.screen(console.width, lines) if output.screen else output.blocks()
    if lines:  # a screenful, and the shell's prompt after it
        blocks = fit_screen(blocks, console.width, lines - 1)
    for renderable in rich_renderables(blocks, console):
        console.print(renderable)


def rich_renderables(blocks: list[Block], console: Console) -> list[Any]:
    """Blocks as rich renderables for a screen of ``console``'s width, every row of every
    table (:func:`fit_screen` first, to fit a screen's height). Text lines wrap between words;
    tables keep their essential columns whole, the rest give way (see :func:`fit`)."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text as RichText

    out: list[Any] = []
    for block in blocks:
        if isinstance(block, Text):
            out += [RichText(text, style=TEXT_STYLES[block.style]) for text in block.lines]
            continue
        if not block.rows:
            if block.title:
                out.append(RichText(block.title, style="bold"))
            out.append(RichText(block.empty, style="dim"))
            continue
        chosen = list(range(len(block.rows)))
        form, explained = layout(block, chosen, console.width)
        if block.title:
            out.append(RichText(block.title, style="bold"))
        if isinstance(form, list):  # one line per row, cut at the screen's edge
            out += [_one_line(line, console.width) for line in form]
        else:
            columns, cells, widths = form
            table = RichTable(
                box=box.SIMPLE_HEAD,
                pad_edge=False,
                padding=(0, 1, 0, 0),
                show_edge=False,
            )
            for column, width in zip(columns, widths, strict=True):
                table.add_column(
                    block.headers[column],
                    no_wrap=True,
                    overflow="ellipsis",
                    min_width=width,
                    max_width=width,
                )
            for row in cells:
                table.add_row(
                    *(
                        RichText(cell, style=VALUE_STYLES.get(cell) or block.styles.get(c, ""))
                        for c, cell in zip(columns, row, strict=True)
                    )
                )
            out.append(table)
        out += [RichText(line, style="yellow") for line in explained]
        if block.left_out:
            out.append(
                RichText(
                    f"{block.left_out} more row(s) not shown"
                    + (" (the most urgent first)" if block.important is not None else "")
                    + (f"; {block.more}" if block.more else ""),
                    style="yellow",
                    no_wrap=True,
                    overflow="ellipsis",
                )
            )
    return out


def _one_line(text: str, width: int, style: str = "") -> Any:
    from rich.text import Text as RichText

    line = RichText(text, style=style, no_wrap=True, overflow="ellipsis")
    line.truncate(width, overflow="ellipsis")
    return line
