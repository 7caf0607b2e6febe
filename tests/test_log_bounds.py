"""`lockdiag log` bounded in memory and time, whatever the input: a gzip bomb, a sparse file,
one enormous line (through standard input), a device, a FIFO; and linear prefix regexes.

Peak memory is measured in a child process (its own rusage), against bounds far below what
reading such input whole takes (the 4 GiB bomb: a MemoryError at 5.3 GB; a 200 MB line: about
450 MB; a 200 MB sparse file: about 420 MB).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockdiag.logs import (
    CHUNK,
    COMMON_PREFIXES,
    DETECT_BYTES,
    GZIP_FLOOR,
    LogLines,
    LogReader,
    NotALog,
    Tally,
    pid_pattern,
    prefix_pattern,
    report,
)
from lockdiag.registry import Registry

PEAK_MB = 150  # the interpreter and lockdiag take about 45 MB before reading anything
HEAD = "2026-05-01 03:10:00.{ms:03d} UTC [{pid}] app@shop/web "
WAIT = (
    HEAD + "LOG:  process {pid} still waiting for ExclusiveLock on advisory lock "
    "[5,4102,{key},2] after 1000.5 ms\n"
    + HEAD + "DETAIL:  Process holding the lock: 9. Wait queue: {pid}.\n"
)  # fmt: skip


def _waits(keys: range) -> bytes:
    return "".join(WAIT.format(ms=k % 1000, pid=800 + k, key=k) for k in keys).encode()


# the child's peak RSS, read by a small launcher that forks it: a child forked from pytest itself
# would count pytest's own memory, which it shares until it execs
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _lockdiag(
    args: list[str], stdin: int | None = None, feed: Iterable[bytes] | None = None
) -> tuple[subprocess.CompletedProcess[bytes], float, float]:
    """(result, seconds, peak RSS in MB) of `lockdiag log` in a child; ``feed`` written to its
    standard input piece by piece, from a thread."""
    with tempfile.NamedTemporaryFile() as peak:
        command = [sys.executable, "-c", LAUNCHER, peak.name, "-m", "lockdiag", "log", *args]
        started = time.monotonic()
        child = subprocess.Popen(
            [*command, "--format", "json"],
            stdin=subprocess.PIPE if feed is not None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        writer = threading.Thread(target=_write, args=(child, feed), daemon=True)
        writer.start()
        out, err = child.communicate() if feed is None else _collect(child)
        writer.join(30)
        seconds = time.monotonic() - started
        kilobytes = int(Path(peak.name).read_text() or 0)
    result = subprocess.CompletedProcess(args, child.returncode, out, err)
    return result, seconds, kilobytes / 1024


def _write(child: subprocess.Popen[bytes], feed: Iterable[bytes] | None) -> None:
    if feed is None or child.stdin is None:
        return
    try:
        for piece in feed:
            child.stdin.write(piece)
    except BrokenPipeError:
        pass
    finally:
        child.stdin.close()


def _collect(child: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Standard output and error while a thread writes to standard input."""
    assert child.stdout is not None and child.stderr is not None
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    out = child.stdout.read()
    reader.join(60)
    child.wait(60)
    return out, b"".join(errors)


