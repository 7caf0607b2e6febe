"""Validating a registry file: every problem with its line, read with bounds on size and
nesting (the file may come from anywhere)."""

from __future__ import annotations

import array
import itertools
import math
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lockdiag.durations import format_duration, parse_duration
from lockdiag.errors import InputError
from lockdiag.keys import (
    INT4_MAX,
    INT4_MIN,
    Form,
    InvalidKey,
    LockTriple,
    PartType,
    derive_resource,
    from_bigint,
    from_pair,
    split_namespace,
)
from lockdiag.registry.model import (
    FILE_NAME,
    UNREGISTERED_LEVELS,
    Candidates,
    Expect,
    Namespace,
    Poolers,
    Registry,
    Unregistered,
)

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")
NAMESPACE_KEYS = {"id", "key", "form", "description", "owner", "expect", "max_hold",
                  "max_wait", "resource", "values", "expected_resources"}  # fmt: skip
NOT_WITH_KEY = ("id", "resource", "values", "expected_resources")  # a key is one resource
PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,62}):(int|text)$")
TOP_LEVEL_KEYS = {"namespaces", "known", "poolers", "unregistered"}
# [known]: names the team uses with libraries that hash names into keys (known.py)
KNOWN_LISTS = (
    "with_advisory_lock", "django_pglocks", "pals", "hashtext", "pgmq_queues", "flyway_schemas",
    "advisory_lock_npm", "medusa", "slonik_migrator_tables", "dbos_apps", "tooz",
)  # fmt: skip
KNOWN_KEYS = {*KNOWN_LISTS, "with_advisory_lock_prefix"}


MAX_SIZE = 1024 * 1024  # bytes: a registry is a few kilobytes; anything this large is a mistake
# levels of tables, arrays and inline tables below the document; a registry uses four
# (namespaces, a namespace, its values, a value's parts); tomllib recurses once per level
MAX_DEPTH = 64
# values, items and tables (see toml_refusal): a registry uses a few hundred; a crafted one
# this large takes at most some 40 MB and a second to check (1 MiB of table headers: 100 MB)
MAX_ELEMENTS = 50_000
READ_CHUNK = 1024 * 1024
UNREGISTERED_ERROR = (
    'unregistered must be "ignore", "report" or "warn", not {!r} (what check does with a key '
    "no namespace names)"
)


Collisions = Callable[[Namespace], list[str]]


@dataclass(frozen=True)
class Problem:
    """One finding of registry validation, located in the file where possible."""

    severity: Literal["error", "warning", "note"]
    message: str
    path: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.severity}: {self.message}"

    @property
    def located(self) -> str:
        """``FILE:LINE: message``, for a message that already says it is an error."""
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


def check_file(
    path: Path, collisions: Collisions | None = None
) -> tuple[Registry | None, list[Problem]]:
    """``collisions``: what else claims a namespace's keys (`registry check` passes the
    catalogue of well-known software's keys; loading for a command does not)."""
    try:
        text = read_text(path, MAX_SIZE, "registry file")
    except (OSError, Unreadable) as error:
        reason = getattr(error, "strerror", None) or str(error)
        return None, [Problem("error", f"cannot read: {reason}", str(path))]
    except InputError as error:
        return None, [Problem("error", str(error), str(path))]
    return parse_registry(text, str(path), collisions)


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
    :mod:`lockdiag.core.snapshot_file`), this module being the lowest that all import."""
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
    stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory",
}  # fmt: skip


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


def _document_depth(document: dict[str, Any]) -> int:
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


def _read_toml(text: str, path: str) -> dict[str, Any] | Problem:
    """The TOML document of a registry file, or why it cannot be read."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib

    refusal = toml_refusal(text, "registry file", MAX_ELEMENTS)
    if refusal is not None:
        return Problem("error", refusal, path)
    too_deep = Problem(
        "error", f"nested more than {MAX_DEPTH} levels deep: not a registry file", path
    )
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None) or _line_from_message(str(error))
        message = getattr(error, "msg", None) or re.sub(r"\s*\(at line.*\)$", "", str(error))
        return Problem("error", f"not valid TOML: {message}", path, line)
    except RecursionError:  # a backstop: the scan above counts what tomllib recurses on
        return too_deep
    return too_deep if _document_depth(document) > MAX_DEPTH else document


