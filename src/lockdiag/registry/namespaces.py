"""One ``[namespaces.NAME]`` table read into a Namespace: its id or its one key, its form,
expect, description and owner, max_hold and max_wait, and a resource of several parts with
its listed values; each problem reported through ``error(message, key)`` as it is found."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lockdiag.durations import parse_duration
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
    Expect,
    Namespace,
)

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")
NAMESPACE_KEYS = {
    *("id", "key", "form", "description", "owner", "expect", "max_hold", "max_wait"),
    *("resource", "values", "expected_resources"),
}
NOT_WITH_KEY = ("id", "resource", "values", "expected_resources")  # a key is one resource
PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,62}):(int|text)$")


def parse_namespace(
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
    positive = isinstance(expected, int) and not isinstance(expected, bool) and expected >= 1
    if expected is not None and not positive:
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
    listed = given if isinstance(given, list) else [None]
    matches = [PART.match(p) if isinstance(p, str) else None for p in listed]
    if not given or not all(matches):
        error(
            f'namespace {name!r}: resource must list its parts as "name:int" or "name:text", '
            f'e.g. ["tenant:int", "period:text"]',
            "resource",
        )
        return None
    return tuple((m.group(1), m.group(2)) for m in matches if m)  # type: ignore[misc]
