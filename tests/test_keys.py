"""Key arithmetic: unit and property tests, and the encoding checked against a real server."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockdiag import keys
from lockdiag.errors import InputError
from lockdiag.keys import LockTriple, from_bigint, from_pair, namespace_key, parse_numbers

int4 = st.integers(keys.INT4_MIN, keys.INT4_MAX)
int8 = st.integers(keys.INT8_MIN, keys.INT8_MAX)
uint4 = st.integers(0, keys.UINT4_MAX)


@given(int8)
def test_bigint_round_trip(key: int) -> None:
    triple = from_bigint(key)
    assert triple.objsubid == 1
    assert triple.bigint == key
    assert from_bigint(triple.bigint) == triple
    assert triple.args == (key,)


@given(int4, int4)
def test_pair_round_trip(a: int, b: int) -> None:
    triple = from_pair(a, b)
    assert triple.objsubid == 2
    assert triple.pair == (a, b)
    assert triple.args == (a, b)


@given(uint4, uint4, st.sampled_from([1, 2]))
def test_triple_round_trip_through_text(classid: int, objid: int, objsubid: int) -> None:
    triple = LockTriple(classid, objid, objsubid)
    assert parse_numbers([f"{classid} {objid} {objsubid}"]) == triple
    assert parse_numbers([str(a) for a in triple.args]) == triple


@given(int4, uint4)
def test_bigint_namespace_keeps_id_in_high_bits(namespace_id: int, resource: int) -> None:
    triple = namespace_key("bigint", namespace_id, resource)
    assert keys.split_namespace(triple) == (namespace_id, resource)
    assert triple.bigint == (namespace_id << 32) | resource


def test_reference_values() -> None:
    # known-locks.md: pg_advisory_lock(-1) and pg_advisory_lock(-5, 7); django-pglocks example
    assert from_bigint(-1) == LockTriple(4294967295, 4294967295, 1)
    assert from_pair(-5, 7) == LockTriple(4294967291, 7, 2)
    assert from_bigint(-55037190) == LockTriple(4294967295, 4239930106, 1)
    assert from_bigint(880340070654189915) == LockTriple(204970145, 1222811995, 1)
    assert parse_numbers(["4102,73"]).sql() == "SELECT pg_try_advisory_xact_lock(4102, 73)"


@pytest.mark.parametrize(
    ("numbers", "reason"),
    [
        (["1 2 3 4"], "expected 1 number"),
        (["abc"], "not an integer"),
        ([str(2**63)], "outside the bigint range"),
        (["2147483648 1"], "outside the int4 range"),
        (["4294967296 1 1"], "outside 0..4294967295"),
        (["1 1 3"], "objsubid 3 is not an advisory key form"),
        ([""], "got 0"),
    ],
)
def test_bad_numbers_are_refused(numbers: list[str], reason: str) -> None:
    with pytest.raises(InputError, match=reason):
        parse_numbers(numbers)


def test_namespace_resource_ranges() -> None:
    with pytest.raises(InputError, match="outside int4"):
        namespace_key("pair", 1, 2**31)
    with pytest.raises(InputError, match="low 32 bits"):
        namespace_key("bigint", 1, -1)
    with pytest.raises(InputError, match="namespace id"):
        namespace_key("bigint", 2**31, 1)


@pytest.mark.parametrize(
    "args",
    [(0,), (-1,), (keys.INT8_MIN,), (keys.INT8_MAX,), (4102, 73), (-5, 7), (keys.INT4_MIN, -1)],
)
def test_encoding_matches_the_server(cluster: Any, args: tuple[int, ...]) -> None:
    """What pg_locks shows for a lock taken with ``args`` is what lockdiag computes."""
    expected = from_bigint(*args) if len(args) == 1 else from_pair(*args)
    with psycopg.connect(cluster.dsn(), autocommit=True) as connection:
        placeholders = ", ".join(["%s"] * len(args))
        types = "::bigint" if len(args) == 1 else "::int4"
        call = ", ".join(f"{p}{types}" for p in placeholders.split(", "))
        connection.execute(f"SELECT pg_advisory_lock({call})", args)
        row = connection.execute(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
        assert row is not None
        assert LockTriple(*row) == expected
        assert connection.execute(f"SELECT pg_advisory_unlock({call})", args).fetchone() == (True,)
