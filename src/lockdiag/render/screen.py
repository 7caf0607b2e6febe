"""A screenful: what of a result fits a terminal's lines (:func:`plan_screen`) and how a table
fits its columns (:func:`fit`), counted as rich draws them; pure, no rich imported."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from lockdiag.render.model import ROWS, VERDICT, Block, More, Table, Text

ELLIPSIS_WIDTH = 60  # plain text keeps long cells whole; tables on a terminal cut them

CUT = "(cut to fit the screen: --format plain | less shows all)"


@dataclass
class Plan:
    """What of some blocks fits a screen: the lines kept of each text block and the rows
    kept of each table (indexes), by the block's position; whether text was cut."""

    kept: dict[int, list[str]]
    rows: dict[int, list[int]]
    cut: bool


def fit_screen(
    blocks: list[Block],
    columns: int,
    lines: int,
    cut: str | None = CUT,
    more: Mapping[str, More] | None = None,
) -> list[Block]:
    """``blocks`` cut to ``lines`` screen lines ``columns`` wide (see :func:`plan_screen`), the
    tables to their rows kept (saying how many they left out), each group of text blocks of
    ``more`` too (one line after the group: how many of its lines are not shown), ``cut``
    said when other text was."""
    more = more or {}
    return apply_plan(blocks, plan_screen(blocks, columns, lines, cut, more), cut, more)


def plan_screen(
    blocks: list[Block],
    columns: int,
    lines: int,
    cut: str | None = CUT,
    more: Mapping[str, More] | None = None,
) -> Plan:
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
        for line in _more_lines(blocks, kept, more or {}).values():
            total += height_of(line)
        for i, block in enumerate(blocks):
            if isinstance(block, Text):
                total += sum(map(height_of, kept[i]))
            else:
                total += table_height(block, rows[i], columns)
        return total

    was_cut = False
    grouped = {i for i, b in enumerate(blocks) if isinstance(b, Text) and b.group in (more or {})}
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
        was_cut = was_cut or last not in grouped  # a group says so itself
    return Plan(kept, rows, was_cut)


def _more_lines(
    blocks: list[Block], kept: Mapping[int, list[str]], more: Mapping[str, More]
) -> dict[int, str]:
    """For each group of ``more`` some of whose lines are left out: the line that says so,
    by the position of the group's last block."""
    found: dict[int, str] = {}
    for group, how in more.items():
        members = [i for i, b in enumerate(blocks) if isinstance(b, Text) and b.group == group]
        left = how.before + sum(len(_lines(blocks[i])) - len(kept[i]) for i in members)
        if members and left:
            found[members[-1]] = how.template.format(n=left)
    return found


def _lines(block: Block) -> list[str]:
    return block.lines if isinstance(block, Text) else []


def apply_plan(
    blocks: list[Block],
    plan: Plan,
    cut: str | None = CUT,
    more: Mapping[str, More] | None = None,
) -> list[Block]:
    """The blocks as ``plan`` keeps them, each group of ``more`` followed by what it left out."""
    counted = _more_lines(blocks, plan.kept, more or {})
    out: list[Block] = []
    for i, block in enumerate(blocks):
        if isinstance(block, Text):
            if plan.kept[i] or not block.lines:
                out.append(replace(block, lines=plan.kept[i]))
            if i in counted:
                out.append(Text([counted[i]], "note", VERDICT))
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
    title = text_height([block.title], columns) if block.title else 0  # it wraps as text does
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
        texts = [
            cell for row in cells for c, cell in zip(shown, row, strict=True) if c in block.words
        ]
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
        c for c in range(len(block.headers)) if c in block.essential or any(row[c] for row in rows)
    ]

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
    least = {
        c: max(len(block.headers[c]), min(widths[c], SHORTEST + 4 * (c in block.words)))
        for c in cuttable
    }
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
