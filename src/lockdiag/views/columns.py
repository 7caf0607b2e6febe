"""The column catalogue: every table column of every view, declared once.

A column names its header, the function that makes its cell, its priority and whether it may be
cut. The renderer decides what fits a screen: columns of priority ``OPTIONAL`` and above are
dropped when too wide, the highest priority first; columns that may be cut are shortened with
an ellipsis on a terminal (plain text keeps every cell whole). Essential columns (priority 1)
are never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from lockdiag.core.analysis import Flag, LockEntry
from lockdiag.core.model import ServerInfo
from lockdiag.durations import format_duration
from lockdiag.render import Table, clean
from lockdiag.views.common import age, ago, lock_label, mode_text, pid_text, pool_text, relation

Row = TypeVar("Row")
ESSENTIAL, USEFUL, OPTIONAL = 1, 2, 3


@dataclass(frozen=True)
class Column(Generic[Row]):
    header: str
    cell: Callable[[Row], str]
    priority: int = USEFUL  # ESSENTIAL never dropped; OPTIONAL and above dropped, highest first
    cut: bool = False  # may be shortened with an ellipsis on a terminal
    style: str | None = None  # rich style of its cells
    words: bool = False  # comma-separated words (flags): cut between words, never inside one


def table(columns: Sequence[Column[Any]], cells: Sequence[list[str]], **options: Any) -> Table:
    """A Table of rows already made from ``columns`` (see :func:`cells_of`)."""
    optional = sorted(
        (i for i, c in enumerate(columns) if c.priority >= OPTIONAL),
        key=lambda i: -columns[i].priority,
    )
    return Table(
        [c.header for c in columns],
        cells,
        wide={i for i, c in enumerate(columns) if c.cut},
        optional=optional,
        styles={i: c.style for i, c in enumerate(columns) if c.style},
        essential={i for i, c in enumerate(columns) if c.priority == ESSENTIAL},
        words={i for i, c in enumerate(columns) if c.words},
        **options,
    )


def cells_of(columns: Sequence[Column[Row]], row: Row) -> list[str]:
    return [column.cell(row) for column in columns]


# -- cells of a lock entry's session --------------------------------------------------------


def application(entry: LockEntry) -> str:
    s = entry.session
    return clean(s.application_name) if s else ""


def user(entry: LockEntry) -> str:
    s = entry.session
    return clean(s.user) if s else ""


def client(entry: LockEntry) -> str:
    s = entry.session
    return clean(s.client) if s and s.client else ("local" if s and s.backend_start else "")


def state(entry: LockEntry) -> str:
    s = entry.session
    return clean(s.state) if s and s.state else ("hidden" if s and s.hidden else "")


def query(entry: LockEntry) -> str:
    s = entry.session
    return clean(s.query) if s else ""


def status(entry: LockEntry) -> str:
    return "held" if entry.lock.granted else "WAITING"


# the flag that matters most first: a cell of flags is cut between words from the right
FLAGS_FIRST = (
    *(Flag.OUTLIVED_CLIENT, Flag.STUCK_OWNER, Flag.MAX_HOLD, Flag.EXPECT_XACT),
    *(Flag.LONG_SESSION_LOCK, Flag.POOLED_SESSION_LOCK, Flag.UNREGISTERED),
)
FLAG_ORDER: dict[str, int] = {flag.value: rank for rank, flag in enumerate(FLAGS_FIRST)}


def flags(entry: LockEntry) -> str:
    return ",".join(sorted(entry.flags, key=lambda flag: FLAG_ORDER.get(flag, len(FLAG_ORDER))))


def folded_flags(entry: LockEntry) -> str:
    """A lock's flags for a line of a narrow screen: the one that matters most, and how many
    more (``[max-hold +2]``); the legend names them, a wide table lists them."""
    if not entry.flags:
        return ""
    named = flags(entry).split(",")
    return f"[{named[0]}{f' +{len(named) - 1}' if len(named) > 1 else ''}]"


# -- list: a row is (target, entry, server) ------------------------------------------------


class ListRow(NamedTuple):
    target: str | None
    entry: LockEntry
    server: ServerInfo


LIST_LOCK = Column[ListRow]("LOCK", lambda r: lock_label(r.entry, r.server), ESSENTIAL)
LIST_COLUMNS: list[Column[ListRow]] = [
    LIST_LOCK,
    Column("MODE", lambda r: mode_text(r.entry.lock.mode), 4),
    Column("STATUS", lambda r: status(r.entry), ESSENTIAL),
    Column("PID", lambda r: pid_text(r.entry.lock), ESSENTIAL),
    Column("APPLICATION", lambda r: application(r.entry), cut=True),
    Column("USER", lambda r: user(r.entry), 7),
    Column("CLIENT", lambda r: client(r.entry), 6, cut=True),
    Column("STATE", lambda r: state(r.entry), cut=True),
    Column("LIFETIME", lambda r: r.entry.lifetime or "", 3),
    Column("AGE", lambda r: age(r.entry)),
    Column("WAITS/BLOCKS", lambda r: relation(r.entry), cut=True),
    Column("FLAGS", lambda r: flags(r.entry), style="yellow", words=True),
]
# columns only some lock tables have, with the column they stand before
LIST_POOL = Column[ListRow]("POOL", lambda r: clean(pool_text(r.entry)), 5, cut=True)
LIST_DATABASE = Column[ListRow]("DATABASE", lambda r: clean(r.entry.database), 8)
LIST_TARGET = Column[ListRow]("TARGET", lambda r: clean(r.target), ESSENTIAL)


# -- who-holds: holders and waiters of one key ---------------------------------------------


def _now_ago(now: datetime, moment: datetime | None) -> str:
    return ago(now, moment) if moment else ""


class HolderRow(NamedTuple):
    entry: LockEntry
    now: datetime  # the snapshot's


def _state_since(r: HolderRow) -> str:
    if not r.entry.session:
        return ""
    since = _now_ago(r.now, _attr(r.entry, "state_change"))
    return (clean(_attr(r.entry, "state")) + " " + since).strip()


HOLDER_COLUMNS: list[Column[HolderRow]] = [
    Column("PID", lambda r: pid_text(r.entry.lock), ESSENTIAL),
    Column("MODE", lambda r: mode_text(r.entry.lock.mode), 5),
    Column("APPLICATION", lambda r: application(r.entry), cut=True),
    Column("USER", lambda r: user(r.entry), 10),
    Column(
        "CLIENT", lambda r: clean(r.entry.session.client) if r.entry.session else "", 6, cut=True
    ),
    Column("POOL", lambda r: clean(pool_text(r.entry)), 8, cut=True),
    Column("DATABASE", lambda r: clean(r.entry.database), 9),
    Column("CONNECTED", lambda r: _now_ago(r.now, _attr(r.entry, "backend_start")), 7),
    Column("STATE", _state_since, cut=True),
    Column("XACT START", lambda r: _now_ago(r.now, _attr(r.entry, "xact_start")) or "-", 4),
    Column("LIFETIME", lambda r: r.entry.lifetime or ""),
    Column("HELD", lambda r: age(r.entry)),
    Column("FLAGS", lambda r: flags(r.entry), words=True),
    Column("QUERY", lambda r: query(r.entry), 3, cut=True),
]


def holder_line(r: HolderRow) -> str:
    """A holder on one line, for a narrow screen."""
    parts = [
        pid_text(r.entry.lock),
        f"held {age(r.entry)} · {r.entry.lifetime or '?'}",
        f"[{flags(r.entry)}]" if r.entry.flags else "",
        application(r.entry),
        _state_since(r),
        query(r.entry),
    ]
    return "  ".join(part for part in parts if part)


def _attr(entry: LockEntry, name: str) -> Any:
    return getattr(entry.session, name) if entry.session else None


class WaiterRow(NamedTuple):
    position: int
    entry: LockEntry


WAITER_COLUMNS: list[Column[WaiterRow]] = [
    Column("#", lambda r: str(r.position), ESSENTIAL),
    Column("PID", lambda r: pid_text(r.entry.lock), ESSENTIAL),
    Column("MODE", lambda r: mode_text(r.entry.lock.mode), 4),
    Column("APPLICATION", lambda r: application(r.entry), cut=True),
    Column("USER", lambda r: user(r.entry), 6),
    Column(
        "CLIENT", lambda r: clean(r.entry.session.client) if r.entry.session else "", 5, cut=True
    ),
    Column("WAITING", lambda r: age(r.entry)),
    Column("BLOCKED BY", lambda r: relation(r.entry), cut=True),
    Column("QUERY", lambda r: query(r.entry), 3, cut=True),
]


def waiter_line(r: WaiterRow) -> str:
    """A waiter on one line, for a narrow screen."""
    parts = [
        f"#{r.position}",
        pid_text(r.entry.lock),
        application(r.entry),
        age(r.entry),
        relation(r.entry),
        query(r.entry),
    ]
    return "  ".join(part for part in parts if part)


# -- watch: a row is an entry with what the refreshes saw of it --------------------------


class WatchRow(NamedTuple):
    entry: LockEntry
    server: ServerInfo
    mark: str  # "+" when it appeared at this refresh
    seen: float | None  # seconds it has been seen, from the second refresh on
    label: str = ""  # a folded row's ("3000 x invoice_pdf_export 20000..22999"), else its lock's


def watch_label(r: WatchRow) -> str:
    return r.label or lock_label(r.entry, r.server)


def watch_line(r: WatchRow) -> str:
    """A lock of the live view on one line, for a narrow screen: the verdict first (as
    `list`'s: the name, whom it blocks or waits for), then its flags folded."""
    entry = r.entry
    seen = f"seen {format_duration(r.seen)}" if r.seen else ""
    parts = [
        f"{r.mark}{entry.lock.pid}",
        f"{status(entry)} {age(entry)}",
        watch_label(r),
        relation(entry),
        folded_flags(entry),
        seen,
        application(entry),
    ]
    return "  ".join(part for part in parts if part.strip())


WATCH_COLUMNS: list[Column[WatchRow]] = [
    Column("", lambda r: r.mark, ESSENTIAL),
    Column("LOCK", watch_label, ESSENTIAL),
    Column("STATUS", lambda r: status(r.entry), ESSENTIAL),
    Column("PID", lambda r: str(r.entry.lock.pid), ESSENTIAL),
    Column("APPLICATION", lambda r: application(r.entry), 3, cut=True),
    Column("STATE", lambda r: clean(r.entry.session.state) if r.entry.session else "", 4),
    Column("LIFETIME", lambda r: r.entry.lifetime or "", 5),
    Column("AGE", lambda r: age(r.entry)),
    Column("SEEN", lambda r: f"seen {format_duration(r.seen)}" if r.seen else ""),
    Column("WAITS/BLOCKS", lambda r: relation(r.entry), cut=True),
    Column("FLAGS", lambda r: flags(r.entry), words=True),
]
