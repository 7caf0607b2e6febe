"""What a registry holds: the team's namespaces, the names to try for hashed keys, the
poolers, and the lookups a worker (by name) and the analysis (by pg_locks key) make."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from lockdiag.errors import InputError
from lockdiag.keys import (
    Form,
    InvalidKey,
    LockTriple,
    PartType,
    derive_resource,
    namespace_key,
    split_namespace,
)

Expect = Literal["xact", "session", "any"]
# what `check` does with a key no namespace names: leave it out, report it (never changing
# the exit code: hygiene, not an incident), or warn (exit 1)
Unregistered = Literal["ignore", "report", "warn"]
UNREGISTERED_LEVELS: tuple[Unregistered, ...] = ("ignore", "report", "warn")
FILE_NAME = "lockdiag.toml"  # where discovery looks, and what a text without a path is called


class UnknownNamespace(InputError):
    """A namespace name that the registry does not define."""


@dataclass(frozen=True)
class Namespace:
    """One lock space of the team: an id in one key form, and what its locks mean."""

    name: str
    id: int
    form: Form
    description: str = ""
    owner: str = ""
    expect: Expect = "any"
    max_hold: float | None = None  # seconds; a holder held longer is a critical finding
    parts: tuple[tuple[str, PartType], ...] = ()  # a resource of several parts (sha256-v1)
    values: tuple[tuple[object, ...], ...] = ()  # listed resources, so decoding can name them
    expected_resources: int | None = None  # how many live at once, for the collision odds
    max_wait: float | None = None  # seconds; a waiter waiting longer is a critical finding
    # a namespace of one key (``key = 8237461823746182``): that key's resource; the rest of
    # its space (form and id) stays unnamed
    exact: int | None = None

    def key(self, *resource: object) -> LockTriple:
        """The key of a resource: one integer, or the namespace's parts (see keys.py)."""
        return namespace_key(self.form, self.id, self.number(*resource))

    def number(self, *resource: object) -> int:
        """The resource number: the integer itself, or derived from the parts."""
        if self.parts:
            return derive_resource(self.form, self.parts, resource)
        if self.exact is not None:
            if resource and resource != (self.exact,) and resource != (str(self.exact),):
                raise InvalidKey(f"namespace {self.name!r} names one key: give no resource")
            return self.exact
        if len(resource) != 1:
            raise InvalidKey(f"namespace {self.name!r} takes one integer resource")
        (value,) = resource
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidKey(f"resource {value!r} is not an integer")
        try:
            return int(value)
        except ValueError:
            raise InvalidKey(f"resource {value!r} is not an integer") from None

    def covers(self, triple: LockTriple) -> bool:
        """Whether a key is this namespace's: in its space (form and id), and for a
        namespace of one key, that key."""
        if triple.form != self.form:
            return False
        namespace_id, resource = split_namespace(triple)
        return namespace_id == self.id and self.exact in (None, resource)

    def resource_text(self, number: int) -> str:
        """A resource as people read it: the number; for parts, the listed values that give
        it, else ``#3fa2c1d0`` (the number, in hex)."""
        if self.exact is not None:
            return ""  # its name alone names it
        if not self.parts:
            return str(number)
        text = self._value_texts.get(number)
        return text if text is not None else f"#{number & 0xFFFFFFFF:08x}"

    @cached_property
    def _value_texts(self) -> dict[int, str]:
        """The listed values by their number, derived once (the first listed wins)."""
        return {
            derive_resource(self.form, self.parts, values): " ".join(str(v) for v in values)
            for values in reversed(self.values)
        }


@dataclass(frozen=True)
class AdvisoryKey:
    """A registered key, ready for a worker to pass to ``pg_advisory_*`` functions."""

    namespace: Namespace
    resource: int
    triple: LockTriple

    @property
    def args(self) -> tuple[int, ...]:
        return self.triple.args

    @property
    def placeholders(self) -> str:
        """``%s, %s`` or ``%s``: the parameter list matching ``args``, for psycopg and friends."""
        return ", ".join(["%s"] * len(self.args))

    def sql(self, function: str = "pg_try_advisory_xact_lock") -> str:
        return self.triple.sql(function)


@dataclass(frozen=True)
class KnownList:
    """A list the ``[known]`` table takes: the names (or, for an integer, the setting) a team
    passes to a program that hashes names into keys. Declared by that program's entry in the
    catalogue (:mod:`lockdiag.core.catalogue`), which computes the keys; the registry only
    checks a file's ``[known]`` against the lists declared."""

    name: str
    comment: str  # what to list, in a few words (the known-locks guide's example)
    default: tuple[str, ...] | int = ()  # an int: the entry is an integer setting

    @property
    def integer(self) -> bool:
        return isinstance(self.default, int)


# The lists declared so far, by name: the catalogue's entries add theirs when they are
# declared. A process that declared none (a worker that imports the registry alone, and never
# uses [known]) keeps a file's [known] lists unchecked.
KNOWN_LISTS: dict[str, KnownList] = {}


def declare_list(known: KnownList) -> None:
    """Add a list to those ``[known]`` takes; a name already declared otherwise is refused."""
    found = KNOWN_LISTS.get(known.name)
    if found is not None and found != known:
        raise ValueError(f"[known] {known.name} is declared twice")
    KNOWN_LISTS[known.name] = known


def withdraw_list(name: str) -> None:
    KNOWN_LISTS.pop(name, None)


Given = tuple[str, ...] | int


