"""Reading a file that may come from anywhere, with bounds: a regular file only, never more
than a limit of bytes, no binary data, and TOML refused before it is parsed when it nests too
deep or holds too many elements. Shared by the registry, the settings, the targets and the
snapshot file readers, this module being the lowest that all import."""

from __future__ import annotations

import array
import itertools
import os
import re
import stat
from pathlib import Path
from typing import Any

from lockdiag.errors import InputError

# levels of tables, arrays and inline tables below the document; a registry uses four
# (namespaces, a namespace, its values, a value's parts); tomllib recurses once per level
MAX_DEPTH = 64
READ_CHUNK = 1024 * 1024


class Unreadable(InputError):
    """:func:`read_bounded`'s refusal of a file it does not read at all: not a regular file,
    or (BinaryData) not text."""


class BinaryData(Unreadable):
    """:func:`read_bounded`'s refusal of a file that is not text at all (a NUL byte)."""


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, read with a bound: never more than ``limit`` + 1 of them, so a
    huge file or one that grows without end is refused without being read whole. Only a
    regular file is read: a FIFO, a device or a socket may never end nor even answer (a FIFO
    with no writer blocks forever), so it is refused without waiting (opened non-blocking,
    then looked at). A regular file larger than ``limit`` is refused before anything is
    read; a NUL byte (never in TOML nor JSON text) is refused at the chunk that holds it
    (BinaryData). Raises InputError with the reason (Unreadable: a file not read at all),
    without the file's name (the caller adds it); OSError is left to the caller.

    Shared by the registry, the settings, the targets and the snapshot file readers (see
    :mod:`lockdiag.core.snapshot_file`)."""
    refused = f"not a {what}"
    chunks: list[bytes] = []
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        kind = _KINDS.get(stat.S_IFMT(status.st_mode), "not a file")
        raise Unreadable(f"{kind}, not a regular file")
    os.set_blocking(descriptor, True)
    with os.fdopen(descriptor, "rb") as file:
        if status.st_size > limit:
            raise InputError(f"larger than {size_text(limit)}: {refused}")
        read = 0
        while read <= limit:
            chunk = file.read(min(READ_CHUNK, limit + 1 - read))
            if not chunk:
                break
            if 0 in chunk:
                where = read + chunk.index(0)
                raise BinaryData(f"binary data (a NUL byte at byte {where})")
            chunks.append(chunk)
            read += len(chunk)
    if read > limit:  # a file that grew while it was read
        raise InputError(f"larger than {size_text(limit)}: {refused}")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def read_text(path: Path, limit: int, what: str) -> str:
    """:func:`read_bounded`'s bytes as UTF-8 text, each invalid sequence (another encoding,
    an encoded surrogate) shown as U+FFFD, the replacement character, as a terminal would."""
    return read_bounded(path, limit, what).decode("utf-8", "replace")


def size_text(size: int) -> str:
    """A byte count as people write a limit: ``1 MiB``, ``1 GiB``, ``512 KiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS = bytes.maketrans(b"()", b"\x01\xff")  # +1 and -1 as signed bytes


def nesting_depth(structure: bytes, limit: int) -> int:
    """How deeply the brackets (``[ ]`` and ``{ }``) of ``structure`` nest, its strings and
    comments removed by the caller; a depth above ``limit`` is given as ``limit`` + 1: the
    highest running sum of +1 an opening and -1 a closing bracket, exactly for balanced
    brackets, at least for a broken file (whose parser then stops early or meets
    RecursionError, which the caller catches).

    Linear in the worst case and fast in the usual one: each round removes every innermost
    pair at once (``bytes.replace``, in C), which takes a real file's few levels in a few
    rounds; once a round would remove less than half of what is left (many deep trees, a
    crafted file), the rest is counted in one pass of running sums (some 60 ns a bracket)."""
    brackets = structure.translate(_OPEN_CLOSE, _NOT_BRACKET)
    if b"(" * (limit + 1) in brackets:  # the usual attack, "[[[[...", found in C at once
        return limit + 1
    depth = 0
    while brackets and depth <= limit:
        inner = brackets.replace(b"()", b"")
        if len(inner) > len(brackets) // 2:
            steps = array.array("b", brackets.translate(_STEPS))
            highest = max(itertools.accumulate(steps), default=0)
            return min(limit + 1, depth + max(0, highest))
        brackets, depth = inner, depth + 1
    return min(limit + 1, depth)


# what TOML reads as a string or a comment, where brackets are not structure
_TOML_TEXT = re.compile(
    r'"""(?:\\[\s\S]|[^\\])*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'|#[^\n]*'
)


def toml_refusal(text: str, what: str, most: int) -> str | None:
    """Why TOML text is refused before tomllib reads it, if it is: brackets nested more
    than ``MAX_DEPTH`` deep (see :func:`nesting_depth`), or more than ``most`` elements,
    counted, strings and comments left out, as the marks that make one (``=`` a key's value,
    ``,`` an item, ``[`` ``{`` a table or an array, ``.`` a dotted key's table): tomllib
    spends some 60 bytes of memory an element, the file itself one or two."""
    structure = _TOML_TEXT.sub("", text).encode("utf-8", "surrogatepass")
    if nesting_depth(structure, MAX_DEPTH) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep: not a {what}"
    if sum(map(structure.count, (b"=", b",", b"[", b"{", b"."))) > most:
        return f"more than {most:,} elements (values, items, tables): not a {what}"
    return None


def document_depth(document: dict[str, Any]) -> int:
    """Levels of tables and arrays below the document, up to ``MAX_DEPTH`` + 1 (dotted keys
    and table headers nest without brackets: ``[a.b.c]``, ``a.b.c = 1``). Iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
