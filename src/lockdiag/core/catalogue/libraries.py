"""Lock libraries and frameworks: an application takes a lock around a block of its own code,
the key made of a name the team chose (listed in the registry's ``[known]``) or of its rows."""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable, Iterable
from typing import Literal

from lockdiag.core.catalogue.entry import Family, Known, Program, Signs, Software
from lockdiag.core.catalogue.formulas import crc32, signed64
from lockdiag.keys import LockTriple, from_bigint, from_pair, to_int4
from lockdiag.registry import Candidates, KnownList

Shape = Literal["bigint", "int4", "pair"]
# helpers that hash a name with a common digest, by digest, byte order and key shape (from
# their source): the other combinations are named by what they compute
DIGEST_HELPERS: dict[tuple[str, str, Shape], str] = {
    ("sha256", "big", "bigint"): "django-pglocks",  # 2.x and django-pgware: [:8], "big"
    ("sha256", "little", "bigint"): "django-pglock",  # Opus10's: [:8], "little", signed
    ("sha1", "little", "bigint"): "pals",  # struct.unpack("<q", sha1(...)[:8])
    ("sha256", "little", "pair"): "advisory-lock (npm)",  # readInt32LE(0), readInt32LE(4)
}
DIGESTS = ("sha256", "sha1", "md5")


def digest_keys(name: str) -> dict[LockTriple, Known]:
    """The keys a helper makes of ``name`` with sha256, sha1 or md5: the first 8 bytes as a
    bigint, the first 4 as an int4 (passed as a bigint), or the first 8 as two int4 (a pair),
    each read big-endian and little-endian, signed."""
    found: dict[LockTriple, Known] = {}
    for algorithm in DIGESTS:
        digest = hashlib.new(algorithm, name.encode(), usedforsecurity=False).digest()
        for order in ("big", "little"):
            endian = ">" if order == "big" else "<"
            first, second = struct.unpack(f"{endian}ii", digest[:8])
            keys: dict[Shape, LockTriple] = {
                "bigint": from_bigint(signed64(digest, endian)),
                "int4": from_bigint(first),
                "pair": from_pair(first, second),
            }
            for shape, triple in keys.items():
                helper = DIGEST_HELPERS.get((algorithm, order, shape))
                meaning = f"lock {name!r}"
                if helper is None:
                    helper, meaning = (
                        "hashed name",
                        f"{name!r} ({algorithm}, {order}-endian {shape})",
                    )
                found.setdefault(triple, Known(helper, meaning, "derived"))
    return found


def medusa_hash(name: str) -> int:
    """@medusajs/locking-postgres: h = 5381; from the last character to the first,
    h = (h * 33) ^ code, as an unsigned 32-bit number (JavaScript's ``h >>> 0``)."""
    value = 5381
    for character in reversed(name.encode("utf-16-be").decode("utf-16-be")):
        value = ((value * 33) ^ ord(character)) & 0xFFFFFFFF
    return value


def library_keys(
    with_advisory_lock: Iterable[str] = (),
    with_advisory_lock_prefix: int = 0,
    django_pglocks: Iterable[str] = (),
    pals: Iterable[str] = (),
    advisory_lock_npm: Iterable[str] = (),
    medusa: Iterable[str] = (),
    digests: bool = True,
) -> dict[LockTriple, Known]:
    """Keys of the names listed for libraries that hash names in Python, Ruby or JavaScript
    in ways Python can repeat (CRC-32, SHA-1, SHA-256, djb2). A name listed for a library that
    hashes with a digest is also tried with every other common digest and byte order
    (:func:`digest_keys`): helpers differ only in those (``digests`` False: not tried)."""
    found: dict[LockTriple, Known] = {}
    for name in medusa:
        found[from_bigint(medusa_hash(name))] = Known(
            "@medusajs/locking-postgres", f"lock {name!r}", "derived"
        )
    for name in with_advisory_lock:
        key = from_pair(crc32(name) & 0x7FFFFFFF, with_advisory_lock_prefix & 0x7FFFFFFF)
        found[key] = Known("with_advisory_lock", f"lock {name!r}", "derived")
    for name in django_pglocks:
        found[from_bigint(to_int4(crc32(name)))] = Known(
            "django-pglocks", f"lock {name!r} (1.0.x)", "derived"
        )
    for triple, known in _digests((*django_pglocks, *pals, *advisory_lock_npm)).items():
        if digests:
            found.setdefault(triple, known)
    return found


