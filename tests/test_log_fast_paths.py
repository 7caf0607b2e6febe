"""The log reader's fast paths read what the slow ones read.

A wait message's common shape is read by a cheaper pattern than the general one; a line that
continues the entry read last (same prefix text) is joined without its prefix read again; a
lock line whose text from its pid to its message is its session's last one's is split as that
one was (formats.Splits); a log line's time is cut without a regular expression. Each is
checked here against the path it short-cuts, on the messages PostgreSQL writes and on crafted
ones.
"""

from __future__ import annotations

import re
from contextlib import suppress
from datetime import datetime
from operator import attrgetter
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from lockdiag.logs import (
    Entry,
    Identity,
    KeyTally,
    LockTag,
    LogReader,
    Malformed,
    Tally,
    parse_time,
    parse_wait,
)
from lockdiag.logs.formats import Splits
from lockdiag.logs.messages import _WAIT, INTERESTING_ERRORS, PID_MAX, _pids, interesting

VERBS = ("still waiting for", "acquired", "avoided deadlock for",
         "detected deadlock while waiting for", "could not obtain")  # fmt: skip
ENDINGS = (" by rearranging queue order", " after 12.5 ms", " after 7 ms", " at character 9",
           " after ms", " after 1.2.3 ms", " ms", "\n", " after 3 ms\n", "")  # fmt: skip
TAGS = ("advisory lock [5,4102,4,2]", "relation 16384 of database 5", "transaction 801",
        "tuple (0,1) of relation 16390 of database 5", "x after 5 ms", "a\nb", "", " ")  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    verb=st.sampled_from(VERBS),
    mode=st.sampled_from(("ExclusiveLock", "ShareLock", "")),
    tag=st.one_of(st.sampled_from(TAGS), st.text(max_size=30)),
    endings=st.lists(st.sampled_from(ENDINGS), max_size=3),
)
def test_a_wait_message_is_read_as_the_general_pattern_reads_it(
    verb: str, mode: str, tag: str, endings: list[str]
) -> None:
    message = f"process 4242 {verb} {mode} on {tag}{''.join(endings)}"
    general = _WAIT.match(message)
    assert parse_wait(message) == (None if general is None else general.groups())


# the test interesting() once made with a regular expression: a search tried at every character
_WAIT_VERB = re.compile(
    " still waiting for | acquired | avoided deadlock | detected deadlock | could not obtain "
)


@settings(max_examples=400, deadline=None)
@given(
    severity=st.sampled_from(("LOG", "ERROR", "FATAL", "DETAIL", "LOG ")),
    parts=st.lists(
        st.one_of(st.sampled_from(("process ", "process 7", *VERBS, " ", "acquired")), st.text()),
        max_size=6,
    ),
)
def test_a_lock_message_is_told_as_the_regular_expression_told_it(
    severity: str, parts: list[str]
) -> None:
    message = "".join(parts)
    expected = (
        message.startswith("process ") and _WAIT_VERB.search(message) is not None
        if severity == "LOG"
        else severity in ("ERROR", "FATAL") and message in INTERESTING_ERRORS
    )
    assert interesting(severity, message) == expected
    for verb in VERBS:
        said = f"process 7 {verb} ExclusiveLock on advisory lock [5,4102,4,2] after 10.077 ms"
        assert interesting("LOG", said)


def test_the_wait_messages_postgres_writes() -> None:
    tag = "advisory lock [5,4102,4,2]"
    assert parse_wait(f"process 7 still waiting for ShareLock on {tag} after 1000.112 ms") == (
        "7", "still waiting for", "ShareLock", tag, "1000.112"
    )  # fmt: skip
    rearranged = f"process 7 avoided deadlock for ShareLock on {tag} by rearranging queue order"
    assert parse_wait(f"{rearranged} after 10.5 ms") == (
        "7", "avoided deadlock for", "ShareLock", tag, "10.5"
    )  # fmt: skip
    assert parse_wait(f"process 7 could not obtain ShareLock on {tag}") == (
        "7", "could not obtain", "ShareLock", tag, None
    )  # fmt: skip
    assert parse_wait("process 7 exited") is None


