"""PostgreSQL's own log, read after the incident: lock waits, deadlocks and timeouts.

It reads a stream of bytes it is given (a file, a FIFO, standard input; plain or gzip) and
aggregates as it reads, in memory flat in the log's size whatever it holds (every per-session,
per-wait and per-key state is bounded in number; a number out of its range makes an entry one
that could not be read). The messages read are PostgreSQL's own, in English: a log written
with another ``lc_messages`` is detected and said, never misread. Three formats: ``stderr``
(with a ``log_line_prefix``, detected or given), ``csvlog`` and ``jsonlog`` (PostgreSQL 15+).

The modules, in the order the data moves through them; each imports only those before it:

- ``lines``: bytes to lines of text, bounded whatever the input (imports nothing of lockdiag);
- ``messages``: what the lock messages say (entries, lock tags, waits, deadlock cycles, times);
- ``formats``: telling the formats apart, the prefix's regular expressions (and where a session's
  lock lines split), a stderr entry as its lines are joined, csv and json records;
- ``events``: lines to entries, a stderr entry's DETAIL and STATEMENT joined to it by pid;
- ``tally``: entries to per-key totals and episodes, deadlocks and cancellations, bounded;
- ``report``: naming and the report, the only module that reads ``lockdiag.core`` (analysis,
  catalogue) and the registry.

Besides each other they may import ``lockdiag.errors`` and ``lockdiag.keys``; never a server, the
command line or a screen (``tests/test_architecture.py``). The names below are the room's
public ones.
"""

from lockdiag.logs.events import LogReader, ReadCounts
from lockdiag.logs.formats import COMMON_PREFIXES, NotALog, detect, pid_pattern, prefix_pattern
from lockdiag.logs.lines import (
    CHUNK,
    DETECT_BYTES,
    GZIP_FLOOR,
    GZIP_RATIO,
    MAX_LINE,
    Damage,
    LogLines,
    Stretch,
    byte_size,
)
from lockdiag.logs.messages import (
    CycleStep,
    Entry,
    Identity,
    LockTag,
    Malformed,
    parse_tag,
    parse_time,
    parse_wait,
)
from lockdiag.logs.report import KeyReport, LogReport, Names, NamespaceTotal, relation_oids, report
from lockdiag.logs.tally import (
    DATABASE_NAMES,
    OPEN_HOLDERS,
    OPEN_WAITS,
    Cancellation,
    Deadlock,
    Episode,
    KeyTally,
    Tally,
)

__all__ = [
    "CHUNK",
    "COMMON_PREFIXES",
    "DATABASE_NAMES",
    "DETECT_BYTES",
    "GZIP_FLOOR",
    "GZIP_RATIO",
    "MAX_LINE",
    "OPEN_HOLDERS",
    "OPEN_WAITS",
    "Cancellation",
    "CycleStep",
    "Damage",
    "Deadlock",
    "Entry",
    "Episode",
    "Identity",
    "KeyReport",
    "KeyTally",
    "LockTag",
    "LogLines",
    "LogReader",
    "LogReport",
    "Malformed",
    "Names",
    "NamespaceTotal",
    "NotALog",
    "ReadCounts",
    "Stretch",
    "Tally",
    "byte_size",
    "detect",
    "parse_tag",
    "parse_time",
    "parse_wait",
    "pid_pattern",
    "prefix_pattern",
    "relation_oids",
    "report",
]