def parse_registry(
    text: str, path: str = FILE_NAME, collisions: Collisions | None = None
) -> tuple[Registry | None, list[Problem]]:
    """Validate registry text. Returns the registry (None when an error makes it unusable)
    and every problem found, errors and warnings, each with its line where it can be located."""
    document = _read_toml(text, path)
    if isinstance(document, Problem):
        return None, [document]
    lines = _LineIndex(text)
    problems: list[Problem] = []

    def problem(
        severity: Literal["error", "warning", "note"], message: str, line: int | None
    ) -> None:
        problems.append(Problem(severity, message, path, line))

    for key in document:
        if key not in TOP_LEVEL_KEYS:
            expected = ", ".join(sorted(TOP_LEVEL_KEYS))
            message = f"unknown top-level key {key!r} (expected: {expected})"
            problem("error", message, lines.key("", key))
    unregistered = document.get("unregistered")
    if unregistered is not None and unregistered not in UNREGISTERED_LEVELS:
        problem("error", UNREGISTERED_ERROR.format(unregistered), lines.key("", "unregistered"))
    raw_namespaces = document.get("namespaces", {})
    if not isinstance(raw_namespaces, dict):
        problem("error", "'namespaces' must be a table", lines.key("", "namespaces"))
        raw_namespaces = {}

    namespaces: list[Namespace] = []
    first_by_id: dict[tuple[str, int], Namespace] = {}
    exact: dict[tuple[str, int, int], Namespace] = {}  # namespaces of one key
    for name, raw in raw_namespaces.items():
        table = f"namespaces.{name}"

        def report(message: str, key: str | None = None, table: str = table) -> None:
            problem("error", message, lines.key(table, key) if key else lines.table(table))

        namespace = _parse_namespace(name, raw, report)
        if namespace is None:
            continue
        if namespace.exact is not None:
            exact.setdefault((namespace.form, namespace.id, namespace.exact), namespace)
            namespaces.append(namespace)
            continue
        earlier = first_by_id.get((namespace.form, namespace.id))
        if earlier is not None:
            problem(
                "error",
                f"namespace {name!r} reuses {namespace.form} id {namespace.id} "
                f"of namespace {earlier.name!r}",
                lines.key(table, "id"),
            )
            continue
        first_by_id[(namespace.form, namespace.id)] = namespace
        namespaces.append(namespace)

    for namespace in namespaces:
        table = f"namespaces.{namespace.name}"
        for clash in _exact_clash(namespace, first_by_id, exact):
            problem("error", clash, lines.key(table, "key"))
        for message in contradictions(namespace):
            problem("warning", message, lines.table(table))
    for (form, namespace_id), namespace in first_by_id.items():
        other_form = "bigint" if form == "pair" else "pair"
        other = first_by_id.get((other_form, namespace_id))
        if form == "pair" and other is not None:
            problem(
                "warning",
                f"id {namespace_id} is used by {namespace.name!r} (pair) and {other.name!r} "
                "(bigint): these are different lock spaces and never conflict",
                lines.key(f"namespaces.{other.name}", "id"),
            )
    for namespace in namespaces:
        for severity, message in resource_collisions(namespace):
            problem(severity, message, lines.key(f"namespaces.{namespace.name}", "resource"))
    candidates = _parse_known(document.get("known", {}), lines, problem)
    poolers = _parse_poolers(document.get("poolers", {}), lines, problem)
    for namespace in namespaces:
        for collision in collisions(namespace) if collisions is not None else ():
            problem("warning", collision, lines.key(f"namespaces.{namespace.name}", "id"))
    if any(p.severity == "error" for p in problems) or candidates is None or poolers is None:
        return None, problems
    level: Unregistered | None = unregistered
    return Registry.of(namespaces, Path(path), candidates, poolers, level), problems


