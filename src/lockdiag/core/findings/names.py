"""Detectors of names: keys no registry names (grouped by holder and by the advice that fits
the key's shape), and locks that break their namespace's rules (expect, max_hold)."""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Literal

from lockdiag.core.analysis import LockEntry
from lockdiag.core.catalogue import collisions
from lockdiag.core.findings.model import Finding, Kind
from lockdiag.core.findings.words import (
    by_backend,
    held_words,
    label,
    labels,
    listed,
    locks_in,
    who,
)
from lockdiag.durations import format_duration
from lockdiag.keys import LockTriple
from lockdiag.registry import Namespace, Unregistered


def unregistered_keys(unregistered: list[LockEntry], level: Unregistered) -> Iterator[Finding]:
    """One finding per database, holder and kind of advice, counting the keys it is about:
    info (reported, exit 0) unless ``level`` asks for a warning or for nothing."""
    if level == "ignore":
        return
    # the advice depends on the key space (form and high word) and the key's shape only, and
    # on how many keys the holder has in it: grouped by space and shape first
    spaces: dict[tuple[str | None, int | None, int, int, KeyShape], list[LockEntry]] = {}
    for entry in unregistered:
        if entry.lock.granted:
            triple = entry.decoded.triple  # type: ignore[union-attr]
            shape = key_shape(triple)
            key = (entry.database, entry.lock.pid, triple.objsubid, triple.classid, shape)
            spaces.setdefault(key, []).append(entry)
    groups: dict[tuple[str | None, int | None, str], list[LockEntry]] = {}
    for (database, pid, *_), found in spaces.items():
        keys = _keys(found)
        step = unregistered_step(found[0].decoded.triple, keys)  # type: ignore[union-attr]
        groups.setdefault((database, pid, step), []).extend(found)
    for (database, _, advice), found in groups.items():
        first = found[0]
        keys = _keys(found)
        where = f" in database {database}" if database else ""
        step = advice
        if keys == 1:  # a constant fixed in code, maybe: the entry that names it alone
            step += f"; {exact_entry(first.decoded.triple)}"  # type: ignore[union-attr]
        yield Finding(
            Kind.UNREGISTERED,
            "warning" if level == "warn" else "info",
            first.lock.pid,
            labels(found),
            # one key is named: a cause's "also" line shows the evidence, not the lock
            f"{label(first)} held by {who(first)}{where}"
            if keys == 1
            else f"{keys} unregistered keys held by {who(first)}{where}{listed(found)}",
            step,
            first,
            float(keys),
            locks_in(found),
        )


def _keys(found: list[LockEntry]) -> int:
    """How many keys: a key held in two modes is two rows, a span as many keys as it has."""
    return len(set(map(_TRIPLE, found))) + sum(e.lock.keys - 1 for e in found)


_TRIPLE = attrgetter("decoded.triple")
PLAUSIBLE_ID = 1 << 20  # team namespaces are small numbers; a hash's high word rarely is
BYTE = range(-128, 256)  # a digest's byte, read signed or unsigned
KeyShape = Literal["small", "int4-hash", "bytes", ""]
SMALL_NUMBER = (
    "a small number (an enum, a counter or an object's id), not a hash: the bigint keys "
    "0..4294967295 share id 0 with the keys of Sqitch, Prisma, goose and Marten, so no "
    "namespace can take them as they are; find the code that takes it (its query, its "
    'application) and give it a namespace of its own: [namespaces.NAME] id = N, form = "bigint", '
    "taking pg_advisory_lock(N << 32 | number)"
)
HASHED_32 = (
    "a 32-bit key, most likely a hashed name (hashtext(); crc32 as django-pglocks 1.0 does; "
    "djb2 as @medusajs/locking-postgres does; the first 4 bytes of a sha256, sha1 or md5 "
    "digest): list candidate names under [known] (hashtext, django_pglocks, medusa: a name "
    "listed under django_pglocks is tried with each digest, in both byte orders); no "
    "namespace id fits it (a sign-extended int4: id 0 or -1)"
)
HASHED_64 = (
    "looks like a 64-bit hash of a name (the first 8 bytes of a sha256, sha1 or md5 digest, "
    "as django-pglocks, django-pglock, pals, GoodJob or pg-boss take them): list candidate "
    "names under [known] django_pglocks or pals; each is tried with each digest, in both "
    "byte orders"
)
HASHED_PAIR = (
    "looks like a pair made by hashing a name (hashtext(name) first, as pg_partman and mimeo "
    "take theirs; with_advisory_lock puts a crc32 first, advisory-lock on npm two int4 of a "
    "sha256): list candidate names under [known] (hashtext: names the pairs whose first number "
    "is hashtext(name), computed by the server; with_advisory_lock, advisory_lock_npm: tried "
    "with sha256, sha1 and md5, both byte orders); if the first number is instead fixed in a "
    "program's code, more keys with the same first number will show it"
)
BYTES_PAIR = (
    "a pair of two byte-sized numbers: two bytes of a digest (md5, sha1, sha256), or an enum "
    "and a small number; one key cannot tell which, and a digest's byte is no namespace id: "
    "find the code that takes it (its query, its application); a fixed first number there is "
    "the namespace id to name in the registry file"
)