def _log(line_prefix: str) -> list[str]:
    """A log as a server writes it, with ``line_prefix`` ("{line}" its %l): waits, a deadlock,
    and two sessions whose lines interleave (a server without the logging collector)."""
    written: list[str] = []

    def write(pid: int, ms: int, severity: str, text: str) -> None:
        prefix = line_prefix.format(ms=ms, pid=pid, line=len(written) + 1)
        written.append(f"{prefix}{severity}:  {text}\n")

    tag = "advisory lock [5,4102,{},2]"
    write(11, 100, "LOG", f"process 11 still waiting for ExclusiveLock on {tag.format(1)} after "
          "1000.100 ms")  # fmt: skip
    write(11, 100, "DETAIL", "Process holding the lock: 9. Wait queue: 11.")
    write(11, 100, "STATEMENT", "SELECT pg_advisory_lock(4102, 1);")
    written.append("\t-- a statement of two lines\n")
    write(12, 101, "LOG", f"process 12 still waiting for ShareLock on {tag.format(2)} after "
          "1000.200 ms")  # fmt: skip
    write(13, 101, "LOG", f"process 13 still waiting for ShareLock on {tag.format(3)} after "
          "1000.300 ms")  # fmt: skip
    write(12, 101, "DETAIL", "Process holding the lock: 8. Wait queue: 12.")
    write(13, 101, "DETAIL", "Process holding the lock: 7. Wait queue: 13.")
    write(13, 101, "HINT", "a hint is not kept")
    written.append("\tnor the line that continues it\n")
    write(13, 101, "CONTEXT", 'SQL function "take" statement 1')
    write(11, 900, "LOG", f"process 11 acquired ExclusiveLock on {tag.format(1)} after "
          "1800.000 ms")  # fmt: skip
    write(11, 900, "STATEMENT", "SELECT pg_advisory_lock(4102, 1);")
    write(14, 950, "ERROR", "deadlock detected")
    write(14, 950, "DETAIL", "Process 14 waits for ShareLock on transaction 5; blocked by "
          "process 15.")  # fmt: skip
    written.append("\tProcess 15 waits for ShareLock on transaction 6; blocked by process 14.\n")
    write(14, 950, "CONTEXT", 'while locking tuple (0,1) in relation "jobs"')
    write(14, 950, "STATEMENT", "UPDATE jobs SET state = 'done' WHERE id = 1;")
    write(16, 970, "LOG", f"process 16 still waiting for ShareLock on {tag.format(4)} after "
          "1000.400 ms")  # fmt: skip
    write(16, 970, "LOG", "duration: 0.5 ms")  # ends the wait's entry: what follows is not its
    write(16, 970, "DETAIL", "Process holding the lock: 6. Wait queue: 16.")
    write(15, 960, "LOG", "checkpoint starting: time")
    return written


def _entries(lines: list[str], line_prefix: str) -> list[Entry]:
    return list(LogReader(lines, "test.log", prefix=line_prefix))


def test_continuations_read_without_the_prefix_give_the_same_entries() -> None:
    same = _log("2026-05-01 03:10:00.{ms:03d} UTC [{pid}] app@shop ")
    numbered = _log("2026-05-01 03:10:00.{ms:03d} UTC [{pid}-{line}] app@shop ")
    fast = _entries(same, "%m [%p] %q%u@%d ")
    read_whole = _entries(numbered, "%m [%p-%l] %q%u@%d ")  # each line's prefix differs
    assert fast == read_whole
    by_pid = {(e.pid, e.message.split()[2] if e.severity == "LOG" else e.severity): e for e in fast}
    assert by_pid[11, "still"].detail == "Process holding the lock: 9. Wait queue: 11."
    assert by_pid[11, "still"].statement is None  # a wait's statement is not kept
    assert by_pid[12, "still"].detail == "Process holding the lock: 8. Wait queue: 12."
    assert by_pid[13, "still"].detail == "Process holding the lock: 7. Wait queue: 13."
    assert by_pid[16, "still"].detail is None
    assert by_pid[13, "still"].context == 'SQL function "take" statement 1'
    deadlock = by_pid[14, "ERROR"]
    assert deadlock.detail is not None and deadlock.detail.endswith("blocked by process 14.")
    assert deadlock.statement == "UPDATE jobs SET state = 'done' WHERE id = 1;"
    assert deadlock.context == 'while locking tuple (0,1) in relation "jobs"'