def _listed(
    name: str, keys: Callable[[tuple[str, ...]], dict[LockTriple, Known]]
) -> Callable[[Candidates], dict[LockTriple, Known]]:
    """The keys of the names of one ``[known]`` list."""

    def listed(candidates: Candidates) -> dict[LockTriple, Known]:
        return keys(candidates.names(name))

    return listed


def _with_advisory_lock(candidates: Candidates) -> dict[LockTriple, Known]:
    return library_keys(
        candidates.names("with_advisory_lock"), candidates.number("with_advisory_lock_prefix")
    )


def _digests(names: Iterable[str]) -> dict[LockTriple, Known]:
    found: dict[LockTriple, Known] = {}
    for name in dict.fromkeys(names):
        for triple, known in digest_keys(name).items():
            found.setdefault(triple, known)
    return found


def _django_pglocks(names: tuple[str, ...]) -> dict[LockTriple, Known]:
    return {**_digests(names), **library_keys(django_pglocks=names, digests=False)}


_BLOCK = "held around a block of the application's code"

LIBRARIES = Family(
    (
        Program(
            "with_advisory_lock",
            Software("library", "pg_advisory_lock", _BLOCK),
            lists=(
                KnownList("with_advisory_lock", "Ruby with_advisory_lock names"),
                KnownList("with_advisory_lock_prefix", "WITH_ADVISORY_LOCK_PREFIX", 0),
            ),
            listed_keys=_with_advisory_lock,
        ),
        Program(
            "django-pglocks",
            Software("library", "pg_advisory_lock", _BLOCK),
            lists=(
                KnownList("django_pglocks", "also tried with sha256/sha1/md5, both byte orders"),
            ),
            listed_keys=_listed("django_pglocks", _django_pglocks),
        ),
        Program(
            "pals",
            Software("library", "pg_advisory_lock", _BLOCK),
            lists=(KnownList("pals", '"app.name", as pals hashes it'),),
            listed_keys=_listed("pals", _digests),
        ),
        Program(
            "advisory-lock (npm)",
            Software("library", "pg_advisory_lock", _BLOCK),
            lists=(KnownList("advisory_lock_npm", "names given to the npm package advisory-lock"),),
            listed_keys=_listed("advisory_lock_npm", _digests),
        ),
        Program(
            "@medusajs/locking-postgres",
            Software(
                "library", "pg_advisory_xact_lock", "held by one transaction of the application"
            ),
            lists=(KnownList("medusa", "keys given to @medusajs/locking-postgres"),),
            listed_keys=_listed("medusa", lambda names: library_keys(medusa=names)),
        ),
        # RelStorage 4.3.0 adapters/postgresql: locker.py, procs/lock_objects_and_detect_
        # conflicts.sql and procs/*/lock_and_choose_tid.sql; connmanager.py names the store
        # connection "RS: Store". Its administrative keys are negative so as never to meet an
        # OID (locker.py): small numbers other code may pick too, named only with RelStorage's
        # tables or sessions (its tables of both schemas, "RS: Store", "RS: Load").
        Program(
            "RelStorage",
            Software(
                "library",
                "pg_advisory_xact_lock",
                "held by a ZODB two-phase commit: its store connection ('RS: Store') stays idle "
                "in transaction between vote and finish with one lock per object it changes "
                "(the key is the object's OID) and takes the commit lock -1 to finish; a pack "
                "holds the session lock -2",
                "check the ZODB application that is committing (its process, its log) before "
                "acting: ending the store connection between vote and finish fails the "
                "commit's second phase ('Resources may be in an inconsistent state')",
            ),
            guesses={from_bigint(-1): "commit lock", from_bigint(-2): "pack lock"},
            signs=Signs(
                ("object_state", "commit_row_lock"),
                ("rs: ",),
                re.compile(r"\b(?:lock_objects_and_detect_conflicts|lock_and_choose_tid)\b"),
            ),
            # a session that names itself, whatever it holds (its per-object keys are OIDs)
            sessions={
                "RS: Store": "store connection of a ZODB commit (its object locks are the OIDs)"
            },
        ),
    ),
)
