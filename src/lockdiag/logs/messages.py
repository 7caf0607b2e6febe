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

from lockdiag.keys import INT4_MAX, UINT4_MAX, AdvisoryTag, LockTriple, is_key_form

TEXT_MAX = 16 << 10  # characters kept of a message, DETAIL, STATEMENT or CONTEXT
# The numbers a lock message carries, bounded as the server writes them: a pid is an int
# (every platform's; Linux's pid_max is at most 4194304), an oid 32 bits unsigned, a wait's
# figure milliseconds of a wait shorter than 30 years. A number past its bound is no
# PostgreSQL message's: the entry is Malformed, skipped and counted with the lines that could
# not be read (int() refuses more than 4300 digits, float() gives inf, timedelta overflows).
PID_MAX = INT4_MAX
OID_MAX = UINT4_MAX
SUBID_MAX = 2**16 - 1  # a lock tag's field4 (objsubid) is 16 bits
WAITED_MAX_MS = 1e12  # about 31.7 years
TAG_MAX = 200  # characters of a lock tag (lmgr.c DescribeLockTag writes a few dozen)
EARLIEST_YEAR = 1000  # a time before is read as none: a wait's start is its time less its figure
NAME_MAX = 64  # characters kept of a user, database or application name (63 bytes: NAMEDATALEN)

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


class Malformed(ValueError):
    """A lock entry with a number out of its range (see PID_MAX): not the server's."""


def pid_of(digits: str) -> int:
    """A pid written in a message (digits, as the patterns read them), or Malformed."""
    if len(digits) > 10 or (pid := int(digits)) > PID_MAX:
        raise Malformed(f"pid {digits[:20]} is past {PID_MAX}")
    return pid


def oid_of(digits: str) -> int:
    """An oid written in a lock tag (digits), or Malformed."""
    if len(digits) > 10 or (oid := int(digits)) > OID_MAX:
        raise Malformed(f"oid {digits[:20]} is past {OID_MAX}")
    return oid


class Identity(NamedTuple):
    user: str | None
    database: str | None
    application: str | None


def identity_of(user: str | None, database: str | None, application: str | None) -> Identity:
    """A session's names as kept: an empty one as None, a long one (no server's) cut."""
    return Identity(
        user[:NAME_MAX] if user else None,
        database[:NAME_MAX] if database else None,
        application[:NAME_MAX] if application else None,
    )


WaitMessage = tuple[str, str, str, str, str | None]  # parse_wait's parts of a wait message


class Entry(NamedTuple):
    """One log entry that may concern locks, its DETAIL, STATEMENT and CONTEXT joined; a
    wait message as the reader read it (``wait_of``: the tally reads it when it is None)."""

    time: datetime | None
    pid: int | None
    identity: Identity
    severity: str
    message: str
    detail: str | None = None
    statement: str | None = None
    context: str | None = None
    wait: WaitMessage | None = None


# \d with the ASCII digits tried first, for the patterns every lock line meets: the same set
# (they are among \d's), but sre tries a set's items in order, and a range costs less than the
# Unicode table \d is looked up in (a fifth of a time and pid's pattern). DIGITS in a set.
DIGIT = r"[0-9\d]"
DIGITS = r"0-9\d"
_SECOND = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_DIGITS = re.compile(r"\d+")
# proc.c: "process %d still waiting for %s on %s after %ld.%03d ms" and its siblings
# the pid is an int (10 digits at most), the mode a word of 64 characters at most (the longest,
# ShareUpdateExclusiveLock, has 24): a message with more is no wait message (Malformed)
_WAIT_HEAD = (
    rf"process ({DIGIT}{{1,10}}) (still waiting for|acquired|avoided deadlock for|detected "
    r"deadlock while waiting for|could not obtain) (\S{1,64}) on "
)
_WAIT = re.compile(
    _WAIT_HEAD + r"(.+?)(?: by rearranging queue order)?(?: after (\d+(?:\.\d+)?) ms)?"
    r"(?: at character \d+)?$"
)
# the shape nearly every wait message has: its tag ends where the last " after " begins, and
# not with _WAIT's optional ending (a lookbehind, once " after " is found: before it, it would
# be tried at every character the tag gives back)
_REARRANGED = " by rearranging queue order"
_WAIT_AFTER = re.compile(
    _WAIT_HEAD + rf"([^\n]+) after (?<!{_REARRANGED} after )({DIGIT}+(?:\.{DIGIT}+)?) ms$"
)
_HOLDERS = re.compile(
    rf"Process(?:es)? holding the lock: ([{DIGITS}, ]*)[.,] Wait queue: [{DIGITS}, ]*\."
)
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


