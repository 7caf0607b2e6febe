"""The snapshot file: a Snapshot as JSON and back, every field's type checked on the way in.

Every read command accepts ``--from FILE`` and gives the same answer offline. Its records are
built by the checked constructors of :mod:`lockdiag.core.records`, as the server layer's are.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from lockdiag.core.model import DerivedKey, LockRow, PoolLink, Session, Snapshot
from lockdiag.core.records import (
    RANGES,
    FieldError,
    build_record,
    convert,
    expect_dict,
    expect_list,
    server_info,
)
from lockdiag.errors import InputError
from lockdiag.keys import UINT2_MAX, UINT4_MAX
from lockdiag.registry import (
    MAX_SIZE,
    Registry,
    nesting_depth,
    parse_registry,
    read_bounded,
    size_text,
)
from lockdiag.registry.reading import Unreadable

FILE_FORMAT = "lockdiag-snapshot"
FILE_VERSION = 1
# bytes of a snapshot file, and of a recording (`watch --record`; replayed from memory): a
# snapshot of 100,000 locks takes about 36 MB, so this is some 30 times the largest lock
# tables seen; anything larger is not a snapshot, and a snapshot this large would take
# gigabytes of memory to load
MAX_FILE_SIZE = 1 << 30
# levels of arrays and objects: a snapshot's document uses four (the document, its list of
# locks, a lock, its blocked_by); the json module recurses once per level
MAX_DEPTH = 64
# array items and object members (see _shape): a lock takes 17, so a snapshot of 300,000
# locks (110 MB) has 5.2 million and takes 460 MB to load. The json module spends up to some
# 120 bytes an element however few bytes of file make one (an empty array: 3 bytes, 64 of
# memory), so this bounds any file's cost near the largest real one's: about 1 GB and 20 s
# at most (an object of 8 million members); 16 MB of empty arrays had taken 470 MB
MAX_ELEMENTS = 8_000_000
PIECE = 4096  # locks of the file's text encoded and written at a time (see pieces)


def dumps(snapshot: Snapshot, names: Registry | None = None) -> str:
    """The snapshot file's text, with the registry it was read with (:func:`registry_text`)."""
    return "".join(pieces(snapshot, names))


def pieces(snapshot: Snapshot, names: Registry | None = None) -> Iterator[str]:
    """:func:`dumps`'s text in pieces of up to :data:`PIECE` locks, to be written as they
    come: ``json.dumps(document, indent=1, ensure_ascii=False)`` byte for byte (a test
    compares them), but never the whole text, nor its millions of small strings, nor every
    lock's dictionary at once (some 300 MB at 100k locks). A lock is encoded by the C
    encoder, its members one to a line by the item separator (:func:`_locks_text`)."""
    document = _document(snapshot, with_locks=False)
    text = registry_text(names) if names is not None else None
    if names is not None and text is not None:
        read_with = str(names.path) if names.path else None
        document["registry"] = {"read_with": read_with, "text": text}
    keys = list(document)
    at = keys.index("derived")  # the locks go between the sessions and the derived keys
    head = json.dumps({k: document[k] for k in keys[:at]}, indent=1, ensure_ascii=False)
    tail = json.dumps({k: document[k] for k in keys[at:]}, indent=1, ensure_ascii=False)
    if not snapshot.locks:
        yield f'{head[:-2]},\n "locks": [],\n{tail[2:]}\n'
        return
    yield f'{head[:-2]},\n "locks": [\n'
    for index, text in enumerate(_lock_pieces(snapshot)):
        yield text if not index else ",\n" + text
    yield f"\n ],\n{tail[2:]}\n"


def _lock_pieces(snapshot: Snapshot) -> Iterator[str]:
    """The file's locks, up to :data:`PIECE` of them a piece: a span whose keys were read
    (``Snapshot.members``, a dump's aggregated read) as its locks, each the span's record with
    its own objid, in the order of its keys."""
    piece: list[LockRow] = []
    for lock in snapshot.locks:
        objids = snapshot.members_of(lock)
        if objids is None:
            piece.append(lock)
            if len(piece) == PIECE:
                yield _locks_text(piece)
                piece = []
            continue
        if piece:
            yield _locks_text(piece)
            piece = []
        yield from _span_text(lock, objids)
    if piece:
        yield _locks_text(piece)


