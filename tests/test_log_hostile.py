"""`lockdiag log` on hostile numbers and on a log made to fill its per-wait state.

A pid past an int, an oid past 32 bits, a wait's figure of thousands of digits or past 30 years,
a time in the year 1: read as a line that could not be read (counted) or as no time, never a
traceback (int() refuses more than 4300 digits, float() gives inf, timedelta overflows, orjson
refuses an integer past 64 bits), in the three formats. The waits open at once are bounded
(tally.OPEN_WAITS), the overflow said in every output; the look-back for holders is linear.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockdiag.logs import LogLines, LogReader, NotALog, Tally, report, tally
from lockdiag.logs import events as events_module
from lockdiag.registry import Registry
from lockdiag.render import render
from lockdiag.views.log import log_data, log_output

STAMP = "2026-05-01 03:10:00.123 UTC"
WAIT = "process {pid} still waiting for ExclusiveLock on {tag} after {after} ms"
TAG = "advisory lock [5,4102,{key},2]"
HOLDERS = "Process holding the lock: {holder}. Wait queue: {pid}."

Record = tuple[str, str, str, str, str]  # time, pid, severity, message, detail


def _stderr(records: list[Record]) -> str:
    lines = []
    for time, pid, severity, message, detail in records:
        head = f"{time} [{pid}] app@shop/web "
        lines.append(f"{head}{severity}:  {message}\n")
        if detail:
            lines.append(f"{head}DETAIL:  {detail}\n")
    return "".join(lines)


def _csvlog(records: list[Record]) -> str:
    out = io.StringIO()
    for time, pid, severity, message, detail in records:
        row = io.StringIO()
        csv.writer(row, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n").writerow(
            ["app", "shop", 0, "h", "6b0f19be.1", 1, "SELECT", "2026-05-01 03:00:00 UTC",
             "3/2", 0, severity, "00000", message, detail, "", "", "", "", "", "", "", "web",
             "client backend", "", 0]
        )  # fmt: skip
        # the pid bare, as the server writes it (the writer would quote it as text)
        out.write(f"{time}," + row.getvalue().replace(",0,", f",{pid},", 1))
    return out.getvalue()


def _jsonlog(records: list[Record]) -> str:
    lines = []
    for time, pid, severity, message, detail in records:
        body = json.dumps({"error_severity": severity, "message": message, "detail": detail})
        lines.append(f'{{"timestamp":{json.dumps(time)},"pid":{pid},{body[1:]}\n')
    return "".join(lines)


FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "stderr": _stderr,
    "csvlog": _csvlog,
    "jsonlog": _jsonlog,
}


def _wait(pid: object, key: object = 73, after: str = "1000.5", time: str = STAMP) -> Record:
    tag = TAG.format(key=key)
    return (time, str(pid), "LOG", WAIT.format(pid=pid, tag=tag, after=after),
            HOLDERS.format(holder=9, pid=pid))  # fmt: skip


def _tagged(tag: str) -> Record:
    return (STAMP, "5555", "LOG", WAIT.format(pid=5555, tag=tag, after="1"), "")


GOOD = [_wait(800 + n, key=100 + n) for n in range(5)]
HUGE = "9" * 5000  # past int()'s 4300 digits
CASES: dict[str, list[Record]] = {
    "pid past an int": [_wait(2**31, key=7)],
    "pid past 64 bits": [_wait(2**70, key=7)],
    "pid of 5000 digits": [_wait(HUGE, key=7)],
    "the message's pid of 5000 digits": [
        (STAMP, "5555", "LOG", WAIT.format(pid=HUGE, tag=TAG.format(key=7), after="1"), "")
    ],
    "a wait of 400 digits (inf)": [_wait(5555, key=7, after="9" * 400 + ".5")],
    "a wait of 5000 digits": [_wait(5555, key=7, after=HUGE)],
    "a wait past 30 years": [_wait(5555, key=7, after="2000000000000.0")],
    "a database oid past 32 bits": [_tagged(f"advisory lock [{2**40},1,7,2]")],
    "a classid of 5000 digits": [_wait(5555, key=f"{HUGE},7")],
    "an objsubid past 16 bits": [_tagged("advisory lock [5,1,7,65536]")],
    "a relation of 5000 digits": [_tagged(f"relation {HUGE} of database 5")],
    "a holder past 64 bits": [
        (*_wait(5555, key=7)[:4], HOLDERS.format(holder=2**70, pid=5555)),
    ],
    "a holder of 5000 digits": [
        (*_wait(5555, key=7)[:4], HOLDERS.format(holder=HUGE, pid=5555)),
    ],
    "a deadlock's pid of 5000 digits": [
        (
            STAMP,
            "5555",
            "ERROR",
            "deadlock detected",
            f"Process {HUGE} waits for ShareLock on transaction 5; blocked by process 9.",
        ),
    ],
    "a tag of 300 characters": [_wait(5555, key="7" + "0" * 290)],
}


def _read(text: str) -> tuple[Tally, LogReader]:
    counted = Tally()
    reader = LogReader(LogLines(io.BytesIO(text.encode()), "hostile"), "hostile")
    counted.read(reader)
    return counted, reader


def _rendered(counted: Tally) -> dict[str, Any]:
    """The report in every format (a traceback would be the test's failure); its JSON."""
    done = report(counted, Registry())
    for fmt in ("plain", "markdown", "csv"):
        render(log_output(done), fmt, io.StringIO())
    data = log_data(done)
    out = io.StringIO()
    render(log_output(done), "json", out)
    assert json.loads(out.getvalue())["keys"] == json.loads(json.dumps(data["keys"]))
    return data


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES)
def test_a_number_out_of_range_is_a_line_not_read(fmt: str, case: str) -> None:
    """Every such entry counted with the lines that could not be read, the waits around it
    read; each gave a traceback before (ValueError past 4300 digits, OverflowError from inf,
    orjson's TypeError past 64 bits in JSON, in the text view's int(inf))."""
    counted, reader = _read(FORMATS[fmt](GOOD + CASES[case] + GOOD))
    data = _rendered(counted)
    keys = data["keys"]
    assert {key["lock"] for key in keys} == {TAG.format(key=100 + n) for n in range(5)}
    assert sum(key["waits"] for key in keys) == 5
    assert reader.counts.unparsed >= 1
    assert data["deadlock_count"] == 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("year", ["0001", "0999"])
