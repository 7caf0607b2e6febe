"""PostgreSQL's own log, read after the incident: lock waits, deadlocks and timeouts.

Pure: it reads a text stream it is given, one line at a time, and aggregates as it reads.
Memory is flat in the log's size: per key its totals and episodes, bounded in number (a log
where every wait is on its own key, such as ``transaction N``, folds the least waited keys into
one total per lock type, and keeps the episodes with the most wait); only the waits open at
once are held one by one.

The messages read are PostgreSQL's own (``src/backend/storage/lmgr/proc.c`` ProcSleep,
``deadlock.c`` DeadLockReport, ``postgres.c`` ProcessInterrupts, ``lmgr.c`` DescribeLockTag),
in English: a log written with another ``lc_messages`` is detected and said, never misread.
Three formats: ``stderr`` (with a ``log_line_prefix``, detected or given), ``csvlog`` and
``jsonlog`` (PostgreSQL 15+).
"""

from __future__ import annotations

import csv
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import chain, islice
from typing import IO, Literal, NamedTuple

import orjson

from lockdiag.core.analysis import Decoded, decode
from lockdiag.core.catalogue import Catalogue, build_catalogue
from lockdiag.errors import InputError
from lockdiag.keys import LockTriple
from lockdiag.registry import Registry

LogFormat = Literal["stderr", "csvlog", "jsonlog"]
Outcome = Literal[
    "acquired", "deadlock", "lock timeout", "statement timeout", "cancelled", "terminated",
    "no end logged",
]  # fmt: skip

DETECT_LINES = 200  # lines looked at to tell the format and the prefix
PID_MEMORY = 100_000  # sessions whose user and application are remembered (for holders)
LISTED_PIDS = 200  # holders and waiters kept by pid per episode; the rest are counted
KEPT_EVENTS = 1000  # deadlocks and timeouts kept in full; the rest are counted
KEPT_KEYS = 1000  # keys tallied one by one; past twice this, the least waited half is folded
KEPT_EPISODES = 1000  # episodes kept whole; past twice this, the closed ones least waited go
KEPT_TIMELINE = 10_000  # events of the --key timeline kept (the first); the rest are counted
CSV_FIELD_LIMIT = 64 * 2**20  # a logged statement can be megabytes long

ENGLISH_SEVERITIES = frozenset(
    ("LOG", "ERROR", "WARNING", "FATAL", "PANIC", "DETAIL", "HINT", "STATEMENT", "CONTEXT",
     "QUERY", "LOCATION", "NOTICE", "INFO", "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3", "DEBUG4",
     "DEBUG5")
)  # fmt: skip
CONTINUATIONS = frozenset(("DETAIL", "HINT", "STATEMENT", "CONTEXT", "QUERY", "LOCATION"))


class NotALog(InputError):
    """The stream is not a PostgreSQL log in any format lockdiag reads."""


class Identity(NamedTuple):
    user: str | None
    database: str | None
    application: str | None


class Entry(NamedTuple):
    """One log entry that may concern locks, its DETAIL, STATEMENT and CONTEXT joined."""

    time: datetime | None
    pid: int | None
    identity: Identity
    severity: str
    message: str
    detail: str | None = None
    statement: str | None = None
    context: str | None = None


# -- what the messages say ---------------------------------------------------------------------

_SECOND = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_DIGITS = re.compile(r"\d+")
# proc.c: "process %d still waiting for %s on %s after %ld.%03d ms" and its siblings
_WAIT_HEAD = (
    r"process (\d+) (still waiting for|acquired|avoided deadlock for|detected deadlock while "
    r"waiting for|could not obtain) (\S+) on "
)
_WAIT = re.compile(
    _WAIT_HEAD + r"(.+?)(?: by rearranging queue order)?(?: after (\d+(?:\.\d+)?) ms)?"
    r"(?: at character \d+)?$"
)
# the shape nearly every wait message has: its tag ends where the last " after " begins
_WAIT_AFTER = re.compile(_WAIT_HEAD + r"([^\n]+) after (\d+(?:\.\d+)?) ms$")
_REARRANGED = " by rearranging queue order"
_HOLDERS = re.compile(r"Process(?:es)? holding the lock: ([\d, ]*)[.,] Wait queue: [\d, ]*\.")
# a tag is short (lmgr.c DescribeLockTag): bounded, so that a crafted DETAIL costs linear time
_CYCLE = re.compile(r"Process (\d+) waits for (\S+) on (.{1,200}?); blocked by process (\d+)\.")
_QUERY = re.compile(r"Process (\d+): (.*)")
INTERESTING_ERRORS = {
    "deadlock detected": "deadlock",
    "canceling statement due to lock timeout": "lock timeout",
    "canceling statement due to statement timeout": "statement timeout",
    "canceling statement due to user request": "cancelled",
    "terminating connection due to administrator command": "terminated",
}
_WAIT_VERB = re.compile(
    " still waiting for | acquired | avoided deadlock | detected deadlock | could not obtain "
)


def parse_wait(message: str) -> tuple[str, str, str, str, str | None] | None:
    """A wait message's pid, verb, mode, tag and milliseconds, as ``_WAIT`` reads them.
    ``_WAIT``'s lazy tag tries its three optional endings at every character: the common shape
    ("... on <tag> after <n> ms") is read by ``_WAIT_AFTER`` first, at a third of the cost
    (the same parts: tests/test_log_bounds.py checks that the two agree)."""
    found = _WAIT_AFTER.match(message)
    if found is None or found.group(4).endswith(_REARRANGED):
        found = _WAIT.match(message)
    return None if found is None else found.groups()  # type: ignore[return-value]


def interesting(severity: str, message: str) -> bool:
    if severity == "LOG":
        return message.startswith("process ") and _WAIT_VERB.search(message) is not None
    return severity in ("ERROR", "FATAL") and message in INTERESTING_ERRORS


class LockTag(NamedTuple):
    """A lock as the log names it (lmgr.c DescribeLockTag), with the numbers it carries."""

    kind: str  # advisory, relation, tuple, page, extension, transaction, object, ...
    text: str
    database: int | None = None
    relation: int | None = None
    advisory: LockTriple | None = None


_TAGS: list[tuple[str, re.Pattern[str]]] = [
    ("advisory", re.compile(r"advisory lock \[(?P<db>\d+),(\d+),(\d+),(\d+)\]$")),
    ("relation", re.compile(r"relation (?P<rel>\d+) of database (?P<db>\d+)$")),
    ("tuple", re.compile(r"tuple \(\d+,\d+\) of relation (?P<rel>\d+) of database (?P<db>\d+)$")),
    ("page", re.compile(r"page \d+ of relation (?P<rel>\d+) of database (?P<db>\d+)$")),
    ("extension", re.compile(r"extension of relation (?P<rel>\d+) of database (?P<db>\d+)$")),
    ("transaction", re.compile(r"transaction \d+$")),
    ("virtual transaction", re.compile(r"virtual transaction \d+/\d+$")),
    ("object", re.compile(r"object \d+ of class \d+ of database (?P<db>\d+)$")),
]