def _data(result: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_a_gzip_bomb_is_read_up_to_its_limit(tmp_path: Path) -> None:
    """4 MB of gzip inflating to 4 GiB of one line, after a real wait: the wait is read, the
    line skipped as it streams, inflating stops at GZIP_FLOOR; memory stays flat."""
    member = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = member.compress(b"a" * (64 << 20)) + member.flush()  # 64 MiB of one line
    path = tmp_path / "bomb.log.gz"
    with path.open("wb") as out:
        out.write(gzip.compress(_waits(range(3))))
        for _ in range(64):  # gzip members one after the other, as zcat reads them
            out.write(bomb)
        out.write(gzip.compress(b"\n" + _waits(range(3, 6))))
    assert path.stat().st_size < 8 << 20
    result, seconds, peak = _lockdiag([str(path)])
    data = _data(result)
    assert len(data["keys"]) == 3  # type: ignore[arg-type]
    files = data["files"]
    assert isinstance(files, list) and len(files) == 1
    read = files[0]
    assert GZIP_FLOOR - CHUNK <= read["damage"]["gzip_read_up_to"] <= GZIP_FLOOR
    assert read["damage"]["long_lines"] == 1
    assert any("decompression bomb" in note for note in data["notes"])  # type: ignore[attr-defined]
    assert peak < PEAK_MB, f"peak {peak:.0f} MB"
    print(f"gzip bomb 4 GiB: {seconds:.1f}s, peak {peak:.0f} MB")


def test_a_sparse_file_is_refused_early(tmp_path: Path) -> None:
    path = tmp_path / "sparse.log"
    with path.open("wb") as out:
        out.truncate(200 << 20)  # no disk: a hole of 200 MB of NUL bytes
    result, seconds, peak = _lockdiag([str(path)])
    assert result.returncode == 2
    error = result.stderr.decode()
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "not a PostgreSQL log: no line of text in its first 64 MiB" in error
    assert "of NUL bytes skipped" in error
    assert peak < PEAK_MB, f"peak {peak:.0f} MB"
    print(f"200 MB sparse file: {seconds:.1f}s, peak {peak:.0f} MB")


def test_standard_input_of_nul_bytes_ends(tmp_path: Path) -> None:
    """Standard input that never ends (/dev/zero): refused after DETECT_BYTES."""
    with Path("/dev/zero").open("rb") as zero:
        result, _, peak = _lockdiag(["-"], stdin=zero.fileno())
    assert result.returncode == 2 and b"no line of text in its first 64 MiB" in result.stderr
    assert peak < PEAK_MB, f"peak {peak:.0f} MB"


def test_a_long_line_on_standard_input_is_skipped_and_the_rest_read() -> None:
    """A 200 MB line between waits, streamed through a pipe: skipped and counted where it
    was; the waits on both sides are read."""
    before, after = _waits(range(3)), _waits(range(3, 6))
    start = before + HEAD.format(ms=1, pid=7).encode() + b"LOG:  statement: "
    block = b"x" * (1 << 20)
    result, seconds, peak = _lockdiag(["-"], feed=[start, *[block] * 200, b"\n" + after])
    data = _data(result)
    assert len(data["keys"]) == 6  # type: ignore[arg-type]
    damage = data["files"][0]["damage"]  # type: ignore[index]
    line = len(start) - len(before) + 200 * len(block) + 1
    assert damage["long_lines"] == 1 and damage["skipped"] == [[len(before), line]]
    assert any("longer than 1 MiB skipped" in note for note in data["notes"])  # type: ignore[attr-defined]
    assert peak < PEAK_MB, f"peak {peak:.0f} MB"
    print(f"200 MB line: {seconds:.1f}s, peak {peak:.0f} MB")


def test_a_device_is_refused_and_a_fifo_is_read(tmp_path: Path) -> None:
    result, _, _ = _lockdiag(["/dev/zero"])
    assert result.returncode == 2
    assert result.stderr.decode().strip() == (
        "lockdiag: error: /dev/zero: a device, not a log file: give a file, a FIFO or '-'"
    )
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    lines = _waits(range(4))

    def write() -> None:
        with fifo.open("wb") as out:
            for n in range(0, len(lines), 100):  # in pieces, as a server would
                out.write(lines[n : n + 100])
                out.flush()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = _data(_lockdiag([str(fifo)])[0])
    writer.join(10)
    assert len(data["keys"]) == 4  # type: ignore[arg-type]


# -- the reader of bytes, piece by piece ---------------------------------------------------------


def _read(data: bytes, chunk: int, max_line: int = 64) -> tuple[list[str], object]:
    lines = LogLines(io.BytesIO(data), "t", chunk=chunk, max_line=max_line)
    return list(lines), lines.damage


def test_nul_runs_long_lines_and_bad_bytes() -> None:
    data = (
        b"one\npartial"
        + b"\0" * 100
        + b"two\n"
        + b"y" * 100
        + b"\nthree \xff\xfe end\n"
        + b"\0" * 10
        + b"four\nlast"
    )
    lines, damage = _read(data, chunk=7)
    assert lines == ["one\n", "two\n", "three \ufffd end\n", "four\n", "last"]
    assert damage.nul_stretches == [(4, 107), (229, 10)]  # type: ignore[attr-defined]
    assert damage.nul_bytes == 117 and damage.nul_count == 2  # type: ignore[attr-defined]
    assert damage.long_lines == [(115, 101)]  # type: ignore[attr-defined]
    assert damage.undecodable == 2  # type: ignore[attr-defined]


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=30),
            st.sampled_from([b"\n", b"\0" * 9, b"\r\n", b"\xff", b"\xe2\x82", b"\xe2\x80\xa8",
                             b"x" * 70, b"2026-05-01 03:10:00.123 UTC [812] "]),
        ),
        max_size=30,
    ),
    st.integers(1, 40),
)  # fmt: skip
def test_any_bytes_give_the_same_lines_whatever_the_chunk(pieces: list[bytes], chunk: int) -> None:
    """Chunk boundaries never show: the lines and the damage are those of a single read; no
    line is longer than the limit; every byte is a line's, or counted as skipped."""
    data = b"".join(pieces)
    whole, damage = _read(data, chunk=1 << 20)
    lines, same = _read(data, chunk=chunk)
    assert lines == whole and same == damage
    assert all(len(line) <= 64 for line in lines)
    assert all("\0" not in line for line in lines)
    if data.startswith(GZIP_MAGIC):
        return  # read as a gzip file cut short, as zcat reads it; gzipped, those bytes are text
    gzipped, _ = _read(gzip.compress(data), chunk=chunk)
    assert gzipped == whole