def test_a_time_before_the_year_1000_is_read_as_none(fmt: str, year: str) -> None:
    """A wait's start is its time less its figure: in the year 1 that was an OverflowError."""
    counted, _ = _read(FORMATS[fmt]([_wait(5555, key=7, time=f"{year}-01-01 00:00:00.000 UTC")]))
    (key,) = _rendered(counted)["keys"]
    assert key["waits"] == 1 and key["first_seen"] is None


def test_a_csvlog_pid_of_other_digits_is_a_line_not_read() -> None:
    """'²' passes str.isdigit(), int() refuses it: a ValueError before."""
    counted, reader = _read(_csvlog([*GOOD, _wait("²", key=7), *GOOD]))
    assert sum(k["waits"] for k in _rendered(counted)["keys"]) == 5
    assert reader.counts.unparsed == 1


NUMBERS = st.one_of(
    st.integers(-(2**80), 2**80).map(str),
    st.sampled_from(["9" * 4301, "9" * 400 + ".5", "1e400", "nan", "inf", "-0", "²", "٣", ""]),
    st.text(alphabet="0123456789.,-e ", max_size=30),
)


VERBS = [
    "still waiting for",
    "acquired",
    "detected deadlock while waiting for",
    "avoided deadlock for",
    "could not obtain",
]


@st.composite
def _hostile(draw: st.DrawFn) -> Record:
    pid, key, after, holder = draw(NUMBERS), draw(NUMBERS), draw(NUMBERS), draw(NUMBERS)
    year = draw(st.sampled_from(["2026", "0001", "9999", "99999", "0000"]))
    time = f"{year}-12-31 23:59:59.{draw(st.sampled_from(['999', '000', '5']))} UTC"
    tag = draw(
        st.sampled_from(
            [TAG, "relation {key} of database {key}", "advisory lock [{key},{key},{key},{key}]",
             "transaction {key}", "object {key} of class {key} of database {key}",
             "tuple ({key},{key}) of relation {key} of database {key}"]
        )
    ).format(key=key)  # fmt: skip
    verb = draw(st.sampled_from(VERBS))
    message = draw(
        st.sampled_from(
            [f"process {pid} {verb} ExclusiveLock on {tag} after {after} ms",
             "deadlock detected", "canceling statement due to lock timeout",
             f"process {pid} {verb} {'x' * draw(st.integers(0, 300))} on {tag}"]
        )
    )  # fmt: skip
    detail = draw(
        st.sampled_from(
            [HOLDERS.format(holder=holder, pid=pid),
             f"Processes holding the lock: {holder}, {pid}. Wait queue: {holder}.",
             f"Process {pid} waits for ShareLock on {tag}; blocked by process {holder}.\n"
             f"Process {holder}: SELECT 1", draw(st.text(max_size=50))]
        )
    )  # fmt: skip
    severity = draw(st.sampled_from(["LOG", "ERROR", "LOG"]))
    return (time, draw(st.sampled_from([pid, "812", str(2**31)])), severity, message, detail)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(list(FORMATS)), st.lists(_hostile(), max_size=12), st.binary(max_size=60))