@lru_cache(maxsize=4096)  # a busy log names the same few locks again and again
def parse_tag(text: str) -> LockTag:
    for kind, pattern in _TAGS:
        found = pattern.match(text)
        if found is None:
            continue
        named = found.groupdict()
        database = int(named["db"]) if named.get("db") else None
        relation = int(named["rel"]) if named.get("rel") else None
        if kind != "advisory":
            return LockTag(kind, text, database, relation)
        classid, objid, objsubid = (int(found.group(i)) for i in (2, 3, 4))
        if objsubid not in (1, 2) or classid >= 2**32 or objid >= 2**32:
            return LockTag("advisory (other)", text, database)  # not a key a function takes
        return LockTag(kind, text, database, None, LockTriple.of_row(classid, objid, objsubid))
    return LockTag("other", text)


def _pids(text: str) -> tuple[int, ...]:
    return tuple(map(int, text.replace(",", " ").split()))


@lru_cache(maxsize=1024)  # asked twice of each DETAIL (naming holders, then the tally)
def holders_of(detail: str) -> tuple[int, ...]:
    """The pids a wait's DETAIL lists as holding the lock."""
    listed = _HOLDERS.search(detail)
    return () if listed is None else _pids(listed.group(1))


@lru_cache(maxsize=1024)  # lines written in the same millisecond share their time
def parse_time(text: str | None) -> datetime | None:
    """The log's local time, without its zone (a log is written in one zone)."""
    if not text:
        return None
    moment = _second(text[:19])
    if moment is None:
        try:  # a date that is not one fails here too
            return datetime.fromtimestamp(float(text))  # %n: epoch seconds
        except (ValueError, OverflowError, OSError):
            return None
    fraction = _DIGITS.match(text, 20) if text[19:20] == "." else None
    if fraction is None:
        return moment
    return moment.replace(microsecond=int((fraction.group() + "000000")[:6]))


