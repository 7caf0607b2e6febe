"""Advisory key arithmetic: how a key is written in SQL and how it appears in pg_locks.

PostgreSQL stores an advisory key in the lock tag as three numbers (``lockfuncs.c``,
``SET_LOCKTAG_INT64`` / ``SET_LOCKTAG_INT32``), shown by pg_locks as unsigned ``oid`` values:

=====================  ==================  =================  ========
call form              classid             objid              objsubid
=====================  ==================  =================  ========
one bigint ``k``       high 32 bits of k   low 32 bits of k   1
two int4 ``(a, b)``    a                   b                  2
=====================  ==================  =================  ========

The two forms are different lock spaces: ``(4102, 73)`` and ``4102 << 32 | 73`` never conflict.

An extension's C code may take an advisory lock with any other objsubid (the lock tag's
``field4``, a uint16: ``SET_LOCKTAG_ADVISORY(tag, db, classid, objid, field4)``):
pg_auto_failover's monitor 10 and 11, Citus 4 and up. No SQL function takes such a lock and
two extensions may use the same objsubid: :class:`AdvisoryTag` holds its raw numbers, never
named as a key.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal, NamedTuple

from lockdiag.errors import InputError

Form = Literal["pair", "bigint"]

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
INT8_MIN, INT8_MAX = -(2**63), 2**63 - 1
UINT4_MAX = 2**32 - 1
BIGINT_SUBID, PAIR_SUBID = 1, 2
UINT2_MAX = 2**16 - 1  # an advisory tag's objsubid is its uint16 field4
TAG_WORDS = "extension advisory tag"
# what counts tags where keys are counted by namespace (metrics, sample, log): no namespace
# name can hold a parenthesis or a space (registry.namespaces.NAME_PATTERN)
TAG_NAMESPACE = "(extension tag)"


class InvalidKey(InputError):
    """A number that cannot be an advisory key (out of range, wrong count, not a number)."""


def to_int4(value: int) -> int:
    """Reinterpret an unsigned 32-bit oid as the signed int4 it was written as."""
    return value - 2**32 if value > INT4_MAX else value


def to_int8(high: int, low: int) -> int:
    """The signed bigint whose high and low words pg_locks shows as classid and objid."""
    unsigned = (high << 32) | low
    return unsigned - 2**64 if unsigned > INT8_MAX else unsigned


def to_uint4(value: int) -> int:
    """Reinterpret a signed int4 as the unsigned oid pg_locks shows."""
    return value & UINT4_MAX


class _Numbers(NamedTuple):
    classid: int
    objid: int
    objsubid: int


class LockTriple(_Numbers):
    """An advisory key as pg_locks shows it: unsigned ``classid``, ``objid``, ``objsubid``.

    A tuple, so that a catalogue keyed by LockTriple is found with the plain numbers of a
    pg_locks row (hashed in C), without building a LockTriple for every lock.
    """

    __slots__ = ()

    def __new__(cls, classid: int, objid: int, objsubid: int) -> LockTriple:
        _in_range(("classid", classid, UINT4_MAX), ("objid", objid, UINT4_MAX))
        if objsubid not in (BIGINT_SUBID, PAIR_SUBID):
            raise InvalidKey(
                f"objsubid {objsubid} is not an advisory key form "
                "(1 = one bigint key, 2 = two int4 keys)"
            )
        return _Numbers.__new__(cls, classid, objid, objsubid)

    @classmethod
    def of_row(cls, classid: int, objid: int, objsubid: int) -> LockTriple:
        """A key read from pg_locks: already in range, so the checks are skipped."""
        return tuple.__new__(cls, (classid, objid, objsubid))

    @property
    def form(self) -> Form:
        return "bigint" if self[2] == BIGINT_SUBID else "pair"

    @property
    def bigint(self) -> int:
        """The signed bigint key (meaningful for the bigint form)."""
        return to_int8(self[0], self[1])

    @property
    def pair(self) -> tuple[int, int]:
        """The two signed int4 keys (meaningful for the pair form)."""
        return to_int4(self.classid), to_int4(self.objid)

    @property
    def args(self) -> tuple[int, ...]:
        """The arguments to pass to ``pg_advisory_lock`` and friends to take this lock."""
        if self[2] == BIGINT_SUBID:
            return (self.bigint,)
        return (to_int4(self[0]), to_int4(self[1]))

    def sql(self, function: str = "pg_try_advisory_xact_lock") -> str:
        """A literal SQL call that takes this lock, for display and copy-paste."""
        return f"SELECT {function}({', '.join(str(a) for a in self.args)})"

    def describe(self) -> str:
        """The numbers as a person would write them in SQL: ``(4102, 73)`` or ``-55037190``."""
        args = self.args
        return str(args[0]) if len(args) == 1 else f"({args[0]}, {args[1]})"

    def toml(self) -> str:
        """The key as a registry file's ``key =`` writes it: ``8237461823746182`` or
        ``[4102, 73]``."""
        args = self.args
        return str(args[0]) if len(args) == 1 else f"[{args[0]}, {args[1]}]"

    def __str__(self) -> str:
        return f"({self.classid}, {self.objid}, {self.objsubid})"


def _in_range(*numbers: tuple[str, int, int]) -> None:
    """Each (name, value, largest) within 0..largest, as a lock tag holds it."""
    for name, value, top in numbers:
        if not 0 <= value <= top:
            raise InvalidKey(f"{name} {value} is outside 0..{top} (as pg_locks shows it)")


def is_key_form(objsubid: int | None) -> bool:
    """Whether an advisory lock's objsubid is one a SQL function makes (1 bigint, 2 pair)."""
    return objsubid in (BIGINT_SUBID, PAIR_SUBID)


