"""Lines to the entries that may concern locks: a stderr entry's DETAIL, STATEMENT and
CONTEXT lines joined to it by pid (and a tab-continued line to the line before it), csvlog
and jsonlog records read when they may concern locks; who each session is (user, database,
application), to name a lock's holders. Imports ``lines``, ``messages`` and ``formats``.
"""

from __future__ import annotations

import csv
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice

from lockdiag.errors import InputError
from lockdiag.logs.formats import (
    CSV_HEAD,
    LogFormat,
    NotALog,
    Pending,
    clip,
    csv_row,
    detect,
    first_character,
    json_identity,
    json_record,
    pid_pattern,
    prefix_pattern,
    prefix_splits,
    text_of,
)
from lockdiag.logs.lines import DETECT_BYTES, HEAD_BATCHES, MAX_LINE, Damage, LogLines, byte_size
from lockdiag.logs.messages import (
    CONTINUATIONS,
    ENGLISH_SEVERITIES,
    NAME_MAX,
    PID_MAX,
    TEXT_MAX,
    Entry,
    Identity,
    Malformed,
    holders_of,
    identity_of,
    interesting,
    parse_time,
    wait_of,
)

DETECT_LINES = 200  # lines looked at to tell the format and the prefix
PID_MEMORY = 50_000  # sessions whose user and application are remembered (for holders)


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


