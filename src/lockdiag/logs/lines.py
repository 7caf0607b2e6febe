"""Bytes to lines of text, bounded whatever the input: a file, a FIFO or standard input,
plain or gzip; long lines, NUL bytes and bytes that are not UTF-8 skipped or replaced, and
said where. Imports nothing of lockdiag.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, NamedTuple

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
_ASCII_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"  # what str.splitlines() splits at, besides "\n"


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
        whole = self._carry  # the lines' bytes copied once (a slice of data would be twice)
        whole += memoryview(data)[: end + 1]
        self._carry = bytearray()
        if len(whole) > self.max_line:
            whole = self._without_long(whole, at + end + 1 - len(whole))
        self._hold(data[end + 1 :], at + end + 1)
        text = self._decode(whole)
        lines = text.splitlines(keepends=True)
        if _other_breaks(text) and len(lines) != text.count("\n"):
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


def _other_breaks(text: str) -> bool:
    """Whether ``text`` may hold a line break other than "\\n" (\\r, \\f, U+2028...), which
    splitlines() also splits at. ASCII text (str knows it without a look) is searched for
    the six of them there are in ASCII, much faster than counting its "\\n"."""
    return not text.isascii() or any(other in text for other in _ASCII_BREAKS)


def byte_size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} byte{'' if count == 1 else 's'}"
