"""The three formats a server writes its log in: ``stderr`` (each line opening with a
``log_line_prefix``, detected from the first lines or given), ``csvlog`` and ``jsonlog``
(PostgreSQL 15+): telling them apart, the prefix's regular expressions (and where a session's
lock lines split, learnt), a stderr entry as its lines are joined, and a csvlog or jsonlog
record's fields. Imports ``messages`` and ``lockdiag.errors``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from typing import Literal

import orjson

from lockdiag.errors import InputError
from lockdiag.logs.messages import (
    DIGIT,
    PID_MAX,
    TEXT_MAX,
    Entry,
    Identity,
    WaitMessage,
    identity_of,
    parse_time,
)

LogFormat = Literal["stderr", "csvlog", "jsonlog"]
SPLITS_KEPT = 50_000  # sessions whose lock lines' split is remembered (Splits)
SPLIT_TEXT_MAX = 512  # characters from a pid to its message remembered (names: 63 bytes each)


class NotALog(InputError):
    """The stream is not a PostgreSQL log in any format lockdiag reads."""


# every value bounded: names are at most 63 bytes (NAMEDATALEN), host names NI_MAXHOST (1025)
_VALUE = r"[^\t]{0,1100}?"
_ZONE = r"(?: [^\s\]]{1,64}?)?"  # the shortest the text after it allows
_SECONDS = rf"{DIGIT}{{4}}-{DIGIT}{{2}}-{DIGIT}{{2}} {DIGIT}{{2}}:{DIGIT}{{2}}:{DIGIT}{{2}}"
_ESCAPES = {
    "m": rf"(?P<time>{_SECONDS}\.{DIGIT}+{_ZONE})",
    "t": rf"(?P<time>{_SECONDS}{_ZONE})",
    "n": rf"(?P<time>{DIGIT}+\.{DIGIT}+)",
    "s": rf"{_SECONDS}{_ZONE}",
    "p": rf"(?P<pid>{DIGIT}{{1,10}})",  # an int: a longer one is no pid (the line is not read)
    "u": rf"(?P<user>{_VALUE})",
    "d": rf"(?P<database>{_VALUE})",
    "a": rf"(?P<application>{_VALUE})",
    "l": r"\d+",
    "c": r"[0-9a-f]+\.[0-9a-f]+",
    "v": r"[\d/]*",
    "x": r"\d+",
    "e": r"[0-9A-Z]{5}",
    "P": r"\d*",
    "Q": r"-?\d+",
}  # the others (%r %h %L %i %b and any new letter): _VALUE
_SEVERITY = r"(?P<severity>[^\W\d_][\w ]{0,30}?):  (?P<text>.*)"

# the layouts met most: PostgreSQL's default, Debian's, pgBadger's advice, RDS, Heroku-like
COMMON_PREFIXES = (
    "%m [%p] %q%u@%d/%a ",
    "%m [%p] %q%u@%d ",
    "%m [%p] ",
    "%t [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h ",
    "%t [%p]: user=%u,db=%d,app=%a,client=%h ",
    "%t [%p]: [%l-1] ",
    "%m [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h ",
    "%t:%r:%u@%d:[%p]:",
    "%m:%r:%u@%d:[%p]:",
    "%m [%p] %q[user=%u,db=%d,app=%a] ",
    "%t [%p] ",
    "%m %u@%d [%p] ",
    "%m [%p-%l] %q%u@%d ",
    "%t [%p-%l] %q%u@%d ",
)


def prefix_pattern(prefix: str) -> re.Pattern[str]:
    """A regular expression for lines written with ``log_line_prefix`` = ``prefix``.

    ``%q`` ends the prefix of a process that is not a session (postmaster, checkpointer):
    what follows it is optional. Each value is matched up to the text that follows it."""
    return re.compile(_timeless(prefix) + _prefix_regex(prefix, whole=True))


def pid_pattern(prefix: str) -> re.Pattern[str]:
    """The prefix up to its process id only: the cheap test every line of a large log gets
    (the values after it, such as %a, need a search that costs more)."""
    return re.compile(_timeless(prefix) + _prefix_regex(prefix, whole=False))


def _timeless(prefix: str) -> str:
    """For a prefix with no time (%m, %t or %n): a time group that never matches, so that its
    lines are read as entries without a time (a missing group was an IndexError)."""
    letters = {found.group(2) for found in re.finditer(r"%(-?\d+)?(.)", prefix)}
    return "" if letters & {"m", "t", "n"} else r"(?P<time>(?!))?"


def _prefix_regex(prefix: str, whole: bool) -> str:
    """Linear by construction, whatever the line: the prefix is cut into segments, a value
    and the text after it; each segment but the last is an atomic group (its value ends where
    the text after it first fits, and is never tried again), and every value's length is
    bounded, so the last value's search for the severity is too."""
    segments = [""]
    seen: set[str] = set()
    optional_from: int | None = None
    position = 0
    for found in re.finditer(r"%(-?\d+)?(.)", prefix):
        segments[-1] += re.escape(prefix[position : found.start()])
        position = found.end()
        padding, letter = found.groups()
        if letter == "%":
            segments[-1] += "%"
            continue
        if letter == "q":
            optional_from = len(segments)
            segments.append("")
            continue
        piece = _ESCAPES.get(letter, _VALUE)
        name = re.match(r"\(\?P<(\w+)>", piece)
        if name is not None:  # a value named twice is captured once
            if name.group(1) in seen:
                piece = "(?:" + piece[len(name.group(0)) :]
            seen.add(name.group(1))
        if padding:  # spaces before it; after it too, but a free value takes those as its own
            piece = rf" *+{piece}" + ("" if _VALUE in piece else " *")
        if letter == "p" and not whole and optional_from is None:
            return _atomic(segments) + piece
        segments.append(piece)
    segments[-1] += re.escape(prefix[position:])
    if optional_from is None:
        return _atomic(segments[:-1]) + segments[-1] + _SEVERITY
    optional = segments[optional_from:]
    return (  # "session": the part after %q, which a session's lines have (Splits)
        _atomic(segments[:optional_from])
        + f"(?P<session>{_atomic(optional[:-1])}{optional[-1]})?"
        + _SEVERITY
    )