def _span_text(span: LockRow, objids: list[int]) -> Iterator[str]:
    """A span's locks as :func:`_locks_text` writes each, PIECE at a time: one lock's text
    made once, with a mark where its objid goes (a number no lock has: an objid is an oid),
    and only the numbers made per lock."""
    one = _locks_text([span._replace(objid=_NOT_AN_OID, keys=1, objid_last=None)])
    before, mark, after = one.partition(f'"objid": {_NOT_AN_OID}')
    assert mark  # the objid member, as the C encoder writes it
    before += '"objid": '
    between = f"{after},\n{before}"
    for start in range(0, len(objids), PIECE):
        numbers = list(map(str, objids[start : start + PIECE]))
        numbers[0] = before + numbers[0]  # the ends on the first and last: one copy
        numbers[-1] += after
        yield between.join(numbers)


_NOT_AN_OID = 1 << 40


def record_line(snapshot: Snapshot) -> str:
    """The snapshot as one line of a recording (`watch --record`): the file's document,
    compact, every non-ASCII character escaped."""
    return json.dumps(_document(snapshot), separators=(",", ":"))


def _document(snapshot: Snapshot, with_locks: bool = True) -> dict[str, object]:
    """The file's document; without its locks (:func:`pieces` encodes them one by one)."""
    return {
        "format": FILE_FORMAT,
        "version": FILE_VERSION,
        "source": snapshot.source,
        "scope": snapshot.scope,
        "server": _plain(asdict(snapshot.server)),
        "sessions": [_plain(asdict(s)) for s in snapshot.sessions.values()],
        **({"locks": [_lock(lock) for lock in snapshot.locks]} if with_locks else {}),
        "derived": [asdict(key) for key in snapshot.derived],
        "notes": snapshot.notes,
        "pool": [{"pid": pid, **asdict(link)} for pid, link in snapshot.pool.items()],
    }


def save(snapshot: Snapshot, path: Path, names: Registry | None = None) -> None:
    """Write the snapshot file so that the evidence of an incident is never lost: see
    :func:`write_whole`."""
    write_whole(path, pieces(snapshot, names), "snapshot file")


# -- the registry a snapshot was read with -----------------------------------------------------
# A snapshot is read elsewhere, by someone without the team's registry file: it carries the
# namespaces (everything that decodes and judges a key) and the [known] names tried against
# hashed keys, as registry-file text, checked on the way in as a registry file is. The poolers
# are left out: their DSNs are the reader's, and a file is never connected to.


def registry_text(names: Registry) -> str | None:
    """The registry's namespaces and [known] names as the text of a registry file; None when
    it has neither."""
    lines = []
    for namespace in names.namespaces.values():
        exact = namespace.key().args if namespace.exact is not None else None
        table: dict[str, object] = {
            "id": namespace.id if exact is None else None,
            "key": None if exact is None else exact[0] if len(exact) == 1 else list(exact),
            "form": namespace.form,
            "description": namespace.description,
            "owner": namespace.owner,
            "expect": namespace.expect,
            "max_hold": namespace.max_hold,  # seconds: a number is a duration
            "max_wait": namespace.max_wait,
            "resource": [f"{part}:{kind}" for part, kind in namespace.parts] or None,
            "values": [list(value) for value in namespace.values] or None,
            "expected_resources": namespace.expected_resources,
        }
        lines += ["", f"[namespaces.{_toml(namespace.name)}]"]
        lines += [f"{key} = {_toml(value)}" for key, value in table.items() if value is not None]
    known = {  # the lists that differ from their defaults
        key: list(value) if isinstance(value, tuple) else value
        for key, value in names.candidates.given
    }
    if known:
        lines += ["", "[known]", *(f"{key} = {_toml(value)}" for key, value in known.items())]
    return "\n".join(lines).lstrip() + "\n" if lines else None