BATCH_LINES = 4096
# lines after which an entry's DETAIL and STATEMENT are not awaited: the server writes them with
# the message in one write (elog.c send_message_to_server_log), so they follow it at once
PENDING_LINES = 200
RECENT_LINES = 4096  # lines after which a holder not found is looked for again
RECENT_BATCHES = 2  # batches kept to name a lock's holders (their latest line): 4096 lines or more
SAMPLE_EVERY = 64  # one line in so many is read whole, for the language of the messages
# look-backs for holders look at no more than so many recent lines per line read (and a first
# LOOK_BACK_SLACK): linear time when every wait names holders never seen (a crafted log took
# 47 s for 5 MB); a real log's few unknown holders, each looked for once in RECENT_LINES, use
# a small part of it
LOOK_BACK_RATIO = 16
LOOK_BACK_SLACK = 16 * RECENT_LINES


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
        self._scanned = 0  # recent lines looked at for holders (LOOK_BACK_RATIO)

    def __iter__(self) -> Iterator[Entry]:
        name = self.counts.name
        head, ended = self._head()
        if not head:
            damage = self.counts.damage.summary()
            if ended and not damage:
                return  # an empty file (a log just rotated)
            where = "" if ended else f" in its first {byte_size(DETECT_BYTES)}"
            raise NotALog(
                f"{name}: not a PostgreSQL log: no line of text{where}"
                + (f" ({damage})" if damage else "")
            )
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
        """The lines (records) kept for naming holders, the latest first (each batch counted
        in ``_scanned`` as it is begun)."""
        for batch in reversed(self._recent):
            self._scanned += len(batch)
            yield from reversed(batch)

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

    def _stderr(  # noqa: PLR0915 - one loop for every line: a call per line costs more than its work
        self, batches: Iterable[list[str]], prefix: str
    ) -> Iterator[Entry]:
        """Entries of a stderr log: a line with the prefix starts one, or continues the
        pending entry of its pid (DETAIL, STATEMENT, CONTEXT); a line starting with a tab
        continues the line before it (elog.c writes a message's line breaks as "\\n\\t").

        Every line gets a cheap test (its first character, and a look for the words of a lock
        message); the whole prefix is read only for a line that may concern locks, one that
        may continue such an entry, the first lines and one line in SAMPLE_EVERY (for the
        language of the messages)."""
        counts = self.counts
        pending: dict[int, Pending] = {}
        last: Pending | None = None  # the entry the previous line belonged to
        latest: Pending | None = None  # the entry read last, while it is pending
        quick, full = pid_pattern(prefix).match, prefix_pattern(prefix).match
        starts = first_character(prefix)
        recent = self._recent
        splits = prefix_splits(prefix)
        number = 0
        for batch in batches:
            recent.append(batch)
            self._lines_read = number + len(batch)
            for raw in batch:
                number += 1
                if raw[:1] == "\t":  # cheaper than startswith, on every line
                    if last is not None:
                        last.extend(raw[1:].rstrip("\r\n"))
                    continue
                last = None
                if pending and number & 63 == 0:
                    yield from self._aged(pending, number)
                    if latest is not None and pending.get(latest.pid) is not latest:
                        latest = None
                if latest is not None and raw.startswith(latest.head):
                    # a wait's STATEMENT (not kept) and DETAIL, as Pending.add takes them, told
                    # without the severity's end found: most lines of a log of waits (a wait
                    # and its end have a STATEMENT each, the wait alone a DETAIL: looked for last)
                    size = latest.size
                    if raw.startswith("STATEMENT:  ", size) and latest.severity == "LOG":
                        latest.where, last = None, latest
                        continue
                    if raw.startswith("DETAIL:  ", size):
                        latest.detail = raw[size + 9 :].rstrip("\r\n")[:TEXT_MAX]
                        latest.where, last = "detail", latest
                        continue
                    colon = raw.find(":  ", size)
                    severity = raw[size:colon]
                    if colon > 0 and severity in CONTINUATIONS:
                        if latest.add(severity, raw, colon + 3):
                            last = latest
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
                split = splits.known(raw) if splits is not None else None
                if split is not None:
                    pid, time, severity, message, head, identity = split
                    found = None
                else:
                    found = full(raw.rstrip("\r\n"))
                    if found is None or found.group("pid") is None:
                        self._unreadable(raw, number)
                        continue
                    pid_text, time, severity, message = found.group(
                        "pid", "time", "severity", "text"
                    )
                    if severity in CONTINUATIONS:
                        last = pending.get(int(pid_text))
                        if last is not None and not last.add(severity, message):
                            last = None
                        continue
                    pid = int(pid_text)  # 10 digits at most (formats: the pid's pattern)
                    if pid > PID_MAX:
                        self._unreadable(raw, number)
                        continue
                counts.entries += 1
                done = pending.pop(pid, None)
                if done is latest:
                    latest = None  # no longer pending: a line starting as it did is read whole
                if severity not in ENGLISH_SEVERITIES:
                    self._foreign(severity, message)
                elif (said := wait_of(severity, message)) is not None or interesting(
                    severity, message
                ):
                    if found is not None:  # read whole: its head and session, and its split
                        head = found.string[: found.start("severity")]
                        identity = self._identity(found)
                        if splits is not None:
                            splits.learn(found, identity)
                    if self.identities.get(pid) is not identity:
                        self._remember(pid, identity)
                    last = latest = pending[pid] = Pending(
                        head, time, severity, message, pid, identity, number, said
                    )
                if done is not None:
                    yield self._named(done.entry())
            if pending:
                yield from self._aged(pending, number)
        counts.lines = number
        for rest in pending.values():
            yield self._named(rest.entry())

    @staticmethod
    def _pid(quick: Callable[[str], re.Match[str] | None], raw: str) -> int | None:
        head = quick(raw)
        return int(head.group("pid")) if head is not None and head.group("pid") else None

    def _aged(self, pending: dict[int, Pending], number: int) -> Iterator[Entry]:
        """Entries whose DETAIL and STATEMENT lines had every chance to come (PostgreSQL
        writes them with the message; only a log without the collector interleaves).
        ``pending`` holds its entries in the order they were read (an entry goes in only
        after its pid's last one is taken out), so the aged ones come first: the look stops
        at the first that is not (it looked at every one, every 64 lines)."""
        aged = []
        for pid, entry in pending.items():
            if number - entry.line <= PENDING_LINES:
                break
            aged.append(pid)
        for pid in aged:
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
            identity = identity_of(
                *(
                    value.rstrip(" ") if value else value  # a padded value (%-20a) ends in spaces
                    for value in map(named.get, ("user", "database", "application"))
                )
            )
            if all(value is None or len(value) <= NAME_MAX for value in values):
                self._identities[said] = identity  # longer (not a server's): not kept as a key
        return identity

    def _named(self, entry: Entry) -> Entry:
        """Before an entry leaves: who its lock's holders are, from their latest lines."""
        if entry.detail:
            try:
                holders = holders_of(entry.detail)
            except Malformed:
                return entry  # the tally counts it with the lines not read
            for pid in holders:
                if (
                    pid not in self.identities
                    and self._lines_read - self._looked.get(pid, -RECENT_LINES) >= RECENT_LINES
                    and self._scanned <= LOOK_BACK_RATIO * self._lines_read + LOOK_BACK_SLACK
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
                    record = json_record(raw)
                    if record is not None:
                        self._remember(pid, json_identity(record))
                    return
            return
        if self.counts.format == "csvlog":
            wanted = str(pid)
            for raw in self._recent_lines():
                if f",{wanted}," in raw and (row := csv_row(raw)) is not None and row[3] == wanted:
                    self._remember(pid, identity_of(row[1], row[2], row[22]))
                    return
            return
        if self.counts.format != "stderr" or self._prefix_text is None:
            return
        quick, full = pid_pattern(self._prefix_text).match, prefix_pattern(self._prefix_text).match
        wanted = str(pid)
        for raw in self._recent_lines():
            if wanted not in raw:  # cheap: most recent lines are another pid's
                continue
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
                    if not CSV_HEAD.match(line):
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
        row = csv_row(record)
        if row is None:
            if record.strip():
                counts.unparsed += 1
            return None
        counts.entries += 1
        pid, severity, message = int(row[3]), row[11], row[13]
        identity = identity_of(row[1], row[2], row[22])
        self._remember(pid, identity)
        if severity not in ENGLISH_SEVERITIES:
            self._foreign(severity, message)
            return None
        if not interesting(severity, message):
            return None
        return Entry(
            parse_time(row[0]),
            pid,
            identity,
            severity,
            message[:TEXT_MAX],
            clip(row[14]),
            clip(row[19]),
            clip(row[18]),
        )

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
            record = json_record(line)
            if record is None:
                counts.entries -= 1
                counts.unparsed += 1
                continue
            severity = text_of(record.get("error_severity")) or ""
            message = text_of(record.get("message")) or ""
            if severity not in ENGLISH_SEVERITIES:
                self._foreign(severity, message)
                continue
            pid = record["pid"]
            if interesting(severity, message) and isinstance(pid, int):
                identity = json_identity(record)
                self._remember(pid, identity)
                yield self._named(
                    Entry(
                        parse_time(text_of(record.get("timestamp"))),
                        pid,
                        identity,
                        severity,
                        message[:TEXT_MAX],
                        clip(record.get("detail")),
                        clip(record.get("statement")),
                        clip(record.get("context")),
                    )
                )
        counts.lines = number


def _handed_over(batches: list[list[str]]) -> Iterator[list[str]]:
    """The batches in order, each let go of as it is given (the list is emptied)."""
    batches.reverse()
    while batches:
        yield batches.pop()