def _exact_clash(
    namespace: Namespace,
    spaces: dict[tuple[str, int], Namespace],
    exact: dict[tuple[str, int, int], Namespace],
) -> list[str]:
    """For a namespace of one key: why it cannot be (its key is in another namespace's
    space, or another namespace of one key names it first)."""
    if namespace.exact is None:
        return []
    key = namespace.key().describe()
    covering = spaces.get((namespace.form, namespace.id))
    if covering is not None:
        return [
            f"namespace {namespace.name!r}: key {key} is already named by namespace "
            f"{covering.name!r} (id {covering.id}) as {covering.name} {namespace.exact}"
        ]
    first = exact[(namespace.form, namespace.id, namespace.exact)]
    if first is not namespace:
        return [f"namespace {namespace.name!r}: key {key} is already named by {first.name!r}"]
    return []


def _parse_poolers(
    raw: Any, lines: _LineIndex, problem: Callable[[Literal["error"], str, int | None], None]
) -> Poolers | None:
    if not isinstance(raw, dict):
        problem("error", "'poolers' must be a table", lines.key("", "poolers"))
        return None
    values: dict[str, tuple[str, ...]] = {}
    for key, value in raw.items():
        line = lines.key("poolers", key)
        if key not in ("pgbouncer", "addresses"):
            problem(
                "error", f"[poolers]: unknown key {key!r} (allowed: addresses, pgbouncer)", line
            )
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problem("error", f"[poolers]: {key} must be a list of strings", line)
        else:
            values[key] = tuple(value)
            continue
        return None
    return Poolers(**values)


def _parse_known(
    raw: Any, lines: _LineIndex, problem: Callable[[Literal["error"], str, int | None], None]
) -> Candidates | None:
    if not isinstance(raw, dict):
        problem("error", "'known' must be a table", lines.key("", "known"))
        return None
    values: dict[str, Any] = {}
    ok = True
    for key, value in raw.items():
        line = lines.key("known", key)
        if key not in KNOWN_KEYS:
            problem(
                "error",
                f"[known]: unknown key {key!r} (allowed: {', '.join(sorted(KNOWN_KEYS))})",
                line,
            )
            ok = False
        elif key == "with_advisory_lock_prefix":
            if not isinstance(value, int) or isinstance(value, bool):
                problem("error", f"[known]: {key} must be an integer", line)
                ok = False
            values[key] = value
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problem("error", f"[known]: {key} must be a list of strings", line)
            ok = False
        else:
            values[key] = tuple(value)
    return Candidates(**values) if ok else None


def _parse_namespace(
    name: str, raw: Any, error: Callable[[str, str | None], None]
) -> Namespace | None:
    """One namespace table, or None after reporting why through ``error(message, key)``."""
    ok = True
    if not NAME_PATTERN.match(name):
        error(
            f"namespace name {name!r} must start with a letter or _ and use only letters, "
            "digits, _ . - (at most 63 characters)",
            None,
        )
        ok = False
    if not isinstance(raw, dict):
        error(f"namespace {name!r} must be a table with at least an id", None)
        return None
    unknown = [key for key in raw if key not in NAMESPACE_KEYS]
    for key in unknown:
        allowed = ", ".join(sorted(NAMESPACE_KEYS))
        error(f"namespace {name!r}: unknown key {key!r} (allowed: {allowed})", key)
    ok = ok and not unknown
    if "key" in raw:
        return _parse_exact(name, raw, error) if ok else None
    form = raw.get("form", "pair")
    if form not in ("pair", "bigint"):
        error(f'namespace {name!r}: form must be "pair" or "bigint", not {form!r}', "form")
        ok = False
    namespace_id = raw.get("id")
    if namespace_id is None:
        error(f"namespace {name!r}: missing id (or key, for one key)", None)
        ok = False
    elif not isinstance(namespace_id, int) or isinstance(namespace_id, bool):
        error(f"namespace {name!r}: id must be an integer, not {namespace_id!r}", "id")
        ok = False
    elif not INT4_MIN <= namespace_id <= INT4_MAX:
        where = "the high 32 bits of the key" if form == "bigint" else "the first int4 argument"
        error(
            f"namespace {name!r}: id {namespace_id} is outside int4 {INT4_MIN}..{INT4_MAX} "
            f"(it is {where})",
            "id",
        )
        ok = False
    declared = _declarations(name, raw, error)
    if not ok or declared is None:
        return None
    expect, texts, limits = declared
    resources = _parse_resources(name, raw, form, error)
    if resources is None:
        return None
    parts, values, expected = resources
    return Namespace(
        name=name,
        id=namespace_id,  # type: ignore[arg-type]
        form=form,
        description=texts["description"],
        owner=texts["owner"],
        expect=expect,
        max_hold=limits["max_hold"],
        max_wait=limits["max_wait"],
        parts=parts,
        values=values,
        expected_resources=expected,
    )