def _toml(value: object) -> str:
    """A TOML value: JSON's strings, numbers and arrays are TOML's, but for DEL, which TOML
    wants escaped."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def saved_registry(document: dict[str, Any], name: str) -> tuple[Registry, str | None] | None:
    """The registry a snapshot file carries, and the file it was read from when the snapshot
    was taken; None for a file that carries none (one saved before they did)."""
    saved = document.get("registry")
    if saved is None:
        return None
    try:
        saved = expect_dict(saved, "registry")
        text = convert(saved.get("text"), str, "registry.text")
        read_with = convert(saved.get("read_with"), str | None, "registry.read_with")
    except FieldError as error:
        raise InputError(f"{name}: {error.where}: {error.reason}") from None
    if len(text.encode()) > MAX_SIZE:
        raise InputError(f"{name}: registry: larger than {size_text(MAX_SIZE)}: not a registry")
    where = f"the registry saved in {name}"
    names, problems = parse_registry(text, where)
    if names is None:
        errors = [p.located for p in problems if p.severity == "error"]
        raise InputError(f"{name}: registry: {errors[0] if errors else 'unreadable'}")
    return names, read_with


def write_whole(path: Path, text: str | Iterable[str], what: str) -> None:
    """``text`` (or its pieces, written as they come) to a temporary file beside ``path``,
    flushed and fsynced, then renamed over it: ``path`` is the old file or the new one, never
    a part of either, even on a full disk or when the process is killed. On an error (or when
    making a piece fails) the temporary file is removed and the message says that ``path`` is
    unchanged. A new file is readable by its owner only (it holds query texts and client
    addresses); a replaced one keeps its mode."""
    import tempfile  # only a write needs it (a file read's startup: issue 36)

    existed = path.exists()
    temporary: Path | None = None
    try:
        descriptor, name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".partial"
        )
        temporary = Path(name)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            for piece in (text,) if isinstance(text, str) else text:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        if existed:
            temporary.chmod(stat.S_IMODE(path.stat().st_mode))
        temporary.replace(path)
        temporary = None
        _sync_directory(path.parent)
    except BaseException as error:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        if not isinstance(error, OSError):
            raise
        left = f"{path} is unchanged" if existed else f"{path} was not created"
        raise InputError(f"cannot write {what} {path}: {error.strerror or error}; {left}") from None


def append_line(path: Path, line: str, what: str = "recording") -> None:
    """One whole line at the end of ``path``, flushed and fsynced. On an error the file is cut
    back to its size before, so it only ever holds whole lines, and the message says so."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as error:
        raise InputError(f"cannot write {what} {path}: {error.strerror or error}") from None
    try:
        before = os.fstat(descriptor).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fsync(descriptor)
        except OSError as error:
            os.ftruncate(descriptor, before)
            lines = f"its {before} byte(s) of whole lines are kept" if before else "it is empty"
            raise InputError(
                f"cannot append to {what} {path}: {error.strerror or error}; {lines}"
            ) from None
    finally:
        os.close(descriptor)


def _sync_directory(directory: Path) -> None:
    """The rename itself survives a crash once the directory is synced (POSIX)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def load(path: Path) -> Snapshot:
    """Read a snapshot file; any problem is an InputError naming the file and the place."""
    return loads(read_file(path, "snapshot file"), str(path))


def load_with_registry(path: Path) -> tuple[Snapshot, tuple[Registry, str | None] | None]:
    """A snapshot file's snapshot and the registry it carries (see :func:`saved_registry`)."""
    document = _read_document(read_file(path, "snapshot file"), str(path))
    return _snapshot(document, str(path)), saved_registry(document, str(path))


def read_file(path: Path, what: str) -> bytes:
    """The bytes of a snapshot file or a recording, at most :data:`MAX_FILE_SIZE` of them
    read (see :func:`lockdiag.registry.read_bounded`)."""
    try:
        return read_bounded(path, MAX_FILE_SIZE, what)
    except (OSError, Unreadable) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise InputError(f"cannot read {what} {path}: {reason}") from None
    except InputError as error:
        raise InputError(f"{path}: {error}") from None


def read_recording(path: Path) -> list[str]:
    """The lines of a recording (`watch --record`), one snapshot each; blank lines skipped.

    A snapshot file (`lockdiag snapshot -o`) is a recording of one frame: its document, whole,
    is the one item. They differ from the first line on: each line of a recording is a whole
    document, a snapshot file's first line opens one ("{" alone, as :func:`dumps` writes it)."""
    text = _decoded(read_file(path, "recording"))
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path} holds no snapshot")
    if is_snapshot_document(lines[0]):
        return [text]
    return lines


def is_snapshot_document(first_line: str) -> bool:
    """Whether a file whose first non-blank line is this one is a snapshot file (a document
    over many lines) rather than a recording (a document a line)."""
    opening = first_line.strip()
    return opening.startswith("{") and not opening.endswith("}")


def _decoded(data: bytes) -> str:
    """UTF-8 (a byte order mark dropped, as the json module does), each invalid sequence
    shown as U+FFFD, the replacement character."""
    return data.decode("utf-8-sig", "replace")


def loads(text: str | bytes, name: str = "<snapshot>") -> Snapshot:
    """A snapshot from the JSON text of a snapshot file (bytes: UTF-8, see :func:`_decoded`).
    Refused before it is parsed when nested deeper than :data:`MAX_DEPTH` or larger than
    :data:`MAX_ELEMENTS`; a lone surrogate (``"\\ud800"``, which no output can encode) is
    read as U+FFFD."""
    return _snapshot(_read_document(text, name), name)


