"""The forms written for a pipe, a ticket or a monitoring system: aligned plain text (made a
line at a time, written in chunks), Markdown, CSV, a Nagios status line, Prometheus text."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import TextIO

from lockdiag.render.inert import csv_cell, md_escape
from lockdiag.render.model import Block, Cells, Output, SharedRows, Table, Text


def write_plain(output: Output, stream: TextIO) -> None:
    """Plain text written as it is made, CHUNK lines (or some CHUNK_TEXT characters: a run of
    lines comes as one string) at a time: a table of a hundred thousand locks is never one
    string (nor a list of its lines) in memory."""
    lines = plain_lines(output.blocks())
    pending: list[str] = []
    size = 0
    while chunk := list(islice(lines, 8)):  # few: a run of lines is some 200 kB
        pending += chunk
        size += sum(map(len, chunk))
        if len(pending) >= CHUNK or size >= CHUNK_TEXT:
            stream.write("\n".join(pending) + "\n")
            pending, size = [], 0
    if pending:
        stream.write("\n".join(pending) + "\n")


CHUNK = 4096  # lines of plain text written at a time
CHUNK_TEXT = 1 << 20  # characters of plain text written at a time, at most about


def write_markdown(output: Output, stream: TextIO) -> None:
    stream.write(markdown((output.document or output.blocks)()))


def write_status(output: Output, stream: TextIO) -> None:
    if output.status is None:
        raise ValueError("this result has no status line")
    stream.write(output.status() + "\n")


def write_metrics(output: Output, stream: TextIO) -> None:
    if output.metrics is None:
        raise ValueError("this result has no metrics")
    stream.write("".join(f"{line}\n" for line in output.metrics()))


def plain(blocks: list[Block]) -> str:
    return "".join(f"{line}\n" for line in plain_lines(blocks))


def plain_lines(blocks: list[Block]) -> Iterator[str]:
    """The blocks as plain text, a line at a time (without its line break)."""
    for block in blocks:
        if isinstance(block, Text):
            yield from block.lines
            continue
        if block.title:
            yield block.title
        if not block.rows:
            yield block.empty
            continue
        yield from _aligned(block.headers, block.rows)
        if block.left_out:
            yield f"{block.left_out} more row(s) not shown"


def markdown(blocks: list[Block]) -> str:
    """GitHub-flavoured Markdown for incident channels and tickets: verdicts as bold lines,
    other text in a fenced block, tables as pipe tables (tabulate's "github" format), every
    server string escaped. Every row is kept."""
    from tabulate import tabulate

    parts: list[str] = []
    fenced: list[str] = []  # consecutive text lines share one fenced block

    def close() -> None:
        if fenced:
            longest = max(
                (len(run) for line in fenced for run in re.findall("`+", line)), default=0
            )
            fence = "`" * max(3, longest + 1)
            parts.extend([fence, *fenced, fence, ""])
            fenced.clear()

    for block in blocks:
        if isinstance(block, Text):
            if block.style == "verdict":
                close()
                parts += [*(f"**{md_escape(line)}**" for line in block.lines), ""]
            else:
                fenced.extend(block.lines)
            continue
        close()
        if block.title:
            parts += [f"**{md_escape(block.title)}**", ""]
        if not block.rows:
            parts += [f"_{md_escape(block.empty)}_", ""]
            continue
        cells = [[md_escape(cell) for cell in row] for row in block.rows]
        headers = [md_escape(header) for header in block.headers]
        parts += [tabulate(cells, headers, tablefmt="github", disable_numparse=True), ""]
    close()
    return "\n".join(parts).rstrip("\n") + "\n" if parts else ""


def write_csv(output: Output, stream: TextIO) -> None:
    """The first table, every row, as CSV (the header first); text blocks are left out.
    Every cell passes through :func:`csv_cell`: none is a formula when opened in a
    spreadsheet."""
    import csv

    blocks = (output.document or output.blocks)()
    table = next((b for b in blocks if isinstance(b, Table)), None)
    if table is None:
        return
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow([csv_cell(header) for header in table.headers])
    writer.writerows([csv_cell(cell) for cell in row] for row in table.rows)


def _aligned(headers: list[str], rows: Sequence[list[str]]) -> Iterator[str]:
    """The table's lines, each made when it is written: the widths need every row first."""
    if isinstance(rows, SharedRows) and len(headers) > 1:
        yield from _aligned_shared(headers, rows)
        return
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
    if len(widths) == 1:
        yield from (cells[0].rstrip() for cells in chain([headers], rows))
        return
    # the columns after the first, formatted in one call (padding done in C); a row that
    # differs from the one before only in its first column (the many locks of one backend,
    # their names first) reuses that row's formatted rest
    rest = "  ".join([*(f"{{:<{w}}}" for w in widths[1:-1]), "{}"]).format
    first = widths[0]
    previous: list[str] | None = None
    tail = ""
    for cells in chain([headers], rows):
        others = cells[1:]
        if others != previous:
            previous, tail = others, "  " + rest(*others)
        yield (cells[0].ljust(first) + tail).rstrip()


def _aligned_shared(headers: list[str], rows: SharedRows) -> Iterator[str]:
    """:func:`_aligned`'s lines for shared rows: the widths from each shared row once and
    from every differing cell, and each shared row's cells before and after the differing one
    formatted once (the same text: ``{:<w}`` is ``ljust``, the last cell is not padded). A
    run of cells (:class:`Cells`) comes as its lines joined, made in one go."""
    column, items = rows.column, rows.items
    shared = {id(row): row for _, row in items}
    shared[id(headers)] = headers
    widths = [max(map(len, cells)) for cells in zip(*shared.values(), strict=True)]
    widths[column] = max(
        len(headers[column]),
        max((len(cell) if isinstance(cell, str) else cell.width for cell, _ in items), default=0),
    )
    last = len(widths) - 1
    formats = [f"{{:<{w}}}" for w in widths[:last]] + ["{}"]
    before = "  ".join(formats[:column]).format
    after = "  ".join(formats[column + 1 :]).format
    width = widths[column] if column < last else 0
    opening = "" if column == 0 else "  "  # between the cells before and the differing one
    closing = "" if column == last else "  "
    made: dict[int, tuple[str, str]] = {}
    for cell, row in chain([(headers[column], headers)], items):
        ends = made.get(id(row))
        if ends is None:
            ends = made[id(row)] = (
                before(*row[:column]) + opening,
                closing + after(*row[column + 1 :]),
            )
        if isinstance(cell, str):
            yield (ends[0] + cell.ljust(width) + ends[1]).rstrip()
        else:
            yield _run(ends, cell, width)


def _run(ends: tuple[str, str], cells: Cells, width: int) -> str:
    """The lines of a run of cells between the same ends, joined: each line is its cell padded
    between them, stripped on the right as :func:`_aligned_shared` strips one."""
    start, end = ends
    stripped = end.rstrip()
    if not stripped:  # nothing after the cell but blanks: each line ends with its cell
        return "\n".join((start + cell).rstrip() for cell in cells.make())
    lines = [cell.ljust(width) for cell in cells.make()]
    lines[0] = start + lines[0]  # the ends on the first and last lines: one copy of the run
    lines[-1] += stripped
    return f"{stripped}\n{start}".join(lines)