def test_hostile_entries_never_raise(fmt: str, records: list[Record], junk: bytes) -> None:
    """Entries with numbers of every size and shape, times of any year, long modes, among
    real waits and bytes of anything, in each format: read, counted or refused with one line
    (a log none of whose lines can be read), never an exception."""
    text = FORMATS[fmt]([*GOOD[:2], *records, *GOOD[2:]]).encode() + junk + b"\n"
    counted = Tally()
    try:
        counted.read(LogReader(LogLines(io.BytesIO(text), "fuzz"), "fuzz"))
    except NotALog as error:
        assert "\n" not in str(error)
        return
    _rendered(counted)


def _never_ending(waits: int, first_pid: int = 100) -> str:
    """Waits that never end, each with its own pid, key and holder (bench/log.py --distinct)."""
    return _stderr(
        [(STAMP, str(first_pid + n), "LOG",
          WAIT.format(pid=first_pid + n, tag=TAG.format(key=n), after="1000.5"),
          HOLDERS.format(holder=4_000_000 + n, pid=first_pid + n)) for n in range(waits)]
    )  # fmt: skip


def test_the_waits_open_at_once_are_bounded_and_the_overflow_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bound of 100 open waits and 2,000 waits that never end: at most 100 held at any
    time (every one before: 2 million took 2 GB), every wait counted, those closed early said
    in the JSON and in the notes of every text format."""
    monkeypatch.setattr(tally, "OPEN_WAITS", 100)
    counted = Tally()
    reader = LogReader(LogLines(io.BytesIO(_never_ending(2000).encode()), "open"), "open")
    most = 0
    counted.reads.append(reader.counts)
    reader.identities = counted.identities
    for entry in reader:
        counted.add(entry)
        most = max(most, len(counted.open))
    assert most == 100
    done = report(counted, Registry())
    assert sum(k.tally.waits for k in done.keys) == 2000
    assert sum(k.tally.outcomes["no end logged"] for k in done.keys) == 2000
    assert done.waits_closed_early == counted.closed_early
    assert 1900 <= done.waits_closed_early < 2000
    assert log_data(done)["waits_closed_early"] == done.waits_closed_early
    for fmt in ("plain", "markdown"):
        out = io.StringIO()
        render(log_output(done), fmt, out)
        assert f"{done.waits_closed_early} wait(s) closed while open" in out.getvalue()


def test_the_holders_of_open_waits_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wait naming 50 holders: at most OPEN_HOLDERS listed by the open waits (each
    wait's holders had no bound: 100,000 open waits of 3,000 holders, gigabytes)."""
    monkeypatch.setattr(tally, "OPEN_HOLDERS", 1000)
    holders = ", ".join(str(5000 + n) for n in range(50))
    records = [
        (STAMP, str(100 + n), "LOG", WAIT.format(pid=100 + n, tag=TAG.format(key=n), after="1"),
         f"Processes holding the lock: {holders}. Wait queue: {100 + n}.") for n in range(500)
    ]  # fmt: skip
    counted = Tally()
    reader = LogReader(LogLines(io.BytesIO(_stderr(records).encode()), "h"), "h")
    reader.identities = counted.identities
    most = 0
    for entry in reader:
        counted.add(entry)
        listed = sum(len(wait.holders) for wait in counted.open.values())
        assert listed <= counted.holders_added
        most = max(most, listed)
    assert 900 <= most <= 1000 and counted.closed_early > 0
    assert sum(k.tally.waits for k in report(counted, Registry()).keys) == 500


def test_looking_back_for_holders_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wait naming a holder never seen: the look-backs look at no more lines than
    LOOK_BACK_RATIO per line read (and a first LOOK_BACK_SLACK); 20,000 such waits took 47 s
    before (8,000 lines looked at for each), 1 s now."""
    monkeypatch.setattr(events_module, "LOOK_BACK_SLACK", 100)
    counted, reader = _read(_never_ending(3000))
    assert reader._scanned <= events_module.LOOK_BACK_RATIO * reader.counts.lines + 100 + 2**13
    assert sum(k.tally.waits for k in report(counted, Registry()).keys) == 3000
