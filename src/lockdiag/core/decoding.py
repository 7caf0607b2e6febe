"""Decoding advisory keys: the registry first, then the catalogue of well-known software, else
unregistered; a pg_locks row's key (each answer remembered) and an aggregated read's span.

Also what a key space says of all its keys, which both the analysis (one decoding for the
common locks of a space) and the aggregated read (which keys must come as rows, not inside a
span) rely on.
"""

from __future__ import annotations

from typing import NamedTuple

from lockdiag.core.catalogue import (
    Catalogue,
    Known,
    build_catalogue,
    snapshot_catalogue,
)
from lockdiag.core.model import LockRow, Snapshot
from lockdiag.keys import BIGINT_SUBID, PAIR_SUBID, LockTriple, is_key_form, to_int4
from lockdiag.registry import Namespace, Registry


class Decoded(NamedTuple):
    """An advisory key in the team's words: a namespace and resource, or the raw numbers."""

    triple: LockTriple
    namespace: Namespace | None = None
    resource: int | None = None
    known: Known | None = None  # well-known software's key, when no namespace matches
    # a span of an aggregated read (LockRow.keys): its highest key, and how many keys; every
    # key between decodes as ``triple`` does (no listed key inside: capture.spans_decodable)
    last: LockTriple | None = None
    keys: int = 1

    def first_keys(self, most: int) -> list[Decoded]:
        """Up to ``most`` of its first keys, each alone: a span's in order where it holds
        every key between its ends, else its lowest only (the others are not known)."""
        single = self._replace(last=None, keys=1)
        if self.last is None:
            return [single]
        (classid, objid, objsubid), last = self.triple, self.last
        first = ordinal(objsubid, objid)
        if ordinal(objsubid, last.objid) - first + 1 != self.keys:
            return [single]
        # built as tuples (a dense span of 100k keys is expanded at every read of sample and
        # the exporter's sampler): fields in order, triple, namespace, resource, then the rest
        resource, namespace, rest = self.resource, single.namespace, single[3:]
        new, triple = tuple.__new__, LockTriple.of_row
        return [
            new(
                Decoded,
                (
                    triple(classid, (first + n) & 0xFFFFFFFF, objsubid),
                    namespace,
                    None if resource is None else resource + n,
                    *rest,
                ),
            )
            for n in range(min(most, self.keys))
        ]

    def member(self, objid: int) -> Decoded:
        """One key of a span, by its objid: decoded as the span is (capture.spans_decodable),
        its own numbers."""
        classid, _, objsubid = self.triple
        triple = LockTriple.of_row(classid, objid, objsubid)
        resource = None if self.namespace is None else key_resource(triple)
        return self._replace(triple=triple, resource=resource, last=None, keys=1)

    @property
    def last_resource(self) -> int | None:
        """The resource of a span's highest key; of its key, for one key."""
        if self.resource is None or self.last is None:
            return self.resource
        return key_resource(self.last)

    @property
    def label(self) -> str:
        if self.last is not None:
            first, namespace = self._replace(last=None).label, self.namespace
            if namespace is not None:
                last = namespace.resource_text(key_resource(self.last))
            else:
                last = self.last.describe()
            return f"{first}..{last} ({self.keys:,} keys)"
        namespace = self.namespace
        if namespace is not None:
            if not namespace.parts:  # the common case, a hundred thousand times over
                if namespace.exact is not None:  # a namespace of one key: its name names it
                    return namespace.name
                return f"{namespace.name} {self.resource}"
            return f"{namespace.name} {namespace.resource_text(self.resource or 0)}"
        if self.known is not None:
            return self.known.label
        return f"unregistered {self.triple.form} {self.triple.describe()}"


def decode(
    registry: Registry, catalogue: Catalogue, key: LockTriple, database: str | None
) -> Decoded:
    """The registry first; then the catalogue of well-known software; else unregistered."""
    match = registry.decode(key)
    if match is not None:
        return Decoded(key, *match)
    return Decoded(key, None, None, catalogue.lookup(key, database))