@lru_cache(maxsize=256)  # a log's lines share their second by the hundred: parsed once
def _second(whole: str) -> datetime | None:
    if _SECOND.fullmatch(whole) is None:
        return None
    try:
        return datetime.strptime(whole.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


# -- reading: stderr with a prefix, csvlog, jsonlog --------------------------------------------

# every value bounded: names are at most 63 bytes (NAMEDATALEN), host names NI_MAXHOST (1025)
_VALUE = r"[^\t]{0,1100}?"
_ZONE = r"(?: [^\s\]]{1,64}?)?"  # the shortest the text after it allows
_ESCAPES = {
    "m": rf"(?P<time>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+{_ZONE})",
    "t": rf"(?P<time>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d{_ZONE})",
    "n": r"(?P<time>\d+\.\d+)",
    "s": rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d{_ZONE}",
    "p": r"(?P<pid>\d+)",
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
    return re.compile(_prefix_regex(prefix, whole=True))


def pid_pattern(prefix: str) -> re.Pattern[str]:
    """The prefix up to its process id only: the cheap test every line of a large log gets
    (the values after it, such as %a, need a search that costs more)."""
    return re.compile(_prefix_regex(prefix, whole=False))


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
    return (
        _atomic(segments[:optional_from])
        + f"(?:{_atomic(optional[:-1])}{optional[-1]})?"
        + _SEVERITY
    )


def _atomic(segments: list[str]) -> str:
    return "".join(f"(?>{segment})" for segment in segments if segment)


def _first_character(prefix: str) -> Callable[[str], bool]:
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


_CSV_HEAD = re.compile(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ [^,]*,(?:"[^"]*"|),')


# -- reading bytes: bounded whatever the input ------------------------------------------------

CHUNK = 256 << 10  # bytes read (or inflated) at a time: well under MAX_LINE (see _text)
MAX_LINE = 1 << 20  # a longer line is skipped and counted: a bulk load's statement, or damage
DETECT_BYTES = 64 << 20  # a file with no line in so many bytes is not a log (NULs, one line)
HEAD_BATCHES = 8  # batches of lines at most held to tell the format (16 MiB at most)
GZIP_RATIO = 100  # gzip data inflating to more than this many times its size is a bomb...
GZIP_FLOOR = 1 << 30  # ...once it has inflated to this much (real logs compress 5 to 30 times)
LISTED_STRETCHES = 5  # damaged stretches listed by offset; the rest are counted
_NOT_NUL = re.compile(rb"[^\x00]")
_ESCAPED = re.compile("[\udc80-\udcff]+")  # undecodable bytes, as "surrogateescape" gives them
GZIP_MAGIC = b"\x1f\x8b"


class Stretch(NamedTuple):
    """Bytes skipped at one place of a file (offsets in its text, after gzip)."""

    offset: int
    length: int


@dataclass
class Damage:
    """What reading the bytes of one file skipped or replaced, and where."""

    nul_bytes: int = 0  # NUL bytes, with the partial line before each run of them
    nul_stretches: list[Stretch] = field(default_factory=list)
    nul_count: int = 0
    long_lines: list[Stretch] = field(default_factory=list)
    long_count: int = 0
    long_bytes: int = 0
    undecodable: int = 0  # bytes that are not UTF-8, shown as U+FFFD
    truncated: bool = False  # gzip data that ends early
    inflate_limit: int | None = None  # gzip data not read beyond this many inflated bytes
    _nul_end: int = field(default=-1, repr=False, compare=False)

    def summary(self) -> str:
        """What was skipped, in a few words ("" when nothing was)."""
        said = []
        if self.nul_bytes:
            said.append(f"{byte_size(self.nul_bytes)} of NUL bytes skipped")
        if self.long_count:
            said.append(f"{self.long_count} line(s) longer than {byte_size(MAX_LINE)} skipped")
        return ", ".join(said)

    def nuls(self, offset: int, length: int) -> None:
        """NUL bytes (or the partial line before them) at ``offset``: the same stretch as the
        last when they follow it."""
        self.nul_bytes += length
        if self.nul_count and offset == self._nul_end:
            if self.nul_count <= LISTED_STRETCHES:
                last = self.nul_stretches[-1]
                self.nul_stretches[-1] = Stretch(last.offset, last.length + length)
        else:
            self.nul_count += 1
            if self.nul_count <= LISTED_STRETCHES:
                self.nul_stretches.append(Stretch(offset, length))
        self._nul_end = offset + length

    def long(self, offset: int, length: int) -> None:
        """A line too long, from ``offset``: ``length`` bytes so far (see ``longer``)."""
        self.long_bytes += length
        self.long_count += 1
        if len(self.long_lines) < LISTED_STRETCHES:
            self.long_lines.append(Stretch(offset, length))

    def longer(self, length: int) -> None:
        """More bytes of the last line too long."""
        self.long_bytes += length
        if self.long_count <= LISTED_STRETCHES:
            last = self.long_lines[-1]
            self.long_lines[-1] = Stretch(last.offset, last.length + length)


class LogLines:
    """The text lines of a log given as bytes (a file, a FIFO, standard input), plain or gzip
    (several members, as `zcat` reads them), in batches of about ``CHUNK`` bytes.

    Memory is bounded whatever the input: a line longer than ``MAX_LINE`` is skipped; a run
    of NUL bytes (what a crash leaves in an append-only file) is skipped with the partial line
    before it, and the text after it read as a new line; bytes that are not UTF-8 become
    U+FFFD; gzip data is inflated ``CHUNK`` at a time and not beyond ``GZIP_RATIO`` times its
    size. ``damage`` says what was skipped and where; ``offset`` is the bytes consumed."""

    def __init__(
        self, raw: IO[bytes], name: str, chunk: int = CHUNK, max_line: int = MAX_LINE
    ) -> None:
        self.name = name
        self.chunk, self.max_line = chunk, max_line  # smaller in tests, to cross boundaries
        self.damage = Damage()
        self.offset = 0
        self._raw = raw
        self._carry = bytearray()  # the start of a line whose end is in a later chunk
        self._skipping = False  # inside a line longer than MAX_LINE (counted as it goes)
        self._in_nuls = False  # inside a run of NUL bytes

    def batches(self) -> Iterator[list[str]]:
        """One list of lines per chunk read (empty when the chunk held no line's end)."""
        for chunk in self._chunks():
            lines = self._lines(chunk)
            self.offset += len(chunk)
            yield lines
        if self._skipping or not self._carry:
            return
        last = self._decode(self._carry)  # the last line, without its line break
        self._carry = bytearray()
        yield [last]

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self.batches())

    def _read(self) -> bytes:
        read1 = getattr(self._raw, "read1", None)  # a pipe: what is there, not a full chunk
        return read1(self.chunk) if read1 is not None else self._raw.read(self.chunk)

    def _chunks(self) -> Iterator[bytes]:
        first = self._read()
        while 0 < len(first) < 2 and (more := self._read()):
            first += more
        if first[:2] != GZIP_MAGIC:
            while first:
                yield first
                first = self._read()
            return
        yield from self._inflated(first)

    def _inflated(self, first: bytes) -> Iterator[bytes]:
        """gzip members one after the other, each output at most CHUNK bytes."""
        inflater = zlib.decompressobj(wbits=31)
        compressed, inflated = 0, 0
        pending = first
        try:
            while pending:
                compressed += len(pending)
                while pending:
                    out = inflater.decompress(pending, self.chunk)
                    inflated += len(out)
                    if inflated > max(GZIP_FLOOR, GZIP_RATIO * compressed):
                        self.damage.inflate_limit = inflated - len(out)
                        return
                    yield out
                    pending = inflater.unconsumed_tail
                    if inflater.eof:
                        pending = inflater.unused_data
                        inflater = zlib.decompressobj(wbits=31) if pending else inflater
                pending = self._read()
        except zlib.error:
            self.damage.truncated = True
            return
        yield inflater.flush()
        self.damage.truncated = not inflater.eof

    def _lines(self, chunk: bytes) -> list[str]:
        """The lines that end in ``chunk``; NUL runs skipped."""
        if not self._in_nuls and 0 not in chunk:  # the common case
            return self._text(chunk, self.offset)
        lines: list[str] = []
        position = 0
        while position < len(chunk):
            if self._in_nuls:
                found = _NOT_NUL.search(chunk, position)
                end = found.start() if found is not None else len(chunk)
                self.damage.nuls(self.offset + position, end - position)
                self._in_nuls = found is None
                position = end
                continue
            nul = chunk.find(0, position)
            if nul < 0:
                lines += self._text(chunk[position:], self.offset + position)
                break
            lines += self._text(chunk[position:nul], self.offset + position)
            # the partial line before the NULs lost its end: skipped with them
            if not self._skipping:
                self.damage.nuls(self.offset + nul - len(self._carry), len(self._carry))
            self._carry, self._skipping, self._in_nuls = bytearray(), False, True
            position = nul
        return lines

    def _text(self, data: bytes, at: int) -> list[str]:
        """The lines that end in ``data`` (no NUL in it; ``at`` its offset)."""
        if self._skipping:
            end = data.find(b"\n")
            self.damage.longer(end + 1 if end >= 0 else len(data))
            if end < 0:
                return []
            self._skipping = False
            data, at = data[end + 1 :], at + end + 1
        end = data.rfind(b"\n")
        if end < 0:
            self._hold(data, at)
            return []
        whole = self._carry + data[: end + 1]
        self._carry = bytearray()
        if len(whole) > self.max_line:
            whole = self._without_long(whole, at + end + 1 - len(whole))
        self._hold(data[end + 1 :], at + end + 1)
        text = self._decode(whole)
        lines = text.splitlines(keepends=True)
        if len(lines) != text.count("\n"):  # a line break of another kind (\r, \f, U+2028)
            lines = [line + "\n" for line in text[:-1].split("\n")]
        return lines

    def _hold(self, data: bytes, at: int) -> None:
        """The start of a line whose end is to come: kept, or skipped once too long."""
        self._carry += data
        if len(self._carry) > self.max_line:
            self.damage.long(at + len(data) - len(self._carry), len(self._carry))
            self._carry, self._skipping = bytearray(), True

    def _without_long(self, whole: bytearray, at: int) -> bytearray:
        """Whole lines less those longer than max_line (measured in bytes, as the carry)."""
        pieces = whole.split(b"\n")
        if max(map(len, pieces)) <= self.max_line:
            return whole
        kept = bytearray()
        for piece in pieces[:-1]:  # the last is empty: ``whole`` ends with a line break
            if len(piece) > self.max_line:
                self.damage.long(at, len(piece) + 1)
            else:
                kept += piece + b"\n"
            at += len(piece) + 1
        return kept

    def _decode(self, data: bytes | bytearray) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            escaped = data.decode("utf-8", "surrogateescape")
            text, runs = _ESCAPED.subn("\ufffd", escaped)
            self.damage.undecodable += len(escaped) - len(text) + runs
            return text


@dataclass
class ReadCounts:
    """What reading one stream met, for the report's notes."""

    name: str
    format: LogFormat | None = None
    prefix: str | None = None
    lines: int = 0
    entries: int = 0
    unparsed: int = 0
    foreign: int = 0  # entries whose severity is not English: lc_messages is another language
    foreign_sample: str | None = None
    outside: int = 0  # entries outside --since/--until
    cut_short: bool = False  # the last line ends without a line break and could not be read
    damage: Damage = field(default_factory=Damage)  # what reading the bytes skipped


def detect(head: list[str], prefix: str | None = None) -> tuple[LogFormat, str | None]:
    """The format of a log from its first lines, and for stderr the prefix that fits most."""
    lines = [line for line in head if line.strip()]
    if lines and lines[0].lstrip("\ufeff").startswith("{"):
        return "jsonlog", None
    if lines and _CSV_HEAD.match(lines[0]):
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


BATCH_LINES = 4096
# lines after which an entry's DETAIL and STATEMENT are not awaited: the server writes them with
# the message in one write (elog.c send_message_to_server_log), so they follow it at once
PENDING_LINES = 200
RECENT_LINES = 4096  # lines after which a holder not found is looked for again
RECENT_BATCHES = 2  # batches kept to name a lock's holders (their latest line): 4096 lines or more
TEXT_MAX = 16 << 10  # characters kept of a message, DETAIL, STATEMENT or CONTEXT
SAMPLE_EVERY = 64  # one line in so many is read whole, for the language of the messages


_FIELDS = {"DETAIL": "detail", "STATEMENT": "statement", "CONTEXT": "context", "QUERY": "context"}


class _Pending:
    """An entry of a stderr log still being read (its DETAIL and STATEMENT may follow).

    ``head`` is the line's text before its severity: the server writes an entry's lines in one
    go with the same prefix (elog.c send_message_to_server_log), so a line that starts with it
    continues this entry without the prefix read again (a prefix with %l differs: read whole).
    """

    __slots__ = ("context", "detail", "head", "identity", "line", "message", "pid",
                 "severity", "size", "statement", "time", "where")  # fmt: skip

    def __init__(self, found: re.Match[str], pid: int, identity: Identity, line: int) -> None:
        self.time: str | None
        self.time, self.severity, message = found.group("time", "severity", "text")
        self.pid, self.identity, self.line = pid, identity, line
        self.message = message[:TEXT_MAX]
        self.size = found.start("severity")
        self.head = found.string[: self.size]
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
        return Entry(parse_time(self.time), self.pid, self.identity, self.severity,
                     self.message, self.detail, self.statement, self.context)  # fmt: skip


class LogReader:
    """The entries of one log that may concern locks, in order; ``counts`` says what was met
    and ``identities`` who each session was (user, database, application), for holders."""

    def __init__(
        self,
        lines: Iterable[str],
        name: str = "-",
        prefix: str | None = None,
        identities: dict[int, Identity] | None = None,
    ) -> None:
        self.counts = ReadCounts(name)
        self._consumed: Callable[[], int] = lambda: 0  # bytes read: a list in memory is small
        self._batches: Iterator[list[str]]
        if isinstance(lines, LogLines):
            self._batches = lines.batches()
            self._consumed = lambda: lines.offset
            self.counts.damage = lines.damage
        else:
            source = iter(lines)
            self._batches = iter(lambda: list(islice(source, BATCH_LINES)), [])
        self.identities: dict[int, Identity] = identities if identities is not None else {}
        self._prefix = prefix
        self._prefix_text: str | None = None
        self._recent: deque[list[str]] = deque(maxlen=RECENT_BATCHES)
        self._looked: dict[int, int] = {}  # holder pid -> lines read when last looked for
        self._lines_read = 0
        self._identities: dict[tuple[str | None, ...] | str | None, Identity] = {}
        self._identity_groups: tuple[str, ...] = ("pid",)  # and those of the prefix's names
        self._blank_lines = 0  # in the batches of blank lines left out of the head

    def __iter__(self) -> Iterator[Entry]:
        name = self.counts.name
        head, ended = self._head()
        if not head:
            damage = self.counts.damage.summary()
            if ended and not damage:
                return  # an empty file (a log just rotated)
            where = "" if ended else f" in its first {byte_size(DETECT_BYTES)}"
            raise NotALog(f"{name}: not a PostgreSQL log: no line of text{where}"
                          + (f" ({damage})" if damage else ""))  # fmt: skip
        sample = islice((line for batch in head for line in batch if line.strip()), DETECT_LINES)
        try:
            fmt, prefix = detect(list(sample), self._prefix)
        except NotALog as error:
            raise NotALog(f"{name}: {error}", error.hint) from None
        self.counts.format, self.counts.prefix = fmt, prefix
        batches = chain(_handed_over(head), self._batches)
        if fmt == "csvlog":
            yield from self._csv(batches)
        elif fmt == "jsonlog":
            yield from self._json(batches)
        else:
            if "pid" not in prefix_pattern(prefix or "").groupindex:
                raise InputError(f"--prefix {prefix!r} has no %p: lockdiag needs the pid")
            self._prefix_text = prefix
            names = prefix_pattern(prefix or "").groupindex
            present = [name for name in ("user", "database", "application") if name in names]
            self._identity_groups = ("pid", *present)
            yield from self._stderr(batches, prefix or "")
        self.counts.lines += self._blank_lines
        if self.counts.entries == 0 and self.counts.unparsed > 0:
            raise NotALog(
                f"{name}: not a PostgreSQL {fmt} log: none of its "
                f"{self.counts.unparsed} line(s) could be read",
                None if fmt != "stderr" else "give the server's log_line_prefix with --prefix",
            )

    def _head(self) -> tuple[list[list[str]], bool]:
        """The first batches, up to DETECT_LINES lines of text or DETECT_BYTES read, whichever
        comes first (batches of blank lines only are counted and left out); and whether the
        log ended there."""
        head: list[list[str]] = []
        seen = 0
        for batch in self._batches:
            if any(line.strip() for line in batch):
                head.append(batch)
                seen += sum(1 for line in islice(batch, DETECT_LINES) if line.strip())
            else:
                self._blank_lines += len(batch)
            if seen >= DETECT_LINES or len(head) >= HEAD_BATCHES or self._consumed() > DETECT_BYTES:
                return head, False
        return head, True

    def _kept(self, batches: Iterable[list[str]]) -> Iterator[list[str]]:
        """The batches, each kept among the recent ones as it is read."""
        for batch in batches:
            self._recent.append(batch)
            yield batch

    def _recent_lines(self) -> Iterator[str]:
        """The lines (records) kept for naming holders, the latest first."""
        return chain.from_iterable(reversed(batch) for batch in reversed(self._recent))

    def _remember(self, pid: int, identity: Identity) -> None:
        known = self.identities
        if known.get(pid) != identity:
            if len(known) >= PID_MEMORY:
                known.clear()  # bounded: the oldest sessions are forgotten together
            known[pid] = identity

    def _foreign(self, severity: str, message: str) -> None:
        self.counts.foreign += 1
        if self.counts.foreign_sample is None:
            self.counts.foreign_sample = f"{severity}:  {message}"[:120]

    def _stderr(self, batches: Iterable[list[str]], prefix: str) -> Iterator[Entry]:
        """Entries of a stderr log: a line with the prefix starts one, or continues the
        pending entry of its pid (DETAIL, STATEMENT, CONTEXT); a line starting with a tab
        continues the line before it (elog.c writes a message's line breaks as "\\n\\t").

        Every line gets a cheap test (its first character, and a look for the words of a lock
        message); the whole prefix is read only for a line that may concern locks, one that
        may continue such an entry, the first lines and one line in SAMPLE_EVERY (for the
        language of the messages)."""
        counts = self.counts
        pending: dict[int, _Pending] = {}
        last: _Pending | None = None  # the entry the previous line belonged to
        latest: _Pending | None = None  # the entry read whole last
        quick, full = pid_pattern(prefix).match, prefix_pattern(prefix).match
        starts = _first_character(prefix)
        recent = self._recent
        number = 0
        for batch in batches:
            recent.append(batch)
            self._lines_read = number + len(batch)
            for raw in batch:
                number += 1
                if raw.startswith("\t"):
                    if last is not None:
                        last.extend(raw[1:].rstrip("\r\n"))
                    continue
                last = None
                if pending and number & 63 == 0:
                    yield from self._aged(pending, number)
                if latest is not None and raw.startswith(latest.head):
                    pid = latest.pid
                    colon = raw.find(":  ", latest.size)
                    severity = raw[latest.size : colon]
                    if colon > 0 and severity in CONTINUATIONS and pending.get(pid) is latest:
                        last = latest if latest.add(severity, raw, colon + 3) else None
                        continue
                if not starts(raw[:1]):
                    self._unreadable(raw, number)
                    continue
                if not (
                    "  process " in raw
                    or "ERROR:  " in raw
                    or "FATAL:  " in raw
                    or number <= DETECT_LINES
                    or number % SAMPLE_EVERY == 0
                    or (pending and self._pid(quick, raw) in pending)
                ):
                    counts.entries += 1  # the common case: a line about something else
                    continue
                found = full(raw.rstrip("\r\n"))
                if found is None or found.group("pid") is None:
                    self._unreadable(raw, number)
                    continue
                done, last = self._whole_line(found, pending, number)
                if last is not None:
                    latest = last
                if done is not None:
                    yield self._named(done.entry())
            if pending:
                yield from self._aged(pending, number)
        counts.lines = number
        for rest in pending.values():
            yield self._named(rest.entry())

    def _whole_line(
        self, found: re.Match[str], pending: dict[int, _Pending], number: int
    ) -> tuple[_Pending | None, _Pending | None]:
        """A line read whole: (the entry it completes, the entry its next lines continue)."""
        pid_text, severity, message = found.group("pid", "severity", "text")
        pid = int(pid_text)
        if severity in CONTINUATIONS:
            last = pending.get(pid)
            return None, last if last is not None and last.add(severity, message) else None
        self.counts.entries += 1
        done = pending.pop(pid, None)
        if severity not in ENGLISH_SEVERITIES:
            self._foreign(severity, message)
            return done, None
        if not interesting(severity, message):
            return done, None
        identity = self._identity(found)
        if self.identities.get(pid) is not identity:
            self._remember(pid, identity)
        pending[pid] = _Pending(found, pid, identity, number)
        return done, pending[pid]

    @staticmethod
    def _pid(quick: Callable[[str], re.Match[str] | None], raw: str) -> int | None:
        head = quick(raw)
        return int(head.group("pid")) if head is not None and head.group("pid") else None

    def _aged(self, pending: dict[int, _Pending], number: int) -> Iterator[Entry]:
        """Entries whose DETAIL and STATEMENT lines had every chance to come (PostgreSQL
        writes them with the message; only a log without the collector interleaves)."""
        for pid in [p for p, entry in pending.items() if number - entry.line > PENDING_LINES]:
            yield self._named(pending.pop(pid).entry())

    def _identity(self, found: re.Match[str]) -> Identity:
        """The session's user, database and application: one object per session and text,
        made once (the pid first, so that the groups come back as a tuple)."""
        said = found.group(*self._identity_groups)
        identity = self._identities.get(said)
        if identity is None:
            if len(self._identities) >= PID_MEMORY:
                self._identities.clear()
            values = said[1:] if isinstance(said, tuple) else ()
            named = dict(zip(self._identity_groups[1:], values, strict=True))
            identity = self._identities[said] = Identity(
                *(
                    value.rstrip(" ") if value else value  # a padded value (%-20a) ends in spaces
                    for value in map(named.get, ("user", "database", "application"))
                )
            )
        return identity

    def _named(self, entry: Entry) -> Entry:
        """Before an entry leaves: who its lock's holders are, from their latest lines."""
        if entry.detail:
            for pid in holders_of(entry.detail):
                if (
                    pid not in self.identities
                    and self._lines_read - self._looked.get(pid, -RECENT_LINES) >= RECENT_LINES
                ):
                    self._looked[pid] = self._lines_read  # not again until the lines are new
                    if len(self._looked) > PID_MEMORY:
                        self._looked.clear()
                    self._look_back(pid)
        return entry

    def _look_back(self, pid: int) -> None:
        """The holder's identity from the last lines read (it need not have logged anything
        about locks): only the recent lines are kept, so this is bounded."""
        if self.counts.format == "jsonlog":
            needle = f'"pid":{pid},'
            for raw in self._recent_lines():
                if needle in raw:
                    record = _json_record(raw)
                    if record is not None:
                        self._remember(pid, _json_identity(record))
                    return
            return
        if self.counts.format == "csvlog":
            wanted = str(pid)
            for raw in self._recent_lines():
                if f",{wanted}," in raw and (row := _csv_row(raw)) is not None and row[3] == wanted:
                    self._remember(pid, Identity(row[1] or None, row[2] or None, row[22] or None))
                    return
            return
        if self.counts.format != "stderr" or self._prefix_text is None:
            return
        quick, full = pid_pattern(self._prefix_text).match, prefix_pattern(self._prefix_text).match
        wanted = str(pid)
        for raw in self._recent_lines():
            head = quick(raw)
            if head is not None and head.group("pid") == wanted:
                found = full(raw.rstrip("\r\n"))
                if found is not None:
                    self._remember(pid, self._identity(found))
                return

    def _unreadable(self, raw: str, number: int) -> None:
        if not raw.strip():
            return
        if number > 1 and not raw.endswith("\n"):  # the last line of a file being written
            self.counts.cut_short = True
        else:
            self.counts.unparsed += 1

    def _csv(self, batches: Iterable[list[str]]) -> Iterator[Entry]:
        """csvlog: records split by the parity of their quotes (a quote inside a field is
        doubled, so a record ends on a line where the count of quotes so far is even); a
        record is parsed only when it may concern locks, among the first lines, or as a
        sample. A record open for more than MAX_LINE (a line lost to damage upset the
        parity) is dropped, and reading goes on at the next line that starts a record."""
        counts = self.counts
        if csv.field_size_limit() < MAX_LINE:
            csv.field_size_limit(MAX_LINE)
        parts: list[str] = []  # the lines of a record that a quoted line break keeps open
        size = 0  # of the open record
        lost = False  # after a dropped record: until a line starts a record
        number = 0
        for batch in batches:
            records: list[str] = []
            self._recent.append(records)
            for line in batch:
                number += 1
                if lost:
                    if not _CSV_HEAD.match(line):
                        continue
                    lost = False
                odd = line.count('"') % 2 == 1
                if parts:
                    parts.append(line)
                    size += len(line)
                    if not odd:
                        if size > MAX_LINE:
                            counts.unparsed += 1
                            parts, size, lost = [], 0, True
                        continue
                    record, parts, size = "".join(parts), [], 0
                elif odd:
                    parts.append(line)
                    size = len(line)
                    continue
                else:
                    record = line
                self._lines_read = number
                records.append(record)
                if not (
                    '"process ' in record
                    or "deadlock detected" in record
                    or "canceling statement due to" in record
                    or "terminating connection due to" in record
                    or number <= DETECT_LINES
                    or number % SAMPLE_EVERY == 0
                ):
                    if record[:1].isdigit():
                        counts.entries += 1
                    elif record.strip():
                        counts.unparsed += 1
                    continue
                entry = self._csv_record(record, number)
                if entry is not None:
                    yield self._named(entry)
        if parts:  # a record cut short: the file is still being written
            counts.cut_short = True
        counts.lines = number

    def _csv_record(self, record: str, number: int) -> Entry | None:
        # csvlog columns (config.sgml "Using CSV-Format Log Output"): 0 log_time, 1 user_name,
        # 2 database_name, 3 process_id, 11 error_severity, 13 message, 14 detail, 18 context,
        # 19 query, 22 application_name
        counts = self.counts
        row = _csv_row(record)
        if row is None:
            if record.strip():
                counts.unparsed += 1
            return None
        counts.entries += 1
        pid, severity, message = int(row[3]), row[11], row[13]
        identity = Identity(row[1] or None, row[2] or None, row[22] or None)
        self._remember(pid, identity)
        if severity not in ENGLISH_SEVERITIES:
            self._foreign(severity, message)
            return None
        if not interesting(severity, message):
            return None
        return Entry(parse_time(row[0]), pid, identity, severity, message[:TEXT_MAX],
                     _clip(row[14]), _clip(row[19]), _clip(row[18]))  # fmt: skip

    def _json(self, batches: Iterable[list[str]]) -> Iterator[Entry]:
        """jsonlog: one object a line, always opening with "timestamp" (elog.c write_jsonlog);
        decoded only when it may concern locks, among the first lines, or as a sample."""
        counts = self.counts
        number = 0
        for number, line in enumerate(chain.from_iterable(self._kept(batches)), 1):
            self._lines_read = number
            if not (line.startswith('{"timestamp":') and line.rstrip().endswith("}")):
                if line.strip():
                    self._unreadable(line, number)
                continue
            counts.entries += 1
            if not (
                '"message":"process ' in line
                or '"message":"deadlock detected"' in line
                or '"message":"canceling statement due to' in line
                or '"message":"terminating connection due to' in line
                or number <= DETECT_LINES
                or number % SAMPLE_EVERY == 0
            ):
                continue
            record = _json_record(line)
            if record is None:
                counts.entries -= 1
                counts.unparsed += 1
                continue
            severity = _text(record.get("error_severity")) or ""
            message = _text(record.get("message")) or ""
            if severity not in ENGLISH_SEVERITIES:
                self._foreign(severity, message)
                continue
            pid = record["pid"]
            if interesting(severity, message) and isinstance(pid, int):
                identity = _json_identity(record)
                self._remember(pid, identity)
                yield self._named(Entry(
                    parse_time(_text(record.get("timestamp"))), pid, identity,
                    severity, message[:TEXT_MAX], _clip(record.get("detail")),
                    _clip(record.get("statement")), _clip(record.get("context")),
                ))  # fmt: skip
        counts.lines = number


def _handed_over(batches: list[list[str]]) -> Iterator[list[str]]:
    """The batches in order, each let go of as it is given (the list is emptied)."""
    batches.reverse()
    while batches:
        yield batches.pop()


def _csv_row(record: str) -> list[str] | None:
    try:
        row = next(csv.reader([record]), None)
    except csv.Error:
        return None
    if row is None or len(row) < 23 or not row[3].isdigit():
        return None
    return row


def _json_record(line: str) -> dict[str, object] | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    return record


def _json_identity(record: dict[str, object]) -> Identity:
    return Identity(_text(record.get("user")), _text(record.get("dbname")),
                    _text(record.get("application_name")))  # fmt: skip


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _clip(value: object) -> str | None:
    """A DETAIL, STATEMENT or CONTEXT as kept: bounded (events are kept by the thousand)."""
    return value[:TEXT_MAX] if isinstance(value, str) and value else None


def byte_size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} byte{'' if count == 1 else 's'}"


# -- aggregation -------------------------------------------------------------------------------


@dataclass
class Wait:
    """One session's wait for one lock, as far as the log tells it."""

    pid: int
    tag: LockTag
    mode: str
    start: datetime | None
    seen: datetime | None  # the last time the log spoke of it
    waited_ms: float  # what the server said (or the time between its messages)
    identity: Identity
    holders: tuple[int, ...] = ()
    outcome: Outcome = "no end logged"
    avoided_deadlock: bool = False


@dataclass
class Episode:
    """Waits on one key close together in time (no gap longer than the tally's ``gap``)."""

    first: datetime | None
    last: datetime | None
    waits: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0
    holders: dict[int, Identity] = field(default_factory=dict)
    waiters: dict[int, Identity] = field(default_factory=dict)
    pids_left_out: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass
class KeyTally:
    tag: LockTag
    episodes: list[Episode] = field(default_factory=list)
    waits: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0
    failures: int = 0  # PostgreSQL 18 log_lock_failures: a NOWAIT attempt that failed
    deadlocks: int = 0
    first: datetime | None = None
    last: datetime | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    episodes_left_out: int = 0  # counted in the totals above, not kept (KEPT_EPISODES)
    folded: int = 0  # keys counted together here, one lock type's least waited (KEPT_KEYS)

    def absorb(self, other: KeyTally) -> None:
        """Count ``other``'s totals here, its episodes as left out."""
        self.folded += max(other.folded, 1)
        self.waits += other.waits
        self.longest_ms = max(self.longest_ms, other.longest_ms)
        self.total_ms += other.total_ms
        self.failures += other.failures
        self.deadlocks += other.deadlocks
        self.episodes_left_out += other.episodes_left_out + len(other.episodes)
        for moment in (other.first, other.last):
            if moment is not None:
                self.first = moment if self.first is None else min(self.first, moment)
                self.last = moment if self.last is None else max(self.last, moment)
        for outcome, count in other.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + count


class CycleStep(NamedTuple):
    pid: int
    mode: str
    tag: LockTag
    blocked_by: int
    query: str | None


@dataclass(frozen=True)
class Deadlock:
    time: datetime | None
    victim: int | None
    victim_identity: Identity
    statement: str | None
    cycle: tuple[CycleStep, ...]


@dataclass(frozen=True)
class Cancellation:
    """A statement ended by lock_timeout or statement_timeout (or a cancel) while it waited,
    or a lock_timeout whose lock the log does not name (it fired before deadlock_timeout)."""

    time: datetime | None
    pid: int | None
    identity: Identity
    kind: str
    tag: LockTag | None
    waited_ms: float | None
    statement: str | None


class TimelineEvent(NamedTuple):
    time: datetime | None
    event: str
    pid: int | None
    identity: Identity
    waited_ms: float | None
    detail: str


def _key_of(tag: LockTag) -> tuple[object, ...]:
    return (tag.kind, tag.database, tag.advisory) if tag.advisory else (tag.kind, tag.text)


class Tally:
    """Aggregates entries as they are read: per key, its episodes; the deadlocks and the
    cancellations; an optional timeline of one advisory key."""

    def __init__(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        gap: float = 60.0,
        timeline_key: LockTriple | None = None,
        kept_keys: int = KEPT_KEYS,
        kept_episodes: int = KEPT_EPISODES,
    ) -> None:
        self.since, self.until, self.gap = since, until, timedelta(seconds=gap)
        self.timeline_key = timeline_key
        self.kept_keys, self.kept_episodes = kept_keys, kept_episodes
        self.keys: dict[tuple[object, ...], KeyTally] = {}
        self.folded: dict[str, KeyTally] = {}  # lock type -> its least waited keys' totals
        self.episode_count = 0  # kept, across keys
        self._episode_limit = 2 * kept_episodes
        self.open: dict[int, Wait] = {}
        self.deadlocks: list[Deadlock] = []
        self.deadlock_count = 0
        self.cancellations: list[Cancellation] = []
        self.cancellation_count = 0
        self.unnamed_lock_timeouts = 0
        self.database_names: dict[int, str] = {}
        self.identities: dict[int, Identity] = {}
        self.reads: list[ReadCounts] = []
        self.timeline: list[TimelineEvent] = []
        self.timeline_left_out = 0
        self.first: datetime | None = None
        self.last: datetime | None = None

    # reading

    def read(self, reader: LogReader) -> None:
        reader.identities = self.identities
        self.reads.append(reader.counts)
        bounded = self.since is not None or self.until is not None
        for entry in reader:
            if (
                bounded
                and entry.time is not None
                and (
                    (self.since is not None and entry.time < self.since)
                    or (self.until is not None and entry.time > self.until)
                )
            ):
                reader.counts.outside += 1
                continue
            self.add(entry)

    def finish(self) -> None:
        """Close the waits whose end the log does not tell (their last figure is a lower
        bound)."""
        for wait in list(self.open.values()):
            self._close(wait, "no end logged", None)
        self.open.clear()

    def add(self, entry: Entry) -> None:
        time = entry.time
        if time is not None:
            if self.first is None or time < self.first:
                self.first = time
            if self.last is None or time > self.last:
                self.last = time
        if entry.severity == "LOG":
            said = parse_wait(entry.message)
            if said is not None:
                self._wait_message(entry, said)
            return
        kind = INTERESTING_ERRORS.get(entry.message)
        if kind == "deadlock":
            self._deadlock(entry)
        elif kind is not None:
            self._cancelled(entry, kind)

    def _wait_message(self, entry: Entry, said: tuple[str, str, str, str, str | None]) -> None:
        pid_text, verb, mode, tag_text, after = said
        pid = int(pid_text)
        tag = parse_tag(tag_text)
        waited = float(after) if after else 0.0
        holders = holders_of(entry.detail) if entry.detail else ()
        if tag.database and entry.identity.database and tag.kind != "other":
            self.database_names.setdefault(tag.database, entry.identity.database)
        wait = self.open.get(pid)
        if wait is not None and wait.tag is not tag and _key_of(wait.tag) != _key_of(tag):
            self._close(wait, "no end logged", None)  # a wait whose end went unlogged
            wait = None
        if verb == "could not obtain":
            tally = self._tally(tag)
            tally.failures += 1
            self._note(tag, entry, "could not obtain (NOWAIT)", None, holders)
            return
        if wait is None:
            start = entry.time - timedelta(milliseconds=waited) if entry.time else None
            wait = Wait(pid, tag, mode, start, entry.time, waited, entry.identity)
            self.open[pid] = wait
        wait.seen = entry.time
        wait.waited_ms = max(wait.waited_ms, waited)
        if holders and holders != wait.holders:
            wait.holders = tuple(dict.fromkeys((*wait.holders, *holders)))
        if verb == "still waiting for":
            self._note(tag, entry, f"waiting for {mode}", waited, holders)
        elif verb == "avoided deadlock for":
            wait.avoided_deadlock = True
            self._note(tag, entry, "avoided deadlock (queue rearranged)", waited, holders)
        elif verb == "acquired":
            self._note(tag, entry, f"acquired {mode}", waited, ())
            self._close(wait, "acquired", waited)
        # "detected deadlock while waiting": the ERROR that follows closes the wait

    def _note(
        self, tag: LockTag, entry: Entry, event: str, waited: float | None, holders: tuple[int, ...]
    ) -> None:
        if self.timeline_key is None or tag.advisory != self.timeline_key:
            return
        if len(self.timeline) >= KEPT_TIMELINE:
            self.timeline_left_out += 1
            return
        detail = f"holders {', '.join(map(str, holders))}" if holders else ""
        self.timeline.append(
            TimelineEvent(entry.time, event, entry.pid, entry.identity, waited, detail)
        )

    def _tally(self, tag: LockTag) -> KeyTally:
        key = _key_of(tag)
        tally = self.keys.get(key)
        if tally is None:
            if len(self.keys) >= 2 * self.kept_keys:
                self._fold_keys()
            tally = self.keys[key] = KeyTally(tag)
        return tally

    def _fold_keys(self) -> None:
        """The least waited half of the keys counted together, one total per lock type (a key
        met again later starts a tally of its own; the totals stay exact)."""
        ranked = sorted(self.keys.items(), key=lambda item: (item[1].total_ms, item[1].waits))
        for key, one in ranked[: len(ranked) - self.kept_keys]:
            del self.keys[key]
            self.episode_count -= len(one.episodes)
            kind = one.tag.kind
            into = self.folded.get(kind)
            if into is None:
                into = self.folded[kind] = KeyTally(LockTag(kind, f"{kind} (other keys)"))
            into.absorb(one)

    def _fold_episodes(self) -> None:
        """Only the episodes with the most wait kept whole, among those that ended (a later
        one of their key began: a key's last episode may still grow); the others stay in their
        key's totals, counted as left out."""
        closed: list[tuple[float, int, KeyTally, Episode]] = []
        for one in self.keys.values():
            closed += [(e.total_ms, id(e), one, e) for e in one.episodes[:-1]]
        closed.sort(key=lambda item: item[:2])
        dropped: dict[int, KeyTally] = {}
        gone: set[int] = set()
        for _, identity, one, _ in closed[: max(0, self.episode_count - self.kept_episodes)]:
            gone.add(identity)
            dropped[id(one)] = one
        for one in dropped.values():
            kept = [e for e in one.episodes if id(e) not in gone]
            one.episodes_left_out += len(one.episodes) - len(kept)
            one.episodes = kept
        self.episode_count -= len(gone)
        # when most are still open, look again only after as many more
        self._episode_limit = max(2 * self.kept_episodes, self.episode_count + self.kept_episodes)

    def _close(self, wait: Wait, outcome: Outcome, waited: float | None) -> None:
        self.open.pop(wait.pid, None)
        wait.outcome = outcome
        if waited is not None:
            wait.waited_ms = waited
        tally = self._tally(wait.tag)
        tally.waits += 1
        tally.longest_ms = max(tally.longest_ms, wait.waited_ms)
        tally.total_ms += wait.waited_ms
        tally.outcomes[outcome] = tally.outcomes.get(outcome, 0) + 1
        start, end = wait.start, wait.seen
        if start is not None:
            tally.first = start if tally.first is None else min(tally.first, start)
        if end is not None:
            tally.last = end if tally.last is None else max(tally.last, end)
        episode = tally.episodes[-1] if tally.episodes else None
        if (
            episode is None
            or start is None
            or episode.last is None
            or start - episode.last > self.gap
        ):
            episode = Episode(start, end)
            tally.episodes.append(episode)
            self.episode_count += 1
            if self.episode_count > self._episode_limit:
                self._fold_episodes()
        if start is not None and (episode.first is None or start < episode.first):
            episode.first = start
        if end is not None and (episode.last is None or end > episode.last):
            episode.last = end
        episode.waits += 1
        episode.longest_ms = max(episode.longest_ms, wait.waited_ms)
        episode.total_ms += wait.waited_ms
        episode.outcomes[outcome] = episode.outcomes.get(outcome, 0) + 1
        if wait.pid not in episode.waiters:
            self._list(episode, episode.waiters, wait.pid, wait.identity)
        for holder in wait.holders:
            if holder not in episode.holders:
                self._list(episode, episode.holders, holder, self.identities.get(holder))

    @staticmethod
    def _list(episode: Episode, where: dict[int, Identity], pid: int, who: Identity | None) -> None:
        """A pid not listed yet, or counted as left out once the list is full."""
        if len(where) >= LISTED_PIDS:
            episode.pids_left_out += 1
            return
        where[pid] = who or Identity(None, None, None)

    def _deadlock(self, entry: Entry) -> None:
        self.deadlock_count += 1
        detail = entry.detail or ""
        queries = {int(p): q for p, q in _QUERY.findall(detail)}
        cycle = tuple(
            CycleStep(int(pid), mode, parse_tag(tag), int(by), queries.get(int(pid)))
            for pid, mode, tag, by in _CYCLE.findall(detail)
        )
        for tag in {_key_of(step.tag): step.tag for step in cycle}.values():
            self._tally(tag).deadlocks += 1
            self._note(tag, entry, "deadlock detected", None, ())
        wait = self.open.get(entry.pid) if entry.pid is not None else None
        if wait is not None:
            self._close(wait, "deadlock", _elapsed(wait, entry.time))
        if len(self.deadlocks) < KEPT_EVENTS:
            self.deadlocks.append(
                Deadlock(entry.time, entry.pid, entry.identity, entry.statement, cycle)
            )

    def _cancelled(self, entry: Entry, kind: str) -> None:
        wait = self.open.get(entry.pid) if entry.pid is not None else None
        if wait is None and kind != "lock timeout":
            return  # a statement cancelled while it waited for no lock: not ours
        self.cancellation_count += 1
        waited = _elapsed(wait, entry.time) if wait is not None else None
        if wait is not None:
            self._note(wait.tag, entry, f"cancelled: {kind}", waited, ())
            self._close(wait, kind, waited)  # type: ignore[arg-type]
        else:
            self.unnamed_lock_timeouts += 1
        if len(self.cancellations) < KEPT_EVENTS:
            self.cancellations.append(
                Cancellation(entry.time, entry.pid, entry.identity, kind,
                             wait.tag if wait else None, waited, entry.statement)
            )  # fmt: skip


def _elapsed(wait: Wait, now: datetime | None) -> float:
    if wait.start is None or now is None:
        return wait.waited_ms
    wait.seen = now
    return max(wait.waited_ms, (now - wait.start).total_seconds() * 1000)


# -- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """What a server can add (``--dsn``): database names by OID, relation names by
    (database OID, relation OID)."""

    databases: dict[int, str] = field(default_factory=dict)
    relations: dict[tuple[int, int], str] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyReport:
    tally: KeyTally
    label: str
    namespace: str
    database: str | None
    decoded: Decoded | None


@dataclass(frozen=True)
class NamespaceTotal:
    namespace: str
    keys: int
    waits: int
    longest_ms: float
    total_ms: float
    deadlocks: int


@dataclass(frozen=True)
class LogReport:
    keys: list[KeyReport]  # most total wait first
    namespaces: list[NamespaceTotal]
    deadlocks: list[Deadlock]
    deadlock_count: int
    cancellations: list[Cancellation]
    cancellation_count: int
    unnamed_lock_timeouts: int
    reads: list[ReadCounts]
    first: datetime | None
    last: datetime | None
    timeline_key: LockTriple | None
    timeline: list[TimelineEvent]
    labels: dict[tuple[object, ...], str]  # every tag's label, for deadlocks and timeouts
    timeline_left_out: int = 0  # events past KEPT_TIMELINE

    def label(self, tag: LockTag | None) -> str:
        if tag is None:
            return "(lock not logged)"
        return self.labels.get(_key_of(tag), tag.text)


class Namer:
    """Names lock tags: advisory keys through the registry, then the catalogue; relations by
    name where known, else by OID."""

    def __init__(self, registry: Registry, database_names: dict[int, str], names: Names) -> None:
        self.registry = registry
        self.databases = {**database_names, **names.databases}
        self.relations = names.relations
        self.catalogue: Catalogue = build_catalogue(registry.candidates, self.databases.values())

    def database(self, tag: LockTag) -> str | None:
        return self.databases.get(tag.database) if tag.database is not None else None

    def name(self, tag: LockTag) -> tuple[str, str, Decoded | None]:
        """(label, namespace, decoded) of one tag."""
        if tag.advisory is not None:
            decoded = decode(self.registry, self.catalogue, tag.advisory, self.database(tag))
            if decoded.namespace is not None:
                namespace = decoded.namespace.name
            elif decoded.known is not None:
                namespace = decoded.known.software
            else:
                namespace = "unregistered"
            return decoded.label, namespace, decoded
        if tag.relation is not None and tag.database is not None:
            relation = self.relations.get((tag.database, tag.relation)) or self.relations.get(
                (0, tag.relation)
            )
            where = f"relation {relation}" if relation else f"relation oid {tag.relation}"
            if tag.kind != "relation":
                head = tag.text.split(" of relation ")[0]
                return f"{head} of {where}", tag.kind, None
            return where, "relation", None
        return tag.text, tag.kind, None


def report(tally: Tally, registry: Registry, names: Names = Names()) -> LogReport:
    tally.finish()
    namer = Namer(registry, tally.database_names, names)
    labels: dict[tuple[object, ...], str] = {}
    keys: list[KeyReport] = []
    unknown = Identity(None, None, None)
    for key, one in tally.keys.items():
        for episode in one.episodes:  # a holder named by a line it wrote after the wait
            for pid, who in episode.holders.items():
                if who == unknown and pid in tally.identities:
                    episode.holders[pid] = tally.identities[pid]
        label, namespace, decoded = namer.name(one.tag)
        labels[key] = label
        keys.append(KeyReport(one, label, namespace, namer.database(one.tag), decoded))
    for kind, one in tally.folded.items():
        label = f"{one.folded} other {kind} lock(s), the least waited, counted together"
        keys.append(KeyReport(one, label, kind, None, None))
    for deadlock in tally.deadlocks:
        for step in deadlock.cycle:
            labels.setdefault(_key_of(step.tag), namer.name(step.tag)[0])
    keys.sort(key=lambda k: (-k.tally.total_ms, -k.tally.waits, -k.tally.deadlocks, k.label))
    totals: dict[str, list[float]] = {}
    for named in keys:
        row = totals.setdefault(named.namespace, [0, 0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += named.tally.waits
        row[2] = max(row[2], named.tally.longest_ms)
        row[3] += named.tally.total_ms
        row[4] += named.tally.deadlocks
    namespaces = sorted(
        (NamespaceTotal(name, int(r[0]), int(r[1]), r[2], r[3], int(r[4]))
         for name, r in totals.items()),
        key=lambda n: (-n.total_ms, -n.waits, n.namespace),
    )  # fmt: skip
    return LogReport(
        keys, namespaces, tally.deadlocks, tally.deadlock_count, tally.cancellations,
        tally.cancellation_count, tally.unnamed_lock_timeouts, tally.reads, tally.first,
        tally.last, tally.timeline_key,
        sorted(tally.timeline, key=lambda e: e.time or datetime.min), labels,
        tally.timeline_left_out,
    )  # fmt: skip


def relation_oids(tally: Tally) -> set[tuple[int, int]]:
    """(database OID, relation OID) of every relation the log names, for ``--dsn``."""
    found = {
        (one.tag.database, one.tag.relation)
        for one in tally.keys.values()
        if one.tag.database is not None and one.tag.relation is not None
    }
    return {(d, r) for d, r in found if d is not None and r is not None}