class AdvisoryTag(_Numbers):
    """An advisory lock no SQL function takes: objsubid neither 1 nor 2, set by an extension's
    C code (pg_auto_failover's monitor: 10 a formation, 11 a node group; Citus: 4 and up).
    Only its raw numbers are known: two extensions may use the same objsubid, and the
    registry's and the catalogue's keys are the SQL functions' (objsubid 1 or 2)."""

    __slots__ = ()

    def __new__(cls, classid: int, objid: int, objsubid: int) -> AdvisoryTag:
        _in_range(("classid", classid, UINT4_MAX), ("objid", objid, UINT4_MAX))
        if not -(2**15) <= objsubid <= UINT2_MAX:  # pg_locks' int2 shows past 32767 negative
            raise InvalidKey(f"objsubid {objsubid} is outside -32768..{UINT2_MAX}")
        if is_key_form(objsubid):
            raise InvalidKey(f"objsubid {objsubid} is a SQL key's form, not an extension's tag")
        return _Numbers.__new__(cls, classid, objid, objsubid)

    @classmethod
    def of_row(cls, classid: int, objid: int, objsubid: int) -> AdvisoryTag:
        """A tag read from pg_locks: already in range, so the checks are skipped."""
        return tuple.__new__(cls, (classid, objid, objsubid))

    @property
    def label(self) -> str:
        """``extension advisory tag 0,822708183,10``: the numbers as who-holds --key takes
        them."""
        return f"{TAG_WORDS} {self}"

    @property
    def meaning(self) -> str:
        """What is known of it, in one sentence."""
        return (
            f"taken by an extension's C code with objsubid {self.objsubid} (the SQL functions "
            "take only 1 and 2): not a key, and never named (two extensions may use the same "
            "objsubid)"
        )

    def __str__(self) -> str:
        return f"{self.classid},{self.objid},{self.objsubid}"


def from_bigint(key: int) -> LockTriple:
    if not INT8_MIN <= key <= INT8_MAX:
        raise InvalidKey(f"{key} is outside the bigint range {INT8_MIN}..{INT8_MAX}")
    unsigned = key & (2**64 - 1)
    return LockTriple(unsigned >> 32, unsigned & UINT4_MAX, BIGINT_SUBID)


def from_pair(a: int, b: int) -> LockTriple:
    for value in (a, b):
        if not INT4_MIN <= value <= INT4_MAX:
            raise InvalidKey(f"{value} is outside the int4 range {INT4_MIN}..{INT4_MAX}")
    return LockTriple(to_uint4(a), to_uint4(b), PAIR_SUBID)


def parse_lock(numbers: list[str] | tuple[str, ...]) -> LockTriple | AdvisoryTag:
    """:func:`parse_numbers`, and three numbers with an objsubid other than 1 or 2 as an
    extension's :class:`AdvisoryTag` (who-holds --key, decode)."""
    values = _integers(numbers)
    if len(values) == 3 and not is_key_form(values[2]):
        return AdvisoryTag(*values)
    return _key(values)