def _atomic(segments: list[str]) -> str:
    return "".join(f"(?>{segment})" for segment in segments if segment)


class Splits:
    """Where a session's lock lines split into prefix values, severity and message, learnt
    from its last one read whole, so that its next ones are not read by the whole prefix
    pattern again (a wait is logged twice or more by its session: waiting, acquired).

    The time and the pid are read by the pid pattern, cheaper. Where the rest of a line
    splits is decided by its text from the pid's end to the message: each value ends where the
    text after it first fits (atomic) or is tried from the shortest, bounded, and the severity
    ends at the first ":  ", so no attempt of the pattern on a line it reads looks past that
    text. A line of the same pid with the same text there splits as the line learnt did, into
    the same values. Two conditions keep that true: the pid comes before %q (prefix_splits: the
    pid pattern is then the prefix pattern cut at the pid), and the line learnt had the part
    after %q (a line read without it, a postmaster's, may be so because a value of that part
    looked past its message for its end and found none: its split says nothing of the next).
    tests/test_log_fast_paths.py reads logs both ways."""

    __slots__ = ("_known", "_quick")

    def __init__(self, quick: Callable[[str], re.Match[str] | None]) -> None:
        self._quick = quick
        # the pid's text: the text from its end to the message, the severity, the pid, who,
        # and from the pid's end: where the message begins and where the severity does
        self._known: dict[str, tuple[str, str, int, Identity, int, int]] = {}

    def known(self, raw: str) -> tuple[int, str | None, str, str, str, Identity] | None:
        """pid, time, severity, message, the text before the severity and the session, of a
        line that splits as the last one of its pid learnt; None for another."""
        start = self._quick(raw)
        if start is None:
            return None
        pid_text, time = start.group("pid", "time")
        known = self._known.get(pid_text)
        if known is None:
            return None
        text, severity, pid, identity, message_at, severity_at = known
        pid_end = start.end()
        if not raw.startswith(text, pid_end):
            return None
        message = raw[pid_end + message_at :].rstrip("\r\n")
        return pid, time, severity, message, raw[: pid_end + severity_at], identity

    def learn(self, found: re.Match[str], identity: Identity) -> None:
        """A line read whole by the prefix pattern: how the next of its pid may split."""
        if "session" in found.re.groupindex and found.group("session") is None:
            return
        text = found.string[found.end("pid") : found.start("text")]
        if len(text) > SPLIT_TEXT_MAX:
            return  # longer than a server's values make it: read whole each time
        if len(self._known) >= SPLITS_KEPT:
            self._known.clear()  # bounded: the oldest sessions are forgotten together
        pid, severity = found.group("pid", "severity")
        severity_at = len(text) - len(severity) - 3  # the text ends with the severity and ":  "
        self._known[pid] = (text, severity, int(pid), identity, len(text), severity_at)


def prefix_splits(prefix: str) -> Splits | None:
    """Splits for a stderr log with ``prefix``, or None when its pid comes after %q or its
    time after its pid (the pid pattern, which Splits reads the time with, stops at the pid)."""
    quick = pid_pattern(prefix)
    cut = "severity" not in quick.groupindex and "time" in quick.groupindex
    return Splits(quick.match) if cut else None


def first_character(prefix: str) -> Callable[[str], bool]:
    """The cheap test of every line of a large stderr log: its first character is one the
    prefix can start with (a digit for %m, %t, %n, %p, %l; else the prefix's own character).
    Lines read whole (those about locks, the first ones, the samples) are checked whole."""
    if not prefix:
        return lambda first: bool(first.strip())
    if prefix[0] == "%" and len(prefix) > 1 and prefix[1] in "mtnspl":
        return str.isdigit
    if prefix[0] != "%":
        return lambda first: first == prefix[0]
    return lambda first: bool(first.strip())