def _parse_exact(
    name: str, raw: dict[str, Any], error: Callable[[str, str | None], None]
) -> Namespace | None:
    """``key = 8237461823746182`` (a bigint) or ``key = [4242, 17]`` (a pair): a namespace
    of exactly that key; its form is the key's."""
    given = raw["key"]
    triple: LockTriple | None = None
    if isinstance(given, int) and not isinstance(given, bool):
        try:
            triple = from_bigint(given)
        except InvalidKey as problem:
            error(f"namespace {name!r}: key {problem}", "key")
            return None
    elif (
        isinstance(given, list)
        and len(given) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in given)
    ):
        try:
            triple = from_pair(*given)
        except InvalidKey as problem:
            error(f"namespace {name!r}: key {problem}", "key")
            return None
    else:
        error(
            f"namespace {name!r}: key must be one integer (a bigint key) or two (an int4 "
            f"pair), e.g. key = 8237461823746182 or key = [4242, 17], not {given!r}",
            "key",
        )
        return None
    ok = True
    for key in NOT_WITH_KEY:
        if key in raw:
            error(f"namespace {name!r}: {key} does not go with key (a namespace of one key)", key)
            ok = False
    if raw.get("form", triple.form) != triple.form:
        error(f'namespace {name!r}: key {triple.describe()} is of form "{triple.form}"', "form")
        ok = False
    declared = _declarations(name, raw, error)
    if not ok or declared is None:
        return None
    expect, texts, limits = declared
    namespace_id, resource = split_namespace(triple)
    return Namespace(
        name=name,
        id=namespace_id,
        form=triple.form,
        description=texts["description"],
        owner=texts["owner"],
        expect=expect,
        max_hold=limits["max_hold"],
        max_wait=limits["max_wait"],
        exact=resource,
    )


def _declarations(
    name: str, raw: dict[str, Any], error: Callable[[str, str | None], None]
) -> tuple[Expect, dict[str, str], dict[str, float | None]] | None:
    """expect, description and owner, and the limits; None after reporting an error."""
    ok = True
    expect = raw.get("expect", "any")
    if expect not in ("xact", "session", "any"):
        error(
            f'namespace {name!r}: expect must be "xact", "session" or "any", not {expect!r}',
            "expect",
        )
        ok = False
    texts: dict[str, str] = {}
    for key in ("description", "owner"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            error(f"namespace {name!r}: {key} must be a string", key)
            ok = False
        texts[key] = value if isinstance(value, str) else ""
    limits = _parse_limits(name, raw, error)
    return (expect, texts, limits) if ok and limits is not None else None


def contradictions(namespace: Namespace) -> list[str]:
    """Declarations of one namespace that contradict each other, each with what `check`
    would flag: ``expect = "session"`` (held for the life of a session, a leader's lock) with
    ``max_hold`` (any holder past it is CRITICAL max-hold)."""
    if namespace.expect == "session" and namespace.max_hold is not None:
        limit = format_duration(namespace.max_hold)
        return [
            f'namespace {namespace.name!r}: expect = "session" declares a lock held for the '
            f"life of its session (a leader's), but max_hold = {limit} flags every holder "
            f"idle past {limit} CRITICAL (max-hold): check pages on a healthy holder; drop "
            'max_hold, or declare expect = "any" if holds are meant to be short'
        ]
    return []


def resource_collisions(namespace: Namespace) -> list[tuple[Literal["warning", "note"], str]]:
    """For a resource of several parts: the odds that two live resources share a key (the
    birthday bound over 2^32 numbers), and the listed values that do share one."""
    if not namespace.parts:
        return []
    found: list[tuple[Literal["warning", "note"], str]] = []
    alive = namespace.expected_resources
    if alive:
        odds = -math.expm1(-alive * (alive - 1) / (2 * 2**32))
        level: Literal["warning", "note"] = "warning" if odds > 0.01 else "note"
        found.append((level, f"namespace {namespace.name!r}: with {alive} resources alive at once, "
                      f"two share a key with probability {odds:.2g} (a shared key only makes "
                      "them wait for each other)"))  # fmt: skip
    seen: dict[int, tuple[object, ...]] = {}
    for values in namespace.values:
        number = derive_resource(namespace.form, namespace.parts, values)
        if number in seen:
            found.append(("warning", f"namespace {namespace.name!r}: {list(seen[number])} and "
                          f"{list(values)} share the key #{number & 0xFFFFFFFF:08x}"))  # fmt: skip
        seen.setdefault(number, values)
    return found


def _parse_limits(
    name: str, raw: dict[str, Any], error: Callable[[str, str | None], None]
) -> dict[str, float | None] | None:
    """max_hold and max_wait, in seconds (None when not given)."""
    limits: dict[str, float | None] = {}
    ok = True
    for key in ("max_hold", "max_wait"):
        limits[key] = None
        if key not in raw:
            continue
        value = raw[key]
        try:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"{value!r} is not a duration (examples: 90s, 5m, 1h)")
            limits[key] = parse_duration(str(value))
        except ValueError as problem:
            error(f"namespace {name!r}: {key}: {problem}", key)
            ok = False
    return limits if ok else None


