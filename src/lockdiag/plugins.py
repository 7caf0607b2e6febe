"""Catalogue entries from other packages: a team's or a library's own software, its advisory keys
and what to check before acting, declared through the ``lockdiag.catalogue`` entry point group.

A plugin is a function without arguments, named by an entry point, that returns :class:`Entry`
objects (see docs/guides/plugins.md)::

    [project.entry-points."lockdiag.catalogue"]
    acme = "acme_lockdiag:entries"

Plain entry points rather than pluggy: lockdiag calls one hook, without arguments, once per
process, and pluggy's hook specifications, call order and wrappers would be a dependency that
serves none of it. Nothing is loaded until a catalogue is built (:func:`loaded`); a plugin that
fails is told in one line and left out, since an incident command must never stop for one.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from lockdiag.keys import (
    INT4_MAX,
    INT4_MIN,
    INT8_MAX,
    INT8_MIN,
    PAIR_SUBID,
    LockTriple,
    from_bigint,
    from_pair,
    to_uint4,
)

T = TypeVar("T")

if TYPE_CHECKING:
    from lockdiag.registry import Registry

__all__ = ["GROUP", "Entry", "Key", "Kind", "Plugin", "loaded", "problems_to"]

GROUP = "lockdiag.catalogue"

Kind = Literal["migration", "deploy", "scheduler", "queue", "extension", "library"]
KINDS: tuple[Kind, ...] = ("migration", "deploy", "scheduler", "queue", "extension", "library")
FUNCTIONS = tuple(
    f"pg_{attempt}advisory_{scope}lock{shared}"
    for attempt in ("", "try_")
    for scope in ("", "xact_")
    for shared in ("", "_shared")
)
MAX_TEXT = 500  # characters: a sentence of advice, not a document


def _text(what: str, value: object, empty_ok: bool = False) -> str:
    """A plugin's words are printed as they are: one line of printable text."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not (value or empty_ok):
        raise ValueError(f"{what} is empty")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise ValueError(f"{what} must be one line of printable text, at most {MAX_TEXT} long")
    return value