def exact_entry(triple: LockTriple) -> str:
    """The registry entry that names exactly one key, ready to paste."""
    return f"to name this one key (a constant in code): [namespaces.NAME] key = {triple.toml()}"


def key_shape(triple: LockTriple) -> KeyShape:
    """What a key's numbers look like: a small bigint (an enum, an id), a sign-extended
    32-bit value (a hash), a pair of byte-sized numbers (digest bytes, or an enum), or
    nothing in particular ("")."""
    first, second = triple.pair  # the high and low words of a bigint, as int4
    if triple.form == "pair":
        return "bytes" if first in BYTE and second in BYTE else ""
    if triple.classid in (0, 0xFFFFFFFF):  # within int4, or an unsigned 32-bit value
        return "small" if abs(triple.bigint) < PLAUSIBLE_ID else "int4-hash"
    return ""


def unregistered_step(triple: LockTriple, keys: int = 1) -> str:
    """The advice that fits a key nobody named, ``keys`` being how many keys its holder has
    in its space (form and first number) with its shape: a namespace id only where the key
    looks like one (several keys share it, or a small first number; never a digest's byte,
    and never an id that takes in a well-known software's key), else what it looks like."""
    namespace_id = triple.pair[0]  # the first int4 (pair) or the high word (bigint)
    shape = key_shape(triple)
    if shape == "int4-hash":
        return HASHED_32
    if shape == "bytes":
        return BYTES_PAIR
    plausible = keys > 1 or shape == "small" or 0 < abs(namespace_id) < PLAUSIBLE_ID
    probe = Namespace(name="NAME", id=namespace_id, form=triple.form)
    if plausible and not collisions(probe, guesses=False):
        return (
            f"name it in the registry file: [namespaces.NAME] id = {namespace_id}, "
            f'form = "{triple.form}"'
        )
    if shape == "small":
        return SMALL_NUMBER
    return HASHED_PAIR if triple.form == "pair" else HASHED_64


def namespace_rules(expecting_xact: list[LockEntry], over: list[LockEntry]) -> Iterator[Finding]:
    # the analysis flags each lock that breaks its namespace's rules
    for group in by_backend(expecting_xact, by_namespace=True):
        entry, count = group[0], locks_in(group)
        assert entry.decoded is not None and entry.decoded.namespace is not None
        what = (
            "a certain session-level lock" if count == 1 else f"{count} certain session-level locks"
        )
        yield Finding(
            Kind.EXPECT_VIOLATED,
            "warning",
            entry.lock.pid,
            labels(group),
            f"{entry.decoded.namespace.name} expects transaction-level locks, but {who(entry)} "
            f"holds {what}{listed(group)}",
            'use pg_advisory_xact_lock in that code path, or declare expect = "any"',
            entry,
            entry.held_at_least,
            count,
        )
    for group in by_backend(over, by_namespace=True):
        entry, count = group[0], locks_in(group)
        namespace, age = entry.decoded.namespace if entry.decoded else None, entry.held_for
        assert namespace is not None and namespace.max_hold is not None and age is not None
        what = "it" if count == 1 else f"{count} of its locks"
        yield Finding(
            Kind.MAX_HOLD,
            "critical",
            entry.lock.pid,
            labels(group),
            f"{who(entry)} has held {what} at least {held_words(entry)}, over the "
            f"max_hold of {format_duration(namespace.max_hold)}{listed(group)}",
            f"see the holder and its waiters: lockdiag who-holds {label(entry)}",
            entry,
            age,
            count,
        )