def parse_numbers(numbers: list[str] | tuple[str, ...]) -> LockTriple:
    """Read a key written one of three ways.

    - one number: a bigint key, as passed to ``pg_advisory_lock(bigint)``;
    - two numbers: a signed int4 pair, as passed to ``pg_advisory_lock(int4, int4)``;
    - three numbers: ``classid objid objsubid`` copied from pg_locks.
    """
    return _key(_integers(numbers))


def _integers(numbers: list[str] | tuple[str, ...]) -> list[int]:
    values: list[int] = []
    for text in numbers:
        for part in re.split(r"[\s,:/]+", text.strip()):
            if not part:
                continue
            try:
                values.append(int(part))
            except ValueError:
                raise InvalidKey(f"{part!r} is not an integer") from None
    return values


def _key(values: list[int]) -> LockTriple:
    if len(values) == 1:
        return from_bigint(values[0])
    if len(values) == 2:
        return from_pair(values[0], values[1])
    if len(values) == 3:
        return LockTriple(*values)
    raise InvalidKey(
        f"expected 1 number (bigint key), 2 (int4 pair) or 3 (classid objid objsubid), "
        f"got {len(values)}"
    )


def namespace_key(form: Form, namespace_id: int, resource: int) -> LockTriple:
    """The key of ``resource`` in a namespace.

    ``pair``: ``pg_advisory_lock(namespace_id, resource)``, both int4.
    ``bigint``: ``pg_advisory_lock(namespace_id << 32 | resource)``: the namespace id (int4) in
    the high 32 bits, the resource (0..2^32-1) in the low 32 bits.
    """
    if not INT4_MIN <= namespace_id <= INT4_MAX:
        raise InvalidKey(f"namespace id {namespace_id} is outside int4 {INT4_MIN}..{INT4_MAX}")
    if form == "pair":
        if not INT4_MIN <= resource <= INT4_MAX:
            raise InvalidKey(
                f"resource {resource} is outside int4 {INT4_MIN}..{INT4_MAX} (pair form)"
            )
        return from_pair(namespace_id, resource)
    if not 0 <= resource <= UINT4_MAX:
        raise InvalidKey(
            f"resource {resource} is outside 0..{UINT4_MAX} "
            "(bigint form: the resource is the low 32 bits)"
        )
    return LockTriple(to_uint4(namespace_id), resource, BIGINT_SUBID)


def split_namespace(triple: LockTriple) -> tuple[int, int]:
    """The (namespace id, resource) of a key read under the registry's convention."""
    if triple.form == "pair":
        return triple.pair
    return to_int4(triple.classid), triple.objid


# -- resources of several parts ----------------------------------------------------------------

PartType = Literal["int", "text"]
DERIVATION = "sha256-v1"  # the name and version of the function below; never changes meaning


def derive_resource(
    form: Form, parts: tuple[tuple[str, PartType], ...], values: tuple[object, ...]
) -> int:
    """The resource number of a resource made of several parts ("tenant 73, period 2026-11").

    sha256-v1: each value, in the namespace's order, encoded as its type's letter (i or t), its
    UTF-8 length as 4 bytes big-endian and its UTF-8 bytes (an int as its decimal digits), all
    concatenated; the first 4 bytes of the SHA-256 of that, read big-endian, are the resource:
    signed (int4) in the pair form, unsigned in the bigint form. Distinct resources can share a
    number (a collision): `lockdiag registry check` states how likely that is.
    """
    if len(values) != len(parts):
        names = ", ".join(name for name, _ in parts)
        raise InvalidKey(f"this namespace's resource has {len(parts)} part(s): {names}")
    encoded = b""
    for (name, kind), value in zip(parts, values, strict=True):
        text = _part_text(name, kind, value)
        data = text.encode()
        encoded += (b"i" if kind == "int" else b"t") + len(data).to_bytes(4, "big") + data
    number = int.from_bytes(hashlib.sha256(encoded).digest()[:4], "big")
    return to_int4(number) if form == "pair" else number


def _part_text(name: str, kind: PartType, value: object) -> str:
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidKey(f"part {name!r} is an integer, not {value!r}")
        try:
            return str(int(value))
        except ValueError:
            raise InvalidKey(f"part {name!r} is an integer, not {value!r}") from None
    return str(value)
