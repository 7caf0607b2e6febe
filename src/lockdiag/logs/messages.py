"""What PostgreSQL's lock messages say, whatever the format they came in: the entries read
(a message with its DETAIL, STATEMENT and CONTEXT), lock tags, wait messages, deadlock cycles
and the time a line carries.

The messages are PostgreSQL's own (``src/backend/storage/lmgr/proc.c`` ProcSleep,
``deadlock.c`` DeadLockReport, ``postgres.c`` ProcessInterrupts, ``lmgr.c`` DescribeLockTag),
in English. Pure text: imports ``lockdiag.keys`` only.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from functools import lru_cache
from typing import NamedTuple

from lockdiag.keys import UINT2_MAX, UINT4_MAX, AdvisoryTag, LockTriple, is_key_form

TEXT_MAX = 16 << 10  # characters kept of a message, DETAIL, STATEMENT or CONTEXT

ENGLISH_SEVERITIES = frozenset(
    (
        "LOG",
        "ERROR",
        "WARNING",
        "FATAL",
        "PANIC",
        "DETAIL",
        "HINT",
        "STATEMENT",
        "CONTEXT",
        "QUERY",
        "LOCATION",
        "NOTICE",
        "INFO",
        "DEBUG",
        "DEBUG1",
        "DEBUG2",
        "DEBUG3",
        "DEBUG4",
        "DEBUG5",
    )
)
CONTINUATIONS = frozenset(("DETAIL", "HINT", "STATEMENT", "CONTEXT", "QUERY", "LOCATION"))


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
        return message.startswith("process ") and (
            " still waiting for " in message
            or " acquired " in message
            or " avoided deadlock " in message
            or " detected deadlock " in message
            or " could not obtain " in message
        )
    return severity in ("ERROR", "FATAL") and message in INTERESTING_ERRORS


class LockTag(NamedTuple):
    """A lock as the log names it (lmgr.c DescribeLockTag), with the numbers it carries."""

    kind: str  # advisory, relation, tuple, page, extension, transaction, object, ...
    text: str
    database: int | None = None
    relation: int | None = None
    advisory: LockTriple | None = None
    tag: AdvisoryTag | None = None  # an extension's advisory tag (objsubid not 1 or 2)


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
        if classid > UINT4_MAX or objid > UINT4_MAX or objsubid > UINT2_MAX:
            return LockTag("advisory (other)", text, database)  # no lock tag holds these
        if not is_key_form(objsubid):  # an extension's C code took it: its numbers only
            return LockTag(kind, text, database, tag=AdvisoryTag.of_row(classid, objid, objsubid))
        return LockTag(kind, text, database, None, LockTriple.of_row(classid, objid, objsubid))
    return LockTag("other", text)


class CycleStep(NamedTuple):
    pid: int
    mode: str
    tag: LockTag
    blocked_by: int
    query: str | None


def parse_cycle(detail: str) -> tuple[CycleStep, ...]:
    """The steps of a deadlock's cycle, from its DETAIL (deadlock.c DeadLockReport)."""
    queries = {int(p): q for p, q in _QUERY.findall(detail)}
    return tuple(
        CycleStep(int(pid), mode, parse_tag(tag), int(by), queries.get(int(pid)))
        for pid, mode, tag, by in _CYCLE.findall(detail)
    )


def _pids(text: str) -> tuple[int, ...]:
    return tuple(map(int, text.replace(",", " ").split()))


@lru_cache(maxsize=1024)  # asked twice of each DETAIL (naming holders, then the tally)
def holders_of(detail: str) -> tuple[int, ...]:
    """The pids a wait's DETAIL lists as holding the lock."""
    listed = _HOLDERS.search(detail)
    return () if listed is None else _pids(listed.group(1))


_MILLISECONDS = {f"{n:03d}": timedelta(milliseconds=n) for n in range(1000)}


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
    if text[19:20] != ".":
        return moment
    # the moment is a whole second, so adding the fraction gives what replace(microsecond=...)
    # would, for less; %m's three digits (and no more) come from a table of milliseconds
    millis = _MILLISECONDS.get(text[20:23])
    if millis is not None and not text[23:24].isdecimal():
        return moment + millis
    fraction = _DIGITS.match(text, 20)
    if fraction is None:
        return moment
    return moment + timedelta(0, 0, int((fraction.group() + "000000")[:6]))


@lru_cache(maxsize=256)  # a log's lines share their second by the hundred: parsed once
def _second(whole: str) -> datetime | None:
    if _SECOND.fullmatch(whole) is None:
        return None
    try:
        return datetime.strptime(whole.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