def test_a_prefix_with_its_time_after_the_pid_or_none_is_read() -> None:
    """'[%p] %m ': the pid pattern stops before the time, so no line is split by what an
    earlier one learnt (Splits read the time with it: an IndexError); '[%p] ': entries without
    a time (an IndexError before Splits too)."""
    later = _entries(_log("[{pid}] 2026-05-01 03:10:00.{ms:03d} UTC app@shop "), "[%p] %m %q%u@%d ")
    first = _entries(_log("2026-05-01 03:10:00.{ms:03d} UTC [{pid}] app@shop "), "%m [%p] %q%u@%d ")
    assert later == first
    timeless = _entries(_log("[{pid}] "), "[%p] ")
    assert [e.time for e in timeless] == [None] * len(first)
    kept = attrgetter("pid", "severity", "message", "detail", "statement", "context")
    assert list(map(kept, timeless)) == list(map(kept, first))


class _ReadWhole(Splits):
    """Splits that never know a line: every lock line is read by the whole prefix pattern."""

    def known(self, raw: str) -> None:
        return None


# values as a server may log them: spaces, the prefix's own separators, text like a severity
VALUES = st.text(alphabet="ab @/:-LOG", max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    sessions=st.lists(st.tuples(VALUES, VALUES, VALUES), min_size=1, max_size=3),
    lines=st.lists(
        st.tuples(
            st.integers(0, 3),  # the session (3: a line without the %q part, same pid)
            st.sampled_from(("LOG", "DETAIL", "ERROR", "STATEMENT")),
            st.sampled_from(("still waiting for", "acquired", "x@y/z q:  w", "")),
        ),
        max_size=12,
    ),
    prefix=st.sampled_from(("%m [%p] %q%u@%d/%a ", "%m [%p] %u@%d/%a ", "%m [%p] %q%u ")),
)
@example(  # a line without the %q part, then one that has it only as the pattern reads it
    sessions=[("u", "d", "a")],
    lines=[(3, "LOG", "still waiting for"), (3, "LOG", "x@y/z q:  w")],
    prefix="%m [%p] %q%u@%d/%a ",
)
def test_a_session_s_lock_lines_are_split_as_when_read_whole(
    sessions: list[tuple[str, str, str]], lines: list[tuple[int, str, str]], prefix: str
) -> None:
    written = []
    for number, (who, severity, verb) in enumerate(lines):
        pid = 10 + who % len(sessions)
        user, database, app = sessions[who % len(sessions)]
        values = prefix.split("] ", 1)[1].replace("%q", "")
        values = values.replace("%u", user).replace("%d", database).replace("%a", app)
        if who == 3 and "%q" in prefix:
            values = ""
        head = f"2026-05-01 03:10:00.{number:03d} UTC [{pid}] {values}"
        text = f"process {pid} {verb} ShareLock on advisory lock [5,4102,{who},2] after 10.5 ms"
        written.append(f"{head}{severity}:  {text if verb else 'Wait queue: 9.'}\n")
    split = LogReader(written, "t.log", prefix=prefix)
    split_entries = list(split)
    with mock.patch("lockdiag.logs.formats.Splits", _ReadWhole):
        whole = LogReader(written, "t.log", prefix=prefix)
        assert split_entries == list(whole)
    assert split.counts == whole.counts  # the foreign severities among them


@settings(max_examples=300, deadline=None)
@given(
    fraction=st.text(alphabet="0123456789\u0661\u0662x .", max_size=8),
    zone=st.sampled_from(("", " UTC")),
)
def test_a_fraction_of_a_second_is_read_as_its_digits_say(fraction: str, zone: str) -> None:
    """%m's three digits are looked up in a table: any other fraction (more digits, fewer,
    digits of another script) is read as the general path reads it."""
    text = f"2026-05-01 03:10:00.{fraction}{zone}"
    digits = re.compile(r"\d+").match(text, 20)
    second = datetime(2026, 5, 1, 3, 10, 0)
    expected = (
        second
        if digits is None
        else second.replace(microsecond=int((digits.group() + "000000")[:6]))
    )
    assert parse_time(text) == expected


def test_times_as_the_server_writes_them() -> None:
    assert parse_time("2026-05-01 03:10:00.123 UTC") == datetime(2026, 5, 1, 3, 10, 0, 123000)
    assert parse_time("2026-05-01T03:10:00.1234567") == datetime(2026, 5, 1, 3, 10, 0, 123456)
    assert parse_time("2026-05-01 03:10:00 CEST") == datetime(2026, 5, 1, 3, 10, 0)
    assert parse_time("2026-05-01 03:10:00.x") == datetime(2026, 5, 1, 3, 10, 0)
    assert parse_time("2026-05-01 03:10:00 05") == datetime(2026, 5, 1, 3, 10, 0)  # not a fraction
    assert parse_time("1777605000.250") == datetime.fromtimestamp(1777605000.25)
    assert parse_time("2026-13-01 03:10:00.123 UTC") is None
    assert parse_time("2026-05-01 3:10:00.123") is None
    assert parse_time("") is None