def _integer(what: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is outside {low}..{high}")
    return value


@dataclass(frozen=True)
class Key:
    """One advisory key of the software, as it passes it to the lock function; build it with
    :meth:`bigint`, :meth:`pair` or :meth:`space`."""

    form: Literal["bigint", "pair", "space"]
    numbers: tuple[int, ...]  # the lock function's arguments (a space: its first int4 only)
    meaning: str  # what the software guards with it, e.g. "deploy lock"

    @classmethod
    def bigint(cls, key: int, meaning: str) -> Key:
        """``pg_advisory_lock(key)``: one signed 64-bit key."""
        return cls("bigint", (key,), meaning)

    @classmethod
    def pair(cls, first: int, second: int, meaning: str) -> Key:
        """``pg_advisory_lock(first, second)``: two signed int4 keys."""
        return cls("pair", (first, second), meaning)

    @classmethod
    def space(cls, first: int, meaning: str) -> Key:
        """``pg_advisory_lock(first, any)``: every pair whose first int4 is ``first``, as
        pg_repack locks ``(16185446, table)``."""
        return cls("space", (first,), meaning)

    def __post_init__(self) -> None:
        _text("a key's meaning", self.meaning)
        sizes = {"bigint": 1, "pair": 2, "space": 1}
        if sizes.get(self.form) != len(self.numbers):
            raise ValueError(f"not a key: {self.form!r} {self.numbers!r} (use Key.bigint, ...)")
        low, high, what = (
            (INT8_MIN, INT8_MAX, "bigint key")
            if self.form == "bigint"
            else (INT4_MIN, INT4_MAX, "int4 key")
        )
        for number in self.numbers:
            _integer(what, number, low, high)

    @property
    def triple(self) -> LockTriple:
        """The key as pg_locks shows it; for a space, its first key ``(first, 0)``."""
        if self.form == "bigint":
            return from_bigint(self.numbers[0])
        return from_pair(self.numbers[0], self.numbers[1] if self.form == "pair" else 0)

    def describe(self) -> str:
        if self.form == "space":
            return f"key space ({self.numbers[0]}, *)"
        return f"key {self.triple.describe()}"


@dataclass(frozen=True)
class Entry:
    """One piece of software: how it takes its locks, what holding one means, and its keys.

    ``per_database``, when given, computes more keys from a database's name (as Rails does
    with ``crc32(current_database())``); it is called for each database that holds an advisory
    lock, every time a snapshot is analysed, so it must be cheap and must not do I/O.
    """

    software: str  # its name, as the output shows it
    kind: Kind  # a migration or deploy tool's run is never to be ended mid-way
    function: str  # the lock function it calls, e.g. "pg_try_advisory_lock"
    normal: str  # one sentence: what holding the lock means, e.g. "held for the whole deploy"
    keys: tuple[Key, ...] = ()
    check: str = ""  # what to look at before acting, in the software's own terms
    per_database: Callable[[str], Iterable[Key]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _text("software", self.software)
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.function not in FUNCTIONS:
            raise ValueError(f"function {self.function!r} is not an advisory lock function")
        _text("normal", self.normal)
        _text("check", self.check, empty_ok=True)
        object.__setattr__(self, "keys", keys_of(self.keys))
        if not (self.per_database is None or callable(self.per_database)):
            raise TypeError("per_database must be a function of a database name")

    def keys_of_database(self, database: str) -> tuple[Key, ...]:
        return keys_of(self.per_database(database)) if self.per_database else ()


def keys_of(found: object) -> tuple[Key, ...]:
    """A plugin's keys, refused whole when one is not a Key."""
    return _all_of(
        Key,
        found,
        "keys must be an iterable of Key, not {}",
        "a key must be a lockdiag.plugins.Key, not {}",
    )


def _all_of(kind: type[T], found: object, not_many: str, not_one: str) -> tuple[T, ...]:
    """``found`` as a tuple of ``kind``s, refused whole; the messages get the wrong type's name."""
    if isinstance(found, (str, bytes)) or not isinstance(found, Iterable):
        raise TypeError(not_many.format(type(found).__name__))
    items = tuple(found)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(not_one.format(type(item).__name__))
    return items


@dataclass(frozen=True)
class Plugin:
    name: str  # the entry point's name, as "declared by plugin NAME" shows it
    entries: tuple[Entry, ...]


@cache
def loaded() -> tuple[Plugin, ...]:
    """Every installed plugin that loads and returns entries, in name order; each one that does
    not is told in one line and left out. Once per process."""
    plugins: list[Plugin] = []
    for name, value in _entry_points():
        try:
            plugins.append(Plugin(name, _entries(_load(name, value)())))
        except Exception as error:  # someone else's code: whatever it raises leaves it out
            tell(f"plugin {name} not used: {cause(error)}")
    for registry in _NAMED_FIRST:
        _tell_registry_clashes(registry, plugins)
    _NAMED_FIRST.clear()
    return tuple(plugins)


def installed() -> bool:
    """Whether any plugin is installed (loaded or not: none is imported to say so)."""
    return bool(_entry_points())


# -- finding the entry points, cached --------------------------------------------------------


@cache  # once per process: installed() asks before the query goes out, loaded() after it
def _entry_points() -> tuple[tuple[str, str], ...]:
    """The group's entry points as (name, "module:attribute"), in name order. Looking them up
    reads the metadata of every installed distribution (50 to 70 ms in a virtualenv of 90), so
    the answer is kept in a cache file, valid while every directory on ``sys.path`` keeps its
    modification time: installing, upgrading or removing a distribution adds, renames or
    removes its ``.dist-info`` directory there, which changes it."""
    where = _cache_file()
    stamp = _path_stamp()
    try:
        cached = json.loads(where.read_text(encoding="utf-8"))
        if cached["stamp"] == stamp:
            return tuple((str(name), str(value)) for name, value in cached["points"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache, or another environment's, or damaged: look them up
    from importlib.metadata import entry_points

    points = sorted((p.name, p.value) for p in entry_points(group=GROUP))
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        part = where.with_name(f"{where.name}.{os.getpid()}")
        part.write_text(json.dumps({"stamp": stamp, "points": points}), encoding="utf-8")
        part.replace(where)  # whole or not at all, for a process reading it meanwhile
    except OSError:
        pass  # a read-only home: looked up again next time
    return tuple(points)


def _path_stamp() -> list[list[object]]:
    """Each directory or archive on ``sys.path`` and its modification time (None: absent)."""
    stamp: list[list[object]] = [[sys.executable]]
    for entry in sys.path:
        try:
            stamp.append([entry, Path(entry).stat().st_mtime_ns])
        except OSError:
            stamp.append([entry, None])
    return stamp


def _cache_file() -> Path:
    """One file per Python environment, in the user's cache directory (XDG)."""
    home = os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser()
    environment = zlib.crc32(sys.prefix.encode(errors="surrogateescape"))
    return Path(home, "lockdiag", f"plugins-{environment:08x}.json")


def _load(name: str, value: str) -> Callable[[], object]:
    from importlib.metadata import EntryPoint

    loaded: Callable[[], object] = EntryPoint(name, value, GROUP).load()
    return loaded


def _entries(found: object) -> tuple[Entry, ...]:
    return _all_of(
        Entry,
        found,
        "it returned {}, not an iterable of Entry",
        "it returned a {}, not a lockdiag.plugins.Entry",
    )


def cause(error: BaseException) -> str:
    """An exception in one line of inert text: its type and its message."""
    words = " ".join(str(error).split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in words)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- where problems go -------------------------------------------------------------------------


def _to_stderr(message: str) -> None:
    print(f"lockdiag: warning: {message}", file=sys.stderr, flush=True)


_SINK: list[Callable[[str], None]] = [_to_stderr]
_TOLD: set[str] = set()  # a catalogue is built for every snapshot: each problem is told once


def tell(message: str) -> None:
    """A plugin's problem, once per process: on stderr as lockdiag's warnings are, or where
    :func:`problems_to` sends it."""
    if message not in _TOLD:
        _TOLD.add(message)
        _SINK[-1](message)


@contextmanager
def problems_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Plugin problems go to ``sink`` meanwhile (a program of its own; a full-screen view)."""
    _SINK.append(sink)
    try:
        yield
    finally:
        _SINK.remove(sink)


# -- the registry's names come first -----------------------------------------------------------

_NAMED_FIRST: list[Registry] = []  # given before plugins loaded: checked when they do


def registry_first(registry: Registry) -> Registry:
    """Tell each key a plugin shares with this registry, whose names win over the plugin's
    (they do at every decode): when plugins load, or now if they have. Returns the registry."""
    if loaded.cache_info().currsize:
        _tell_registry_clashes(registry, loaded())
    else:
        _NAMED_FIRST.append(registry)
    return registry


def _tell_registry_clashes(registry: Registry, plugins: Iterable[Plugin]) -> None:
    for plugin in plugins:
        for entry in plugin.entries:
            for key in entry.keys:
                triple = key.triple
                if key.form == "space":  # a namespace of pairs takes the whole space
                    triple = LockTriple.of_row(to_uint4(key.numbers[0]), 0, PAIR_SUBID)
                match = registry.decode(triple)
                if match is not None:
                    tell(
                        f"plugin {plugin.name}: {key.describe()} of {entry.software} is in "
                        f"namespace {match[0].name!r} of the registry: the registry's name is used"
                    )
