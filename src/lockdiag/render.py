"""The one place that decides how a result looks: a rich table on a terminal, aligned plain
text when piped, JSON on request. Commands hand over an :class:`Output`; nothing else prints.

Every string that came from the server (application_name, query, role and database names) is
passed through :func:`clean` before display: control characters and escape sequences are made
visible. Cells reach rich as ``Text`` objects, so markup in them is never interpreted. JSON
keeps the exact values.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, Literal, TextIO, overload

if TYPE_CHECKING:
    from rich.console import Console

Format = Literal["table", "plain", "json", "markdown", "csv", "nagios", "prometheus"]
ELLIPSIS_WIDTH = 60  # plain text keeps long cells whole; tables on a terminal cut them
VALUE_STYLES = {"WAITING": "bold red"}
NARROW_LIMIT = 32  # a short column never shrinks below its content, up to this width


# what a screen keeps (see fit_screen): a VERDICT line always; then the worst cause's impact and
# next step (STEP); then table rows (ROWS); DETAIL lines give way first
VERDICT, STEP, ROWS, DETAIL = 0, 1, 2, 3
MORE_ROWS = "--format plain or json gives every row"


class SharedRows(Sequence[list[str]]):
    """A table's rows where most differ from a row they share in one column only (the many
    locks of one backend: every cell but the lock's name is the backend's). Each is kept as
    that cell and the shared row, made whole only when a row is asked for; plain text aligns
    them without making any (see :func:`_aligned_shared`)."""

    def __init__(self, column: int) -> None:
        self.column = column  # the column that differs
        self.items: list[tuple[str, list[str]]] = []  # (its cell, the row it goes into)

    def add(self, cell: str, shared: list[str]) -> None:
        self.items.append((cell, shared))

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> list[str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[str]]: ...
    def __getitem__(self, index: int | slice) -> list[str] | list[list[str]]:
        if isinstance(index, slice):
            return [self._whole(item) for item in self.items[index]]
        return self._whole(self.items[index])

    def _whole(self, item: tuple[str, list[str]]) -> list[str]:
        row = list(item[1])
        row[self.column] = item[0]
        return row


@dataclass
class Table:
    headers: list[str]
    rows: Sequence[list[str]]
    title: str | None = None
    # rows kept first when a terminal view is capped: the higher, the longer kept (True, False)
    important: list[int] | None = None
    wide: set[int] = field(default_factory=set)  # columns that may be cut on a terminal
    styles: dict[int, str] = field(default_factory=dict)  # rich style of a column's cells
    optional: list[int] = field(default_factory=list)  # dropped in this order when too wide
    empty: str = "(none)"
    left_out: int = 0  # rows the caller left out before building the table (see pick)
    essential: set[int] = field(default_factory=set)  # never dropped, never cut
    words: set[int] = field(default_factory=set)  # comma-separated: cut between words, "+N"
    compact: Callable[[int], str] | None = None  # row i as one line, for a narrow screen
    legend: dict[str, str] = field(default_factory=dict)  # on a terminal, words shown: meaning
    more: str = MORE_ROWS  # after "N more row(s) not shown" on a capped screen: where the rest is


@dataclass
class Text:
    lines: list[str]
    style: Literal["plain", "verdict", "note", "error", "critical", "warning"] = "plain"
    rank: int = DETAIL  # how long it stays on a screen too small for everything (fit_screen)


Block = Table | Text


@dataclass
class Output:
    """A result, as data: ``blocks`` for people, ``data`` for JSON, and the other forms a
    view has. Each is built only when its format is asked for, and only :func:`render` knows
    which format takes which (a view never sees the format's name).

    ``items`` names a list that JSON output streams after the keys of ``data``, one item at a
    time, so a hundred thousand locks never sit in memory as JSON-ready dicts all at once.
    """

    blocks: Callable[[], list[Block]]
    data: Callable[[], Any]  # None: nothing to say in JSON (an error said on stderr)
    items: tuple[str, Callable[[], Iterable[Any]]] | None = None
    # for a terminal, when it differs: given the screen's (columns, lines), 0 when not a tty
    screen: Callable[[int, int], list[Block]] | None = None
    # for a ticket or a spreadsheet (markdown, csv), when it differs: tables in place of
    # trees and folded rows, every row kept
    document: Callable[[], list[Block]] | None = None
    status: Callable[[], str] | None = None  # a monitoring plugin's one line (nagios)
    metrics: Callable[[], list[str]] | None = None  # the Prometheus text exposition


# what a terminal does not show as itself: control characters (Unicode category Cc), line and
# paragraph separators (Zl, Zp), formatting characters (Cf, as of Unicode 15.1: the soft
# hyphen, zero-width spaces and joiners, direction marks, embeddings, overrides and isolates,
# the byte order mark, tags) and surrogates (Cs, which no output can encode); a test checks
# the list against the running Python's unicodedata
_INVISIBLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    r"\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0001\U000e0020-\U000e007f]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def clean(text: str | None) -> str:
    """A server-provided string made safe to print: no escape sequences, no line breaks,
    nothing invisible. Each such character is written as Python writes it in a string
    literal (``\\x07``, ``\\u200b``; ``\\n``, ``\\e``...), so it can be seen and looked up."""
    if not text:
        return ""
    if text.isprintable():  # the common case, checked in C: no Cc, Cf, Cs, Zl, Zp in it
        return text
    return _INVISIBLE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code <= 0xFF:
        return _NAMED.get(char) or f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def resolve(fmt: str, stream: TextIO) -> Format:
    if fmt == "auto":
        return "table" if stream.isatty() else "plain"
    return fmt  # type: ignore[return-value]


def render(output: Output, fmt: str = "auto", stream: TextIO | None = None) -> None:
    """The one place that maps ``--format`` to a renderer."""
    stream = stream or sys.stdout
    RENDERERS[resolve(fmt, stream)](output, stream)


def _plain(output: Output, stream: TextIO) -> None:
    """Plain text written as it is made, CHUNK lines at a time: a table of a hundred thousand
    locks is never one string (nor a list of its lines) in memory."""
    lines = plain_lines(output.blocks())
    while chunk := list(islice(lines, CHUNK)):
        stream.write("\n".join(chunk) + "\n")


CHUNK = 4096  # lines of plain text written at a time


def _markdown(output: Output, stream: TextIO) -> None:
    stream.write(markdown((output.document or output.blocks)()))


def _status(output: Output, stream: TextIO) -> None:
    if output.status is None:
        raise ValueError("this result has no status line")
    stream.write(output.status() + "\n")


def _metrics(output: Output, stream: TextIO) -> None:
    if output.metrics is None:
        raise ValueError("this result has no metrics")
    stream.write("".join(f"{line}\n" for line in output.metrics()))


def _json(output: Output, stream: TextIO) -> None:
    """JSON by orjson. Items (a hundred thousand locks) are streamed one at a time, each
    already encoded by its view when it is bytes, and written in large chunks; a terminal gets
    the whole document indented."""
    import orjson

    head = output.data()
    if head is None:
        return
    if output.items is None or stream.isatty():  # a terminal gets it whole and indented
        if output.items is not None:
            key, items = output.items
            head = {**head, key: [_decoded(item) for item in items()]}
        indent = orjson.OPT_INDENT_2 if stream.isatty() else 0
        stream.write(orjson.dumps(head, option=indent).decode() + "\n")
        return
    key, items = output.items
    opening = orjson.dumps(head)[:-1]
    chunks = [opening, b"," if head else b"", orjson.dumps(key), b":["]
    raw = getattr(stream, "buffer", None)
    for index, item in enumerate(items()):
        if index:
            chunks.append(b",")
        chunks.append(item if isinstance(item, bytes) else orjson.dumps(item))
        if len(chunks) > 4096:
            _write(stream, raw, chunks)
    chunks.append(b"]}\n")
    _write(stream, raw, chunks)


def _write(stream: TextIO, raw: Any, chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    chunks.clear()
    if raw is not None:
        stream.flush()
        raw.write(data)
    else:
        stream.write(data.decode())


def _decoded(item: Any) -> Any:
    import orjson

    return orjson.loads(item) if isinstance(item, bytes) else item


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


_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>#!|~])")


def md_escape(text: str) -> str:
    """A server string made inert in Markdown: pipes cannot end a cell, backticks cannot open
    code, brackets and stars cannot make links or emphasis."""
    return _MARKDOWN.sub(r"\\\1", text)


def markdown(blocks: list[Block]) -> str:
    """GitHub-flavoured Markdown for incident channels and tickets: verdicts as bold lines,
    other text in a fenced block, tables as pipe tables (tabulate's "github" format), every
    server string escaped. Every row is kept."""
    from tabulate import tabulate

    parts: list[str] = []
    fenced: list[str] = []  # consecutive text lines share one fenced block

    def close() -> None:
        if fenced:
            longest = max((len(run) for line in fenced for run in re.findall("`+", line)),
                          default=0)  # fmt: skip
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


def _csv(output: Output, stream: TextIO) -> None:
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


# what makes a spreadsheet (Excel, LibreOffice, Google Sheets) read a cell as a formula: a
# tab or a carriage return first, or = + - @ after any whitespace (" =1+1", "\u00a0=1+1")
_FORMULA = re.compile(r"[\t\r]|\s*[=+\-@]")
_PLAIN_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows and never executes (OWASP's "CSV injection"): a
    text cell that begins with ``=``, ``+``, ``-``, ``@`` (after any Unicode whitespace), a
    tab or a carriage return gets a single quote ``'`` in front (``=HYPERLINK(...)`` is
    written ``'=HYPERLINK(...)``), unless it is entirely a plain decimal number (an optional
    sign, ASCII digits, an optional fraction: ``-12``, ``+3``, ``-0.5``), which a spreadsheet
    reads as that number. Every other text cell, and a value that is not text (an int or a
    float: keys, pids and counts, negative ones too), is written as it is."""
    if (
        isinstance(value, str)
        and not value[:1].isalnum()  # nearly every cell, told apart in C
        and _FORMULA.match(value)
        and not _PLAIN_NUMBER.fullmatch(value)
    ):
        return "'" + value
    return value


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
    formatted once (the same text: ``{:<w}`` is ``ljust``, the last cell is not padded)."""
    column, items = rows.column, rows.items
    shared = {id(row): row for _, row in items}
    shared[id(headers)] = headers
    widths = [max(map(len, cells)) for cells in zip(*shared.values(), strict=True)]
    widths[column] = max(len(headers[column]), max((len(cell) for cell, _ in items), default=0))
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
        yield (ends[0] + cell.ljust(width) + ends[1]).rstrip()


def _rich(output: Output, stream: TextIO) -> None:
    from rich.console import Console

    console = Console(file=stream, highlight=False, soft_wrap=False)
    lines = console.height if stream.isatty() else 0
    blocks = output.screen(console.width, lines) if output.screen else output.blocks()
    if lines:  # a screenful, and the shell's prompt after it
        blocks = fit_screen(blocks, console.width, lines - 1)
    for renderable in rich_renderables(blocks, console):
        console.print(renderable)


RENDERERS: dict[Format, Callable[[Output, TextIO], None]] = {
    "table": _rich,
    "plain": _plain,
    "json": _json,
    "markdown": _markdown,
    "csv": _csv,
    "nagios": _status,
    "prometheus": _metrics,
}


# -- a screenful -------------------------------------------------------------------------------

CUT = "(cut to fit the screen: --format plain | less shows all)"


@dataclass
class Plan:
    """What of some blocks fits a screen: the lines kept of each text block and the rows
    kept of each table (indexes), by the block's position; whether text was cut."""

    kept: dict[int, list[str]]
    rows: dict[int, list[int]]
    cut: bool


def fit_screen(blocks: list[Block], columns: int, lines: int, cut: str | None = CUT) -> list[Block]:
    """``blocks`` cut to ``lines`` screen lines ``columns`` wide (see :func:`plan_screen`), the
    tables to their rows kept (saying how many they left out), ``cut`` said when text was."""
    return apply_plan(blocks, plan_screen(blocks, columns, lines, cut), cut)


def plan_screen(blocks: list[Block], columns: int, lines: int, cut: str | None = CUT) -> Plan:
    """What of ``blocks`` fits ``lines`` lines ``columns`` wide, counted as rich draws them (a
    text line wrapped between words, a table row on one line, a table's title, header, rule,
    legend and "more rows" line). What does not fit gives way by rank, the highest first and
    the last on screen first: DETAIL lines, then table rows, the least important first and
    one kept in each table, then STEP lines (the worst cause's impact and next step). VERDICT
    lines always stay. When a text line gives way, ``cut`` takes one line at the end."""
    kept = {i: list(b.lines) for i, b in enumerate(blocks) if isinstance(b, Text)}
    rows = {i: list(range(len(b.rows))) for i, b in enumerate(blocks) if isinstance(b, Table)}
    heights: dict[str, int] = {}

    def height_of(line: str) -> int:
        found = heights.get(line)
        if found is None:
            found = heights[line] = text_height([line], columns)
        return found

    def used(was_cut: bool) -> int:
        total = height_of(cut) if was_cut and cut else 0
        for i, block in enumerate(blocks):
            if isinstance(block, Text):
                total += sum(map(height_of, kept[i]))
            else:
                total += table_height(block, rows[i], columns)
        return total

    was_cut = False
    while (over := used(was_cut) - lines) > 0:
        texts = [(b.rank, i) for i, b in enumerate(blocks) if isinstance(b, Text) and kept[i]]
        texts = [(rank, i) for rank, i in texts if rank != VERDICT]
        tables = [i for i, shown in rows.items() if len(shown) > 1]
        rank = max([r for r, _ in texts] + ([ROWS] if tables else []), default=None)
        if rank is None:
            break  # only what always stays: it scrolls
        if rank == ROWS and not any(r == ROWS for r, _ in texts):
            # the table with most rows gives up what is over (one row always stays)
            widest = max(tables, key=lambda i: len(rows[i]))
            block = blocks[widest]
            assert isinstance(block, Table)
            important = block.important or [0] * len(block.rows)
            budget = max(1, len(rows[widest]) - over)
            rows[widest] = pick(important, budget)
            # fewer rows may explain fewer flags: then one more while it fits
            while budget < len(block.rows):
                fewer, rows[widest] = rows[widest], pick(important, budget + 1)
                if used(was_cut) > lines:
                    rows[widest] = fewer
                    break
                budget += 1
            continue
        last = max(i for r, i in texts if r == rank)
        kept[last].pop()
        was_cut = True
    return Plan(kept, rows, was_cut)


def apply_plan(blocks: list[Block], plan: Plan, cut: str | None = CUT) -> list[Block]:
    """The blocks as ``plan`` keeps them."""
    out: list[Block] = []
    for i, block in enumerate(blocks):
        if isinstance(block, Text):
            if plan.kept[i] or not block.lines:
                out.append(replace(block, lines=plan.kept[i]))
            continue
        out.append(_subset(block, plan.rows[i]))
    if plan.cut and cut:
        out.append(Text([cut], "note", VERDICT))
    return out


def _subset(block: Table, chosen: list[int]) -> Table:
    if len(chosen) == len(block.rows):
        return block
    compact = block.compact
    return replace(
        block,
        rows=[block.rows[i] for i in chosen],
        important=[block.important[i] for i in chosen] if block.important else None,
        left_out=block.left_out + len(block.rows) - len(chosen),
        compact=(lambda i: compact(chosen[i])) if compact is not None else None,
    )


def table_height(block: Table, chosen: list[int], columns: int) -> int:
    """Screen lines a table takes with the rows ``chosen``."""
    title = 1 if block.title else 0
    if not block.rows:
        return title + 1  # its "empty" line
    left_out = block.left_out + len(block.rows) - len(chosen)
    form, explained = layout(block, chosen, columns)
    head = 0 if isinstance(form, list) else 2  # one line a row has no header nor rule
    return title + head + len(chosen) + text_height(explained, columns) + (1 if left_out else 0)


def layout(
    block: Table, chosen: list[int], columns: int
) -> tuple[tuple[list[int], list[list[str]], list[int]] | list[str], list[str]]:
    """The table's form on a screen (:func:`fit`), and its legend: the meaning of each word
    of a words column that a shown row shows whole (a word cut or beyond the edge is not)."""
    form = fit(block, chosen, columns)
    if not block.legend:
        return form, []
    if isinstance(form, list):  # one line a row, cut at the screen's edge
        texts = [line if len(line) <= columns else line[: columns - 1] for line in form]
    else:
        shown, cells, _ = form
        texts = [cell for row in cells for c, cell in zip(shown, row, strict=True)
                 if c in block.words]  # fmt: skip
    seen = {word for text in texts for word in _WORDS.split(text)}
    return form, [f"{word}: {meaning}" for word, meaning in block.legend.items() if word in seen]


_WORDS = re.compile(r"[\s,\[\]]+")


def text_height(lines: Iterable[str], width: int) -> int:
    """Screen lines these text lines take on a screen ``width`` columns wide, wrapped between
    words as rich wraps them (a long word folded)."""
    width = max(1, width)
    return sum(_wrapped_height(line, width) if len(line) > width else 1 for line in lines)


def _wrapped_height(line: str, width: int) -> int:
    import textwrap

    return max(1, len(textwrap.wrap(line, width, break_on_hyphens=False, replace_whitespace=False)))


def rich_renderables(blocks: list[Block], console: Console) -> list[Any]:
    """Blocks as rich renderables for a screen of ``console``'s width, every row of every
    table (:func:`fit_screen` first, to fit a screen's height). Text lines wrap between words;
    tables keep their essential columns whole, the rest give way (see :func:`fit`)."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text as RichText

    styles = {"plain": "", "verdict": "bold", "note": "yellow", "error": "bold red",
              "critical": "bold red", "warning": "yellow"}  # fmt: skip
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, Text):
            out += [RichText(text, style=styles[block.style]) for text in block.lines]
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
                box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False,
            )  # fmt: skip
            for column, width in zip(columns, widths, strict=True):
                table.add_column(
                    block.headers[column], no_wrap=True, overflow="ellipsis",
                    min_width=width, max_width=width,
                )  # fmt: skip
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
                    style="yellow", no_wrap=True, overflow="ellipsis",
                )
            )  # fmt: skip
    return out


GAP = 2  # between two columns: one of padding, the box's blank separator
SHORTEST = 16  # a column that may be cut keeps this much (words: 4 more), else one line a row


def fit(
    block: Table, chosen: list[int], width: int
) -> tuple[list[int], list[list[str]], list[int]] | list[str]:
    """The table for a screen ``width`` wide: its columns, cells and widths; or, when its
    essential columns cannot stand side by side with the useful ones, one line per row (the
    block's ``compact`` form). Columns empty on every shown row go first, then the optional
    ones in their order; then the columns that may be cut give way, never below SHORTEST;
    essential columns are never dropped nor cut."""
    rows = [block.rows[i] for i in chosen]
    keep = [
        c for c in range(len(block.headers))
        if c in block.essential or any(row[c] for row in rows)
    ]  # fmt: skip

    def natural(c: int) -> int:
        size = max([len(block.headers[c]), *(len(row[c]) for row in rows)])
        return min(size, ELLIPSIS_WIDTH) if c in block.wide or c in block.words else size

    def total(columns: list[int], widths: dict[int, int]) -> int:
        return sum(widths[c] for c in columns) + GAP * (len(columns) - 1)

    widths = {c: natural(c) for c in keep}
    for column in block.optional:
        if total(keep, widths) <= width:
            break
        if column in keep and column not in block.essential:
            keep.remove(column)
    cuttable = [
        c for c in keep if (c in block.wide or c in block.words) and c not in block.essential
    ]
    least = {c: max(len(block.headers[c]), min(widths[c], SHORTEST + 4 * (c in block.words)))
             for c in cuttable}  # fmt: skip
    while total(keep, widths) > width:
        shrinkable = [c for c in cuttable if widths[c] > least[c]]
        widest = max(shrinkable, key=lambda c: widths[c], default=None)
        if widest is None:
            break
        widths[widest] -= 1
    if total(keep, widths) > width and block.compact is not None:
        return [block.compact(i) for i in chosen]
    cells = [[_cut(row[c], widths[c], c in block.words) for c in keep] for row in rows]
    return keep, cells, [widths[c] for c in keep]


def _one_line(text: str, width: int, style: str = "") -> Any:
    from rich.text import Text as RichText

    line = RichText(text, style=style, no_wrap=True, overflow="ellipsis")
    line.truncate(width, overflow="ellipsis")
    return line


def _cut(cell: str, width: int, words: bool) -> str:
    """A cell shortened to ``width``: between comma-separated words with "+N" for the rest,
    or with an ellipsis."""
    if len(cell) <= width:
        return cell
    if words:
        parts = cell.split(",")
        for shown in range(len(parts) - 1, 0, -1):
            text = ",".join(parts[:shown]) + f" +{len(parts) - shown}"
            if len(text) <= width:
                return text
        return f"+{len(parts)}" if len(f"+{len(parts)}") <= width else "…"
    return cell[: max(0, width - 1)] + "…"


def pick(important: Sequence[int], budget: int) -> list[int]:
    """The indexes of at most ``budget`` rows: the most important first (the higher, the
    more), then the others, each kept in their original order, returned in that order. A
    caller with many rows picks before it builds them."""
    if len(important) <= budget:
        return list(range(len(important)))
    ranked = sorted(range(len(important)), key=lambda i: -important[i])  # stable
    return sorted(ranked[:budget])
