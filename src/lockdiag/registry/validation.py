"""Validating a registry file: every problem with its line, read with bounds on size and
nesting (the file may come from anywhere)."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lockdiag.durations import format_duration
from lockdiag.errors import InputError
from lockdiag.keys import (
    derive_resource,
)
from lockdiag.registry.model import (
    FILE_NAME,
    KNOWN_LISTS,
    UNREGISTERED_LEVELS,
    Candidates,
    Namespace,
    Poolers,
    Registry,
    Unregistered,
)
from lockdiag.registry.namespaces import parse_namespace
from lockdiag.registry.reading import (
    MAX_DEPTH,
    Unreadable,
    document_depth,
    read_text,
    toml_refusal,
)

TOP_LEVEL_KEYS = {"namespaces", "known", "poolers", "unregistered"}


MAX_SIZE = 1024 * 1024  # bytes: a registry is a few kilobytes; anything this large is a mistake
# values, items and tables (see toml_refusal): a registry uses a few hundred; a crafted one
# this large takes at most some 40 MB and a second to check (1 MiB of table headers: 100 MB)
MAX_ELEMENTS = 50_000
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
    return too_deep if document_depth(document) > MAX_DEPTH else document


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

        namespace = parse_namespace(name, raw, report)
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
    """The [known] lists, each checked against the one the catalogue declares by its name
    (KNOWN_LISTS): an integer setting or a list of strings. Where none is declared (a worker
    that imports the registry alone) any list of strings or integer is kept, unchecked."""
    if not isinstance(raw, dict):
        problem("error", "'known' must be a table", lines.key("", "known"))
        return None
    values: dict[str, Any] = {}
    ok = True
    for key, value in raw.items():
        line = lines.key("known", key)
        declared = KNOWN_LISTS.get(key)
        integer = isinstance(value, int) and not isinstance(value, bool)
        if declared is None and KNOWN_LISTS:
            allowed = ", ".join(sorted(KNOWN_LISTS))
            problem("error", f"[known]: unknown key {key!r} (allowed: {allowed})", line)
            ok = False
        elif declared is not None and declared.integer:
            if not integer:
                problem("error", f"[known]: {key} must be an integer", line)
                ok = False
            values[key] = value
        elif declared is None and integer:
            values[key] = value
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problem("error", f"[known]: {key} must be a list of strings", line)
            ok = False
        else:
            values[key] = tuple(value)
    return Candidates.of(**values) if ok else None


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
        message = (
            f"namespace {namespace.name!r}: with {alive} resources alive at once, two share a "
            f"key with probability {odds:.2g} (a shared key only makes them wait for each other)"
        )
        found.append((level, message))
    seen: dict[int, tuple[object, ...]] = {}
    for values in namespace.values:
        number = derive_resource(namespace.form, namespace.parts, values)
        if number in seen:
            shared = f"{list(seen[number])} and {list(values)}"
            key = f"#{number & 0xFFFFFFFF:08x}"
            found.append(("warning", f"namespace {namespace.name!r}: {shared} share the key {key}"))
        seen.setdefault(number, values)
    return found


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
