"""A result as data: the blocks a view hands over (tables and text), the :class:`Output` that
names the forms it has, and the ranks that say what a small screen keeps."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, overload

Format = Literal["table", "plain", "json", "markdown", "csv", "nagios", "prometheus"]

# what a screen keeps (see fit_screen): a VERDICT line always; then the worst cause's impact and
# next step (STEP); then table rows (ROWS); DETAIL lines give way first
VERDICT, STEP, ROWS, DETAIL = 0, 1, 2, 3
MORE_ROWS = "--format plain or json gives every row"


class Items(bytes):
    """Several items of an Output's streamed list, each encoded, joined by commas (a dump's
    run of one backend's locks, made in one go)."""


class Cells(NamedTuple):
    """The differing cells of consecutive rows of :class:`SharedRows` that share the rest (a
    dump's run of one backend's locks), made when they are written: ``rows`` of them, none
    wider than ``width``."""

    make: Callable[[], Iterable[str]]
    rows: int
    width: int


class SharedRows(Sequence[list[str]]):
    """A table's rows where most differ from a row they share in one column only (the many
    locks of one backend: every cell but the lock's name is the backend's). Each is kept as
    that cell and the shared row, made whole only when a row is asked for; plain text aligns
    them without making any (see :mod:`lockdiag.render.text`). A run of such rows may come
    as :class:`Cells`, its cells made only as they are written."""

    def __init__(self, column: int) -> None:
        self.column = column  # the column that differs
        # (its cell, the row it goes into), or (the cells of several rows, the row they go into)
        self.items: list[tuple[str | Cells, list[str]]] = []
        self.more = 0  # rows beyond one per item: the Cells' others
        self._rows: list[tuple[str | Cells, list[str]]] | None = None  # see _single

    def add(self, cell: str, shared: list[str]) -> None:
        self.items.append((cell, shared))

    def add_cells(self, cells: Cells, shared: list[str]) -> None:
        self.items.append((cells, shared))
        self.more += cells.rows - 1

    def __len__(self) -> int:
        return len(self.items) + self.more

    def __iter__(self) -> Iterator[list[str]]:
        for cell, shared in self.items:
            if isinstance(cell, str):
                yield self._whole(cell, shared)
            else:
                yield from (self._whole(one, shared) for one in cell.make())

    @overload
    def __getitem__(self, index: int) -> list[str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[str]]: ...
    def __getitem__(self, index: int | slice) -> list[str] | list[list[str]]:
        items = self._single() if self.more else self.items  # made once, then kept
        if isinstance(index, slice):
            return [self._whole(*item) for item in items[index]]
        return self._whole(*items[index])

    def _single(self) -> list[tuple[str | Cells, list[str]]]:
        """Every row as its own item (a form that picks rows by index), made once."""
        if self._rows is None or len(self._rows) != len(self):
            self._rows = [
                (one, shared)
                for cell, shared in self.items
                for one in ([cell] if isinstance(cell, str) else cell.make())
            ]
        return self._rows

    def _whole(self, cell: str | Cells, shared: list[str]) -> list[str]:
        assert isinstance(cell, str)  # _single() made every row its own
        row = list(shared)
        row[self.column] = cell
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
    group: str | None = None  # blocks a screen counts when it leaves lines of them out (More)


@dataclass(frozen=True)
class More:
    """How a screen says what it left out of a group of text blocks (the causes of `watch`),
    as a table says its rows: ``template`` with ``{n}``, the lines left out, ``before`` of
    them by the view itself (a cap), the rest by the screen."""

    template: str
    before: int = 0


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