def parse_wait(message: str) -> WaitMessage | None:
    """A wait message's pid, verb, mode, tag and milliseconds, as ``_WAIT`` reads them.
    ``_WAIT``'s lazy tag tries its three optional endings at every character: the common shape
    ("... on <tag> after <n> ms") is read by ``_WAIT_AFTER`` first, at a third of the cost
    (the same parts: tests/test_log_fast_paths.py checks that the two agree)."""
    found = _WAIT_AFTER.match(message)
    if found is None:
        found = _WAIT.match(message)
    return None if found is None else found.groups()  # type: ignore[return-value]


def wait_of(severity: str, message: str) -> WaitMessage | None:
    """A LOG message's parts when it is a wait message: read once, by the reader, which
    needs to know whether it concerns locks (a wait message does: ``interesting``)."""
    return parse_wait(message) if severity == "LOG" else None


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
    """The lock a tag's text names; Malformed when a number is past its range, or the text
    longer than TAG_MAX (a tag kept as written is kept with each open wait)."""
    if len(text) > TAG_MAX:
        raise Malformed(f"a lock tag of {len(text)} characters")
    for kind, pattern in _TAGS:
        found = pattern.match(text)
        if found is None:
            continue
        named = found.groupdict()
        database = oid_of(named["db"]) if named.get("db") else None
        relation = oid_of(named["rel"]) if named.get("rel") else None
        if kind != "advisory":
            return LockTag(kind, text, database, relation)
        classid, objid, subid = oid_of(found.group(2)), oid_of(found.group(3)), found.group(4)
        objsubid = int(subid) if len(subid) <= 5 else SUBID_MAX + 1
        if objsubid > SUBID_MAX:
            raise Malformed(f"objsubid {subid[:20]} is past {SUBID_MAX}")
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
    """The steps of a deadlock's cycle, from its DETAIL (deadlock.c DeadLockReport);
    Malformed when a number is past its range."""
    queries = dict(_QUERY.findall(detail))
    return tuple(
        CycleStep(pid_of(pid), mode, parse_tag(tag), pid_of(by), queries.get(pid))
        for pid, mode, tag, by in _CYCLE.findall(detail)
    )


def _pids(text: str) -> tuple[int, ...]:
    """The pids of a list ("24247, 24250"); one pid, what most waits name, is read without
    the list split (tests/test_log_fast_paths.py reads lists both ways)."""
    if len(text) <= 10 and text.isdecimal():  # what int() reads, as the split would
        pid = int(text)
        if pid > PID_MAX:
            raise Malformed(f"a pid past {PID_MAX}")
        return (pid,)
    try:
        pids = tuple(map(int, text.replace(",", " ").split()))  # in C: not pid_of for each
    except ValueError:  # more than 4300 digits
        raise Malformed("a pid of thousands of digits") from None
    if pids and max(pids) > PID_MAX:
        raise Malformed(f"a pid past {PID_MAX}")
    return pids


@lru_cache(maxsize=1024)  # asked twice of each DETAIL (naming holders, then the tally)
def holders_of(detail: str) -> tuple[int, ...]:
    """The pids a wait's DETAIL lists as holding the lock; Malformed for one past PID_MAX."""
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
            epoch = datetime.fromtimestamp(float(text))  # %n: epoch seconds
        except (ValueError, OverflowError, OSError):
            return None
        return epoch if epoch.year >= EARLIEST_YEAR else None
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
        moment = datetime.strptime(whole.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return moment if moment.year >= EARLIEST_YEAR else None