def _read_document(text: str | bytes, name: str) -> dict[str, Any]:
    """The JSON document of a snapshot file, its format and version checked (see :func:`loads`)."""
    deep = f"{name}: nested more than {MAX_DEPTH} levels deep: not a snapshot file"
    depth, elements = _shape(
        text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    )
    if depth > MAX_DEPTH:
        raise InputError(deep)
    if elements > MAX_ELEMENTS:
        raise InputError(
            f"{name}: more than {MAX_ELEMENTS:,} elements (array items, object members): "
            "not a snapshot file"
        )
    if isinstance(text, bytes):
        text = _decoded(text)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if _is_recording(text, error):
            raise InputError(
                f"{name} is a recording (watch --record: a snapshot a line), not a snapshot file",
                hint=f"replay it with: lockdiag watch --from {name}",
            ) from None
        raise InputError(
            f"{name}:{error.lineno}: not a snapshot file: invalid JSON ({error.msg})"
        ) from None
    except RecursionError:  # a backstop: the scan above counts what json recurses on
        raise InputError(deep) from None
    except ValueError:  # int()'s limit (sys.get_int_max_str_digits): no field is so long
        raise InputError(
            f"{name}: not a snapshot file: an integer of more than "
            f"{sys.get_int_max_str_digits()} digits"
        ) from None
    if _SURROGATE_ESCAPE.search(text):
        document = _without_surrogates(document)
    if not isinstance(document, dict) or document.get("format") != FILE_FORMAT:
        raise InputError(f'{name}: not a lockdiag snapshot file (no "format": "{FILE_FORMAT}")')
    if document.get("version") != FILE_VERSION:
        raise InputError(
            f"{name}: snapshot file version {document.get('version')!r} is not supported "
            f"(this lockdiag reads version {FILE_VERSION})"
        )
    return document


def _is_recording(text: str, error: json.JSONDecodeError) -> bool:
    """Whether JSON that failed with more after its first line is a recording: its first
    line a whole snapshot document."""
    read = text[: error.pos].strip()  # the part json read whole, before the extra data
    if error.msg != "Extra data" or "\n" in read:
        return False
    first = json.loads(read)
    return isinstance(first, dict) and first.get("format") == FILE_FORMAT


def _snapshot(document: dict[str, Any], name: str) -> Snapshot:
    try:
        scope = document.get("scope")
        if scope not in ("advisory", "all"):
            raise FieldError("scope", 'expected "advisory" or "all"')
        source = document.get("source")
        if not isinstance(source, str):
            raise FieldError("source", "expected a string")
        raw_server = expect_dict(document.get("server"), "server")
        version_num = convert(
            raw_server.get("version_num"), int, "server.version_num", RANGES["version_num"]
        )
        server = server_info(raw_server, version_num)
        sessions = {}
        for index, raw in enumerate(expect_list(document.get("sessions"), "sessions")):
            session = build_record(Session, raw, f"sessions[{index}]")
            sessions[session.pid] = session
        locks = [
            build_record(LockRow, raw, f"locks[{index}]")
            for index, raw in enumerate(expect_list(document.get("locks"), "locks"))
        ]
        _advisory_in_range(locks)
        derived = [
            build_record(DerivedKey, raw, f"derived[{index}]")
            for index, raw in enumerate(expect_list(document.get("derived", []), "derived"))
        ]
        notes = [
            convert(note, str, f"notes[{index}]")
            for index, note in enumerate(expect_list(document.get("notes", []), "notes"))
        ]
        pool = {}
        for index, item in enumerate(expect_list(document.get("pool", []), "pool")):
            fields_of_link = dict(expect_dict(item, f"pool[{index}]"))
            pid = convert(fields_of_link.pop("pid", None), int, f"pool[{index}].pid", RANGES["pid"])
            pool[pid] = build_record(PoolLink, fields_of_link, f"pool[{index}]")
    except FieldError as error:
        raise InputError(f"{name}: {error.where}: {error.reason}") from None
    except InputError as error:
        raise InputError(f"{name}: {error}") from None
    return Snapshot(server, source, scope, sessions, locks, 0.0, derived, notes, pool)