def test_bytes_that_open_as_gzip_are_read_as_gzip() -> None:
    """Found by the test above: plain bytes that start with gzip's magic are a gzip file cut
    short (no line, said truncated); the same bytes gzipped are one line of text."""
    assert _read(GZIP_MAGIC, chunk=1)[0] == []
    assert getattr(_read(GZIP_MAGIC, chunk=1)[1], "truncated", False)
    assert _read(gzip.compress(GZIP_MAGIC), chunk=1)[0] == ["\x1f\ufffd"]


GZIP_MAGIC = b"\x1f\x8b"


@given(
    st.lists(st.sampled_from(["a", " ", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e",
                              "\x85", "\u2028", "\u2029", "\r\n", "\xe9"]), max_size=40),
)  # fmt: skip
def test_lines_end_at_line_feeds_only(pieces: list[str]) -> None:
    """A carriage return, form feed or U+2028 stays inside its line (str.splitlines() would
    split there: ASCII text is searched for the ASCII ones, other text counted)."""
    text = "".join(pieces) + "\n"
    lines, _ = _read(text.encode(), chunk=1 << 20)
    assert lines == [line + "\n" for line in text[:-1].split("\n")]


# -- prefix regexes: linear by construction ------------------------------------------------------

ESCAPES = "mtnspuadrhLiblcvxePQ"


def _crafted(prefix: str, size: int) -> str:
    """A line that makes a backtracking prefix regex try every split: the prefix's own
    separators, over and over, and never a severity."""
    separators = "".join(sorted({c for c in prefix if not c.isalnum() and c != "%"})) or " @/"
    stamp = "2026-05-01 03:10:00.123 UTC [812] "
    return stamp + (separators + "a1 ") * (size // (len(separators) + 3))


def test_crafted_lines_take_linear_time() -> None:
    """A 6.8 KB line took more than 60 s with '%m [%p] %q%u@%d/%a '; every common layout on
    a 64 KB crafted line now takes milliseconds (the bound is a thousand times that)."""
    for prefix in COMMON_PREFIXES:
        for pattern in (prefix_pattern(prefix), pid_pattern(prefix)):
            assert "*?" not in pattern.pattern and "+?" not in pattern.pattern, prefix
            line = _crafted(prefix, 64 << 10)
            started = time.perf_counter()
            pattern.match(line)
            assert time.perf_counter() - started < 2, prefix


@settings(max_examples=200)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([f"%{c}" for c in ESCAPES] + ["%q", "%-10a", "%5p", "%%"]),
            st.text(alphabet=" @/:[]=,-()", min_size=1, max_size=3),
        ),
        max_size=12,
    ),
    st.integers(0, 3000),
)
def test_any_prefix_gives_a_regex_without_unbounded_lazy_parts(parts: list[str], size: int) -> None:
    """Every lazy quantifier in a prefix regex is bounded and every value but the last is
    atomic: a crafted line of any length is matched (or not) quickly, never raising."""
    prefix = "".join(parts)
    for pattern in (prefix_pattern(prefix), pid_pattern(prefix)):
        assert "*?" not in pattern.pattern and "+?" not in pattern.pattern
        started = time.perf_counter()
        pattern.match(_crafted(prefix, size))
        assert time.perf_counter() - started < 2