def _pids_split(text: str) -> tuple[int, ...]:
    """messages._pids's general path: the list split, each read by int()."""
    try:
        pids = tuple(map(int, text.replace(",", " ").split()))
    except ValueError:
        raise Malformed("a pid of thousands of digits") from None
    if pids and max(pids) > PID_MAX:
        raise Malformed(f"a pid past {PID_MAX}")
    return pids


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="0123456789, \u0663\u00b2", max_size=14))
@example(text="2147483647")
@example(text="2147483648")
@example(text="9999999999")
def test_a_list_of_pids_is_read_as_when_split(text: str) -> None:
    """One pid (what most waits name) is read without the list split."""
    try:
        expected: tuple[int, ...] | str = _pids_split(text)
    except Malformed as error:
        expected = str(error)
    try:
        got: tuple[int, ...] | str = _pids(text)
    except Malformed as error:
        got = str(error)
    assert got == expected


class _KeyedOnly(Tally):
    """A tally that finds each key's tally by its key only, never by the tag's text."""

    def _tally(self, tag: LockTag) -> KeyTally:
        self._by_text.clear()
        return super()._tally(tag)


@settings(max_examples=200, deadline=None)
@given(
    waits=st.lists(
        st.tuples(
            st.integers(10, 13),  # the pid
            st.integers(0, 6),  # the key
            st.booleans(),  # its database written with a leading zero: another text, same key
            st.sampled_from(("still waiting for", "acquired", "could not obtain")),
            st.sampled_from(("", "7", "7, 8", "8, 7, 8")),  # holders
        ),
        max_size=40,
    ),
    kept_keys=st.integers(1, 4),
)
def test_a_key_s_tally_found_by_its_text_is_the_one_its_key_finds(
    waits: list[tuple[int, int, bool, str, str]], kept_keys: int
) -> None:
    """Tally._tally finds a tag's tally by its text first; folding keys (kept_keys small)
    forgets the texts; holders merged (Tally: _merged) as the general path does."""
    tallies = Tally(kept_keys=kept_keys), _KeyedOnly(kept_keys=kept_keys)
    for number, (pid, key, zero, verb, holders) in enumerate(waits):
        tag = f"advisory lock [{'0' if zero else ''}5,4102,{key},2]"
        entry = Entry(
            datetime(2026, 5, 1, 3, 10, number),
            pid,
            Identity("u", "shop", "app"),
            "LOG",
            f"process {pid} {verb} ShareLock on {tag} after {number}.5 ms",
            f"Processes holding the lock: {holders}. Wait queue: {pid}." if holders else None,
        )
        for tally in tallies:
            tally.add(entry)
    for tally in tallies:
        tally.finish()
    by_text, keyed = tallies
    assert by_text.keys == keyed.keys
    assert by_text.folded == keyed.folded


def test_a_wait_message_read_by_the_reader_is_the_one_the_tally_reads() -> None:
    """The reader hands the tally its parse of a wait message (Entry.wait): the same parts
    the tally reads from the message itself, and the same tally."""
    lines = _log("2026-05-01 03:10:00.{ms:03d} UTC [{pid}] app@shop ")
    tag = "advisory lock [5,4102,9,2]"
    lines += [
        f"2026-05-01 03:10:01.000 UTC [21] app@shop LOG:  process {text}\n"
        for text in (
            f"21 avoided deadlock for ShareLock on {tag} by rearranging queue order after 10.5 ms",
            f"21 could not obtain ShareLock on {tag}",
            f"4294967296 still waiting for ShareLock on {tag} after 1.5 ms",  # Malformed
            "21 still waiting for nothing",  # a lock message that is not one
            f"21 acquired ShareLock on {tag} after 12.5 ms",
        )
    ]
    entries = _entries(lines, "%m [%p] %q%u@%d ")
    waits = [e for e in entries if e.severity == "LOG"]
    assert len(waits) == 10 and sum(e.wait is not None for e in waits) == 9
    assert all(e.wait == parse_wait(e.message) for e in waits)
    handed, read = Tally(), Tally()
    for entry in entries:
        for tally, one in ((handed, entry), (read, entry._replace(wait=None))):
            with suppress(Malformed):
                tally.add(one)
    for tally in (handed, read):
        tally.finish()
    assert handed.keys == read.keys and handed.deadlocks == read.deadlocks