CSV_HEAD = re.compile(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ [^,]*,(?:"[^"]*"|),')


def detect(head: list[str], prefix: str | None = None) -> tuple[LogFormat, str | None]:
    """The format of a log from its first lines, and for stderr the prefix that fits most."""
    lines = [line for line in head if line.strip()]
    if lines and lines[0].lstrip("\ufeff").startswith("{"):
        return "jsonlog", None
    if lines and CSV_HEAD.match(lines[0]):
        return "csvlog", None
    if not lines or prefix is not None:
        return "stderr", prefix
    starts = [line for line in lines if not line.startswith("\t")]
    best, best_count = None, 0
    for candidate in COMMON_PREFIXES:
        pattern = prefix_pattern(candidate)
        count = sum(1 for line in starts if _prefix_fits(pattern, line))
        if count > best_count:  # the first (most specific) layout wins a tie
            best, best_count = candidate, count
    if best is None:
        raise NotALog(
            "not a PostgreSQL log: no line is stderr with a known log_line_prefix, csvlog or "
            "jsonlog",
            hint="give the server's prefix: --prefix \"$(psql -Atc 'SHOW log_line_prefix')\"",
        )
    return "stderr", best


def _prefix_fits(pattern: re.Pattern[str], line: str) -> bool:
    found = pattern.match(line)
    return found is not None and found.group("pid") is not None


def csv_row(record: str) -> list[str] | None:
    try:
        row = next(csv.reader([record]), None)
    except csv.Error:
        return None
    if row is None or len(row) < 23:
        return None
    pid = row[3]  # an int of ASCII digits (isdigit() alone takes '²', which int() refuses)
    if not (0 < len(pid) <= 10 and pid.isascii() and pid.isdigit()) or int(pid) > PID_MAX:
        return None
    return row


def json_record(line: str) -> dict[str, object] | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    pid = record.get("pid")  # orjson reads an integer past 64 bits as a float
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 <= pid <= PID_MAX:
        return None
    return record


def json_identity(record: dict[str, object]) -> Identity:
    return identity_of(
        text_of(record.get("user")),
        text_of(record.get("dbname")),
        text_of(record.get("application_name")),
    )


def text_of(value: object) -> str | None:
    return value if isinstance(value, str) else None


def clip(value: object) -> str | None:
    """A DETAIL, STATEMENT or CONTEXT as kept: bounded (events are kept by the thousand)."""
    return value[:TEXT_MAX] if isinstance(value, str) and value else None


_new_tuple = tuple.__new__
_FIELDS = {"DETAIL": "detail", "STATEMENT": "statement", "CONTEXT": "context", "QUERY": "context"}


class Pending:
    """An entry of a stderr log still being read (its DETAIL and STATEMENT may follow).

    ``head`` is the line's text before its severity: the server writes an entry's lines in one
    go with the same prefix (elog.c send_message_to_server_log), so a line that starts with it
    continues this entry without the prefix read again (a prefix with %l differs: read whole).
    """

    __slots__ = (
        "context",
        "detail",
        "head",
        "identity",
        "line",
        "message",
        "pid",
        "severity",
        "size",
        "statement",
        "time",
        "wait",
        "where",
    )

    def __init__(
        self,
        head: str,
        time: str | None,
        severity: str,
        message: str,
        pid: int,
        identity: Identity,
        line: int,
        wait: WaitMessage | None,
    ) -> None:
        self.time, self.severity, self.wait = time, severity, wait
        self.pid, self.identity, self.line = pid, identity, line
        self.message = message[:TEXT_MAX]
        self.head, self.size = head, len(head)
        self.detail: str | None = None
        self.statement: str | None = None
        self.context: str | None = None
        self.where: str | None = "message"  # the field the next tab-continued line belongs to

    def add(self, severity: str, line: str, start: int = 0) -> bool:
        """A DETAIL, STATEMENT or CONTEXT line of this entry, its text from ``start``; False
        for others (HINT)."""
        where = _FIELDS.get(severity)
        if where is None:
            return False
        if where == "statement" and self.severity == "LOG":
            self.where = None  # a wait's statement is not reported: not kept
            return True
        setattr(self, where, line[start:].rstrip("\r\n")[:TEXT_MAX])
        self.where = where
        return True

    def extend(self, text: str) -> None:
        if self.where is None:
            return
        before = getattr(self, self.where) or ""
        if len(before) < TEXT_MAX:  # bounded: a statement of a million lines is cut
            setattr(self, self.where, f"{before}\n{text}"[:TEXT_MAX])

    def entry(self) -> Entry:
        # what Entry(...) does, without its generated __new__ in between (one per entry)
        return _new_tuple(
            Entry,
            (
                parse_time(self.time),
                self.pid,
                self.identity,
                self.severity,
                self.message,
                self.detail,
                self.statement,
                self.context,
                self.wait,
            ),
        )