@settings(max_examples=200)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=120),
            st.sampled_from(
                [
                    b"2026-05-01 03:10:00.123 UTC [812] app@shop/web LOG:  process 812 still "
                    b"waiting for ExclusiveLock on advisory lock [5,4102,73,2] after 1000.1 ms\n",
                    b"2026-05-01 03:10:00.123 UTC [812] app@shop/web DETAIL:  Process holding "
                    b"the lock: 9. Wait queue: 812.\n",
                    b"\tProcess 812 waits for ShareLock on transaction 5; blocked by process 9.\n",
                    b"2026-05-01 03:10:00.123 UTC [812] \xff\xfe@shop/web ERROR:  deadlock "
                    b"detected\n",
                    b"\0" * 50,
                    b"x" * 300,
                ]
            ),
        ),
        max_size=40,
    ),
    st.integers(1, 64),
)
def test_any_bytes_are_read_or_refused_with_one_line(pieces: list[bytes], chunk: int) -> None:
    tally = Tally()
    lines = LogLines(io.BytesIO(b"".join(pieces)), "fuzz", chunk=chunk, max_line=200)
    try:
        tally.read(LogReader(lines, "fuzz"))
    except NotALog as error:
        assert "\n" not in str(error)
        return
    report(tally, Registry())


def test_lines_of_text_far_apart_are_read() -> None:
    """Lines of text far apart, each after a megabyte of NULs: the format is decided from the
    first ones, and every one is read."""
    data = (b"\0" * (1 << 20) + _waits(range(1))) * 70
    tally = Tally()
    tally.read(LogReader(LogLines(io.BytesIO(data), "spread"), "spread"))
    done = report(tally, Registry())
    assert len(done.keys) == 1 and done.reads[0].damage.nul_count == 70
    assert len(data) > DETECT_BYTES


def _csv_record(message: str) -> str:
    """A csvlog record as the server quotes it: the time bare, every text quoted."""
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n").writerow(
        ["app", "shop", 812, "h", "6b0f19be.1", 1, "SELECT", "2026-05-01 03:00:00 UTC", "3/2",
         0, "LOG", "00000", message, "", "", "", "", "", "", "", "", "web", "client backend",
         "", 0]
    )  # fmt: skip
    return "2026-05-01 03:10:00.123 UTC," + out.getvalue()


def _json_record(message: str) -> str:
    record = {"timestamp": "2026-05-01 03:10:00.123 UTC", "pid": 812, "error_severity": "LOG",
              "message": message}  # fmt: skip
    return json.dumps(record, separators=(",", ":")) + "\n"


@pytest.mark.parametrize("record", [_csv_record, _json_record])
def test_a_long_record_upsets_nothing_after_it(record: Callable[[str], str]) -> None:
    """A record longer than a line's limit is skipped, and the next one read; a csvlog quote
    left open (by a line lost to damage) swallows at most a line's limit, then reading goes on
    at the next record."""
    wait = "process 812 still waiting for ExclusiveLock on advisory lock [5,4102,{},2] after 1 ms"
    opened = record("duration: 1 ms").replace("duration", '"unclosed', 1)
    data = (
        record(wait.format(73))
        + record("statement: " + "x" * 500)
        + record(wait.format(74))
        + opened
        + "a line without quotes\n" * 60_000
        + record(wait.format(75))
    )
    tally = Tally()
    reader = LogReader(LogLines(io.BytesIO(data.encode()), "r", max_line=400), "r")
    tally.read(reader)
    assert len(report(tally, Registry()).keys) == 3
    assert reader.counts.damage.long_count == 1