@dataclass(frozen=True)
class Candidates:
    """Names to try for third-party keys that hash a name (the ``[known]`` table): each list by
    its name, a declared list's default where the file gives none. Two Candidates that give
    the same values are equal, whatever order or defaults the file wrote."""

    given: tuple[tuple[str, Given], ...] = ()  # by name, only values other than the default

    @classmethod
    def of(cls, **lists: Iterable[str] | int) -> Candidates:
        values: dict[str, Given] = {}
        for name, value in lists.items():
            given: Given = value if isinstance(value, int) else tuple(value)
            known = KNOWN_LISTS.get(name)
            if known is None or given != known.default:
                values[name] = given
        return cls(tuple(sorted(values.items())))

    def names(self, name: str) -> tuple[str, ...]:
        """A list's names: the file's, else the list's default (none when undeclared)."""
        value = dict(self.given).get(name)
        if value is None:
            default = KNOWN_LISTS[name].default if name in KNOWN_LISTS else ()
            return default if isinstance(default, tuple) else ()
        return value if isinstance(value, tuple) else ()

    def number(self, name: str) -> int:
        """An integer setting of ``[known]``: the file's, else its default (0 when undeclared)."""
        value = dict(self.given).get(name)
        if value is None:
            default = KNOWN_LISTS[name].default if name in KNOWN_LISTS else 0
            return default if isinstance(default, int) else 0
        return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class Poolers:
    """Connection poolers in front of the server (the ``[poolers]`` table, plus options)."""

    pgbouncer: tuple[str, ...] = ()  # admin console DSNs
    addresses: tuple[str, ...] = ()  # client addresses of poolers whose console is unreadable

    def merged(self, pgbouncer: tuple[str, ...], addresses: tuple[str, ...]) -> Poolers:
        return Poolers(
            tuple(dict.fromkeys((*self.pgbouncer, *pgbouncer))),
            tuple(dict.fromkeys((*self.addresses, *addresses))),
        )


@dataclass(frozen=True)
class Registry:
    """Namespaces by name, with a reverse index from (form, id) for decoding pg_locks."""

    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    path: Path | None = None
    candidates: Candidates = Candidates()
    poolers: Poolers = Poolers()
    unregistered: Unregistered | None = None  # the file's choice for `check`, if it made one
    _by_id: Mapping[tuple[str, int], Namespace] = field(default_factory=dict, repr=False)
    # namespaces of one key, by (form, id, resource); their spaces, to decode key by key
    _exact: Mapping[tuple[str, int, int], Namespace] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        namespaces: list[Namespace],
        path: Path | None = None,
        candidates: Candidates = Candidates(),
        poolers: Poolers = Poolers(),
        unregistered: Unregistered | None = None,
    ) -> Registry:
        return cls(
            namespaces={ns.name: ns for ns in namespaces},
            path=path,
            candidates=candidates,
            poolers=poolers,
            unregistered=unregistered,
            _by_id={(ns.form, ns.id): ns for ns in namespaces if ns.exact is None},
            _exact={(ns.form, ns.id, ns.exact): ns for ns in namespaces if ns.exact is not None},
        )

    def namespace(self, name: str) -> Namespace:
        try:
            return self.namespaces[name]
        except KeyError:
            raise UnknownNamespace(self._unknown_message(name), hint=self._how_to_give()) from None

    def key(self, name: str, *resource: object) -> AdvisoryKey:
        """The key of NAME's resource: one integer, or the namespace's parts in order
        (``registry.key("tenant_summary", 73, "2026-11")``)."""
        namespace = self.namespace(name)
        number = namespace.number(*resource)
        return AdvisoryKey(namespace, number, namespace_key(namespace.form, namespace.id, number))

    def decode(self, triple: LockTriple) -> tuple[Namespace, int] | None:
        """The namespace and resource of a pg_locks key, or None when no namespace matches."""
        if not self._by_id and not self._exact:
            return None
        namespace_id, resource = split_namespace(triple)
        namespace = self._by_id.get((triple.form, namespace_id))
        if namespace is None and self._exact:
            namespace = self._exact.get((triple.form, namespace_id, resource))
        return (namespace, resource) if namespace else None

    def named_key_by_key(self, triple: LockTriple) -> bool:
        """Whether the space of ``triple`` (its form and id) holds a namespace of one key:
        its other keys are not that namespace's, so each key is decoded alone."""
        return bool(self._exact) and (triple.form, split_namespace(triple)[0]) in self._spaces

    @cached_property
    def _spaces(self) -> frozenset[tuple[str, int]]:
        return frozenset((form, namespace_id) for form, namespace_id, _ in self._exact)

    def _how_to_give(self) -> str | None:
        """With no registry file, how to give one (the namespace may be in a file not found)."""
        if self.path is not None:
            return None
        return (
            "name the registry file with --registry FILE or LOCKDIAG_REGISTRY, or put it in "
            "the working directory as lockdiag.toml"
        )

    def _unknown_message(self, name: str) -> str:
        where = f" in {self.path}" if self.path else " (no registry file found)"
        message = f"unknown namespace {name!r}{where}"
        nearest = difflib.get_close_matches(name, list(self.namespaces), n=3, cutoff=0.5)
        if nearest:
            return f"{message}; did you mean {', '.join(nearest)}?"
        if self.namespaces:
            known = ", ".join(sorted(self.namespaces)[:10])
            return f"{message}; known namespaces: {known}"
        return message