def _parse_resources(
    name: str, raw: dict[str, Any], form: Form, error: Callable[[str, str | None], None]
) -> tuple[tuple[tuple[str, PartType], ...], tuple[tuple[object, ...], ...], int | None] | None:
    """A resource of several parts, the listed values and the expected number alive."""
    parts = _parse_parts(name, raw, error)
    if parts is None:
        return None
    values = raw.get("values", [])
    if not isinstance(values, list) or not all(isinstance(v, list) for v in values):
        error(f"namespace {name!r}: values must be a list of resources, each a list", "values")
        return None
    try:
        for value in values:
            derive_resource(form, parts, tuple(value))
    except InvalidKey as problem:
        error(f"namespace {name!r}: values: {problem}", "values")
        return None
    expected = raw.get("expected_resources")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)
                                 or expected < 1):  # fmt: skip
        error(f"namespace {name!r}: expected_resources must be a positive integer", None)
        return None
    return parts, tuple(tuple(v) for v in values), expected


def _parse_parts(
    name: str, raw: dict[str, Any], error: Callable[[str, str | None], None]
) -> tuple[tuple[str, PartType], ...] | None:
    """``resource = ["tenant:int", "period:text"]``: the parts of a resource, in order."""
    given = raw.get("resource")
    if given is None:
        return ()
    matches = [PART.match(p) if isinstance(p, str) else None for p in given] if isinstance(
        given, list) else [None]  # fmt: skip
    if not given or not all(matches):
        error(
            f'namespace {name!r}: resource must list its parts as "name:int" or "name:text", '
            f'e.g. ["tenant:int", "period:text"]',
            "resource",
        )
        return None
    return tuple((m.group(1), m.group(2)) for m in matches if m)  # type: ignore[misc]


def _line_from_message(message: str) -> int | None:
    match = re.search(r"at line (\d+)", message)
    return int(match.group(1)) if match else None


class _LineIndex:
    """Line numbers of table headers and keys, found by reading the text the way TOML reads it
    (tomllib reports no positions for valid documents, so semantic errors need this)."""

    _HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
    _KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_.-]+)\s*=")

    def __init__(self, text: str) -> None:
        self._tables: dict[str, int] = {}
        self._keys: dict[tuple[str, str], int] = {}
        table = ""
        for number, line in enumerate(text.splitlines(), start=1):
            header = self._HEADER.match(line)
            if header:
                table = _normalise(header.group(1))
                self._tables.setdefault(table, number)
                continue
            key = self._KEY.match(line)
            if key:
                self._keys.setdefault((table, _normalise(key.group(1))), number)

    def table(self, name: str) -> int | None:
        return self._tables.get(name) or self._keys.get(("namespaces", name.split(".", 1)[-1]))

    def key(self, table: str, key: str) -> int | None:
        return self._keys.get((table, key)) or self.table(table)


def _normalise(dotted: str) -> str:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([^.\s]+)", dotted)
    return ".".join(next(p for p in part if p) if any(part) else "" for part in parts)