class Decoder:
    """decode() for pg_locks rows, each key's answer remembered, and what a key space says of
    all its keys: a space (form and high word) that a namespace names, or that no namespace
    names, is decoded alike for every key but the well-known keys listed in it."""

    def __init__(self, registry: Registry, snapshot: Snapshot) -> None:
        self.registry, self.databases = registry, snapshot.server.databases
        self.catalogue = snapshot_catalogue(snapshot, registry.candidates)
        self.found: dict[tuple[int | None, ...], Decoded | None] = {}

    def decode(self, row: LockRow) -> Decoded | None:
        numbers = (row.classid, row.objid, row.objsubid, row.database)
        if numbers in self.found:
            return self.found[numbers]
        key = row.advisory_key
        database = self.databases.get(row.database) if row.database is not None else None
        decoded = decode(self.registry, self.catalogue, key, database) if key else None
        self.found[numbers] = decoded
        return decoded

    def tag(self, row: LockRow) -> Known | None:
        """An extension's advisory tag named by its program, where that program's extension
        is installed in the lock's database (the connected one's extensions are known)."""
        tag = row.advisory_tag
        if tag is None or row.database is None:
            return None
        return self.catalogue.tag(tag, self.databases.get(row.database))

    def of(self, row: LockRow) -> Decoded | None:
        """A row's decoding: its key's, or its span's; None for a lock that is not advisory."""
        if row.locktype != "advisory" or row.classid is None or row.objid is None:
            return None
        return self.decode(row) if row.keys == 1 else self.span(row)

    def span(self, row: LockRow) -> Decoded | None:
        """A span's decoding: its lowest key's, which is every key's in it."""
        decoded = self.decode(row)
        if decoded is None or row.classid is None or row.objid_last is None:
            return decoded
        last = LockTriple.of_row(row.classid, row.objid_last, row.objsubid or 0)
        return decoded._replace(last=last, keys=row.keys)

    def listed(self, objsubid: int | None, classid: int | None) -> frozenset[LockTriple] | None:
        """The keys of a space that must be decoded one by one; None when every key must
        (a pair prefix of well-known software, or a key no server gives)."""
        if objsubid not in (BIGINT_SUBID, PAIR_SUBID) or classid is None:
            return None
        space = LockTriple.of_row(classid, 0, objsubid)
        if self.registry.named_key_by_key(space):
            return None  # a namespace of one key: its neighbours are not its
        if self.registry.decode(space) is not None:
            return frozenset()  # the registry comes first: every key is the namespace's
        return self.catalogue.listed(objsubid, classid)


def spans_decodable(snapshot: Snapshot, registry: Registry) -> bool:
    """Whether every span of an aggregated read decodes as its lowest key does: no key its
    snapshot's catalogue lists (per database, derived) lies inside one unless it was sent
    as a row (lockdiag.core.ahead.singles, and hashtext's keys). Else the read must be a full
    one."""
    spans = [r for r in snapshot.locks if r.keys > 1]
    if not spans:
        return True
    decoder = Decoder(registry, snapshot)
    sent = build_catalogue(registry.candidates, (), snapshot.derived)
    for row in spans:
        assert row.classid is not None and row.objid is not None and row.objid_last is not None
        if not is_key_form(row.objsubid):
            continue  # an extension's tags: never named, so every one reads as its span says
        listed = decoder.listed(row.objsubid, row.classid)
        if listed is None:
            return False  # a prefix not sent whole: every key is named alone
        low, high = ordinal(row.objsubid, row.objid), ordinal(row.objsubid, row.objid_last)
        inside = (k for k in listed if low <= ordinal(k.objsubid, k.objid) <= high)
        if any(k not in sent.anywhere for k in inside):
            return False
    return True


def key_resource(triple: LockTriple) -> int:
    """The resource of a key in a space a namespace names (as the fast path computes it)."""
    return triple.objid if triple.objsubid == BIGINT_SUBID else to_int4(triple.objid)


def ordinal(objsubid: int | None, objid: int) -> int:
    """A key's place in its space: an int4 pair's objid is the signed second int."""
    return to_int4(objid) if objsubid == PAIR_SUBID else objid
