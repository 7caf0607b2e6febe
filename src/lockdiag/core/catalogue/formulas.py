"""Hashes that several programs build their keys with, as each language computes them."""

from __future__ import annotations

import struct
import zlib

from lockdiag.keys import to_int4


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit signed overflow)."""
    value = 0
    encoded = text.encode("utf-16-be")
    for index in range(0, len(encoded), 2):
        value = (31 * value + int.from_bytes(encoded[index : index + 2], "big")) & 0xFFFFFFFF
    return to_int4(value)


def crc32(text: str) -> int:
    return zlib.crc32(text.encode())


def signed64(digest: bytes, endian: str = ">") -> int:
    """The first 8 bytes of a digest as a signed bigint."""
    (value,) = struct.unpack(f"{endian}q", digest[:8])
    return int(value)