def _advisory_in_range(locks: list[LockRow]) -> None:
    """An advisory lock's numbers as a lock tag holds them: classid and objid are uint32,
    objsubid 16 bits (1 and 2 are the SQL functions' keys, any other an extension's tag;
    pg_locks shows it as an int2, so a field4 past 32767 reads negative there). Any other
    number is no lock PostgreSQL can show: the file was edited."""
    for index, lock in enumerate(locks):
        if lock.locktype != "advisory":
            continue
        for name, value, bottom, top in (
            ("classid", lock.classid, 0, UINT4_MAX),
            ("objid", lock.objid, 0, UINT4_MAX),
            ("objid_last", lock.objid_last, 0, UINT4_MAX),
            ("objsubid", lock.objsubid, -(2**15), UINT2_MAX),
        ):
            if value is not None and not bottom <= value <= top:
                raise FieldError(f"locks[{index}].{name}", f"{value} is outside {bottom}..{top}")


_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}",')))
_STRINGS_CHUNK = 1 << 20  # quotes split at a time: a file of quotes never becomes a list of all


def _shape(data: bytes) -> tuple[int, int]:
    """The nesting of JSON text, up to ``MAX_DEPTH`` + 1 (see
    :func:`lockdiag.registry.nesting_depth`), and its elements: its commas and opening
    brackets, so every array item and object member and every array and object (at least),
    its strings left out. Done in C on bytes, in passes that copy: escaped backslashes then
    escaped quotes dropped (so no quote left is escaped), every byte but brackets, commas and
    quotes dropped, then the strings: most hold no bracket nor comma and are by then an empty
    pair of quotes; the few others are cut out between quotes. A twentieth of the time the
    rest of loading takes; a file of a million strings full of brackets, a second."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = data.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in structure:
        outside, inside = [], False
        for start in range(0, len(structure), _STRINGS_CHUNK):
            pieces = structure[start : start + _STRINGS_CHUNK].split(b'"')
            outside.append(b"".join(pieces[int(inside) :: 2]))
            inside ^= len(pieces) % 2 == 0  # an odd number of quotes in the chunk
        structure = b"".join(outside)
    elements = sum(map(structure.count, (b",", b"[", b"{")))
    return nesting_depth(structure, MAX_DEPTH), elements


# a \ud800-\udfff escape, perhaps half of a pair; a false match (an escaped backslash before
# "ud800") only costs the walk below
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _without_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings (and keys) as U+FFFD. The json module
    joins a pair into one character; a lone one no encoder takes, so no output could show it."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _lock(lock: LockRow) -> dict[str, Any]:
    """A lock of the file: a span's (of an aggregated read) with its
    ``keys`` and ``objid_last``; a single lock's without them, as files were before spans
    (and read as one lock: the fields' defaults)."""
    values = lock._asdict()  # _plain()'s values: a time and a tuple are LockRow's only
    if lock.waitstart is not None:
        values["waitstart"] = lock.waitstart.isoformat()
    if lock.blocked_by is not None:
        values["blocked_by"] = list(lock.blocked_by)
    if lock.keys == 1:
        del values["keys"], values["objid_last"]
    return values


# the file's locks as json.dumps(indent=1) nests them (two levels deep: their braces two spaces
# in, their members three), but by the C encoder, a member a line by its item separator. A
# JSON string holds no line break (json escapes it): every one in the text is the layout's,
# so the separator between two locks of a list, "},\n   {", is found in no string.
_MEMBERS = json.JSONEncoder(ensure_ascii=False, separators=(",\n   ", ": ")).encode
_INDENTED = json.JSONEncoder(ensure_ascii=False, indent=1).encode


def _locks_text(locks: list[LockRow]) -> str:
    """Locks of the file's list of locks, as :func:`json.dumps` with ``indent=1`` writes
    them there, a comma and a line break between two. Without a waiter, all of them in one
    call of the C encoder; a waiter's list of blockers (a list that is not empty) has lines of
    its own, so a piece with a waiter (one of few) is encoded a lock at a time, each waiter
    by the indented encoder, its lines moved two levels in."""
    values = list(map(_lock, locks))
    if not any(v["blocked_by"] for v in values):
        inner = _MEMBERS(values)[2:-2].replace("},\n   {", "\n  },\n  {\n   ")
        return f"  {{\n   {inner}\n  }}"
    return ",\n".join(
        "  " + _INDENTED(v).replace("\n", "\n  ")
        if v["blocked_by"]
        else f"  {{\n   {_MEMBERS(v)[1:-1]}\n  }}"
        for v in values
    )


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready values: timestamps as ISO 8601, tuples as lists."""
    return {
        key: (
            value.isoformat()
            if isinstance(value, datetime)
            else (list(value) if isinstance(value, tuple) else value)
        )
        for key, value in values.items()
    }
