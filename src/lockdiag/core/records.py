"""Records from JSON, every field's type checked: the constructors that the snapshot file and
the server layer share (:func:`build_record`, :func:`server_info`), so a session read from the
server and one read from a file are made the same way. A value of the wrong type, or an
integer outside its field's real range (:data:`RANGES`), is a :class:`FieldError` that says
where it is (``locks[3].pid``) and what was expected."""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import fields
from datetime import datetime, timezone
from typing import Any, Literal, Union

from lockdiag.core.model import ServerInfo
from lockdiag.keys import INT4_MAX, INT4_MIN, INT8_MAX, INT8_MIN, UINT4_MAX

Range = tuple[int, int, str]  # lowest, highest, what the field is (for the error)
_PID = (0, INT4_MAX, "a pid is an int4")
_OID = (0, UINT4_MAX, "an oid is 32 bits, unsigned")
# The real range of each integer field of a record, by its name: what the server's column can
# hold (pg_locks, pg_stat_activity, pg_blocking_pids); any other integer field must be a
# bigint. A file (hand-edited, damaged, hostile) with a value outside is refused, naming the
# field: such a number reached arithmetic and outputs that refuse it (orjson: 64 bits).
RANGES: dict[str, Range] = {
    "pid": _PID,
    "leader_pid": _PID,
    "backend_pid": _PID,
    "blocked_by": (0, INT4_MAX, "a pid is an int4; 0 stands for a prepared transaction"),
    "database": _OID,
    "relation": _OID,
    "classid": _OID,
    "objid": _OID,
    "objid_last": _OID,
    # pg_locks shows a tag's uint16 field4 as an int2 (negative past 32767); read as uint16
    "objsubid": (-(2**15), 2**16 - 1, "a lock tag's field4 is 16 bits"),
    "page": (INT4_MIN, INT4_MAX, "pg_locks.page is an int4"),
    "tuple": (-(2**15), 2**15 - 1, "pg_locks.tuple is an int2"),
    "keys": (1, INT4_MAX, "a span stands for one lock or more"),
    "client_port": (-1, 2**16 - 1, "a port; -1 stands for a Unix socket"),
    "backend_xid": (0, UINT4_MAX, "a transaction id is 32 bits"),
    "version_num": (0, INT4_MAX, "server_version_num is an int4"),
}
_BIGINT: Range = (INT8_MIN, INT8_MAX, "no field is wider than a bigint")


class FieldError(Exception):
    """A field of the wrong type or shape: ``where`` it is and the ``reason``."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


_TIMESTAMP_FRACTION = re.compile(r"(\.\d+)")


def parse_timestamp(text: str) -> datetime:
    """ISO 8601 as PostgreSQL's JSON writes it (1 to 6 fractional digits, any Python >= 3.10)."""
    normalised = _TIMESTAMP_FRACTION.sub(lambda m: m.group(1)[:7].ljust(7, "0"), text, count=1)
    value = datetime.fromisoformat(normalised.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


_T = typing.TypeVar("_T")
Converter = typing.Callable[[Any], Any]  # a checked value, or _Mismatch


class _Mismatch(Exception):
    """A value of the wrong type; ``path`` is where inside it (an array index), if anywhere."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(reason)
        self.reason, self.path = reason, path


_FIELDS: dict[type, tuple[frozenset[str], dict[str, Converter]]] = {}


def build_record(cls: type[_T], raw: Any, where: str) -> _T:
    """An instance of dataclass or named tuple ``cls`` from a JSON object, checking every
    field's type. The checks are made once per class (a snapshot file holds a hundred
    thousand locks), and a place is only spelled out for the error."""
    raw = expect_dict(raw, where)
    known = _FIELDS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        tuple_fields = getattr(cls, "_fields", None)  # a named tuple's, else a dataclass's
        names = frozenset(tuple_fields or (f.name for f in fields(cls)))  # type: ignore[arg-type]
        known = _FIELDS[cls] = (
            names,
            {name: _converter(hints[name], RANGES.get(name, _BIGINT)) for name in names},
        )
    names, converters = known
    if not names.issuperset(raw):
        raise FieldError(where, f"unknown field {sorted(set(raw) - names)[0]!r}")
    values = {}
    for name, value in raw.items():
        try:
            values[name] = converters[name](value)
        except _Mismatch as error:
            raise FieldError(f"{where}.{name}{error.path}", error.reason) from None
    try:
        return cls(**values)
    except TypeError as error:
        missing = re.search(r"'(\w+)'", str(error))
        raise FieldError(where, f"missing field {missing.group(1) if missing else ''}") from None


def convert(value: Any, hint: Any, where: str, bounds: Range = _BIGINT) -> Any:
    try:
        return _converter(hint, bounds)(value)
    except _Mismatch as error:
        raise FieldError(f"{where}{error.path}", error.reason) from None


def _converter(hint: Any, bounds: Range = _BIGINT) -> Converter:
    """A function that checks (and converts) a JSON value against a type hint; an integer
    (or each integer of a tuple) against ``bounds`` too."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        (inner,) = [o for o in typing.get_args(hint) if o is not type(None)]
        convert = _converter(inner, bounds)
        return lambda value: None if value is None else convert(value)
    if hint is datetime:
        return _timestamp
    if hint is int:
        return _integer(bounds)
    if hint in _SCALARS:
        return _SCALARS[hint]
    if origin is tuple:
        integer = _integer(bounds)
        return lambda value: tuple(_items(value, integer))
    if origin is list:
        return lambda value: _items(value, _SCALARS[str])
    if origin is dict:
        return _oid_names
    if origin is Literal:
        choices = typing.get_args(hint)

        def literal(value: Any) -> Any:
            if value in choices:
                return value
            wanted = ", ".join(repr(a) for a in choices)
            raise _Mismatch(f"expected one of {wanted}, got {value!r:.60}")

        return literal
    raise TypeError(f"no converter for {hint!r}")  # pragma: no cover - a programming error


def _scalar(kind: type, name: str, accept: typing.Callable[[Any], bool]) -> Converter:
    def convert(value: Any) -> Any:
        if accept(value):
            return float(value) if kind is float else value
        raise _Mismatch(f"expected {name}, got {value!r:.60}")

    return convert


def _integer(bounds: Range) -> Converter:
    """An integer within ``bounds`` (true and false are not integers here)."""
    low, high, what = bounds

    def convert(value: Any) -> Any:
        if type(value) is int and low <= value <= high:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            raise _Mismatch(f"{_number(value)} is outside {low}..{high}: {what}")
        raise _Mismatch(f"expected an integer, got {value!r:.60}")

    return convert


def _number(value: int) -> str:
    """An integer as an error shows it: a long one by its first digits and its length."""
    digits = str(value)  # json.loads gives none longer than int()'s limit (4300 digits)
    return digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"


_SCALARS: dict[Any, Converter] = {
    bool: _scalar(bool, "true or false", lambda v: isinstance(v, bool)),
    int: _integer(_BIGINT),
    float: _scalar(  # a finite number, an integer one within a bigint (float() of 10**400 fails)
        float,
        "a finite number",
        lambda v: (
            (type(v) is float and math.isfinite(v))
            or (type(v) is int and INT8_MIN <= v <= INT8_MAX)
        ),
    ),
    str: _scalar(str, "a string", lambda v: isinstance(v, str)),
}


def _timestamp(value: Any) -> datetime:
    if isinstance(value, str):
        try:
            return parse_timestamp(value)
        except ValueError:
            pass
    raise _Mismatch(f"expected an ISO 8601 timestamp, got {value!r:.60}")


def _items(value: Any, convert: Converter) -> list[Any]:
    if not isinstance(value, list):
        raise _Mismatch("expected an array")
    items = []
    for index, item in enumerate(value):
        try:
            items.append(convert(item))
        except _Mismatch as error:
            raise _Mismatch(error.reason, f"[{index}]") from None
    return items


def _oid_names(value: Any) -> dict[int, str]:
    if not isinstance(value, dict):
        raise _Mismatch("expected an object")
    names = {}
    for key, name in value.items():
        if type(key) is int:  # the server's (capture), not a file's: JSON's keys are strings
            oid = key
        else:
            digits = isinstance(key, str) and 0 < len(key) <= 10 and key.isascii() and key.isdigit()
            oid = int(key) if digits else -1
        if not 0 <= oid <= UINT4_MAX:
            raise _Mismatch(f"expected oids (0..{UINT4_MAX}) as keys, got {key!r:.60}")
        try:
            names[oid] = _SCALARS[str](name)
        except _Mismatch as error:
            raise _Mismatch(error.reason, f".{key}") from None
    return names


def expect_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(where, "expected an object")
    return value


def expect_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(where, "expected an array")
    return value


def server_info(raw: dict[str, Any], version_num: int) -> ServerInfo:
    """ServerInfo from the snapshot query's JSON (or a file's), defaults for empty lists."""
    raw = dict(raw, version_num=version_num)
    raw["relations"] = raw.get("relations") or {}  # json_object_agg of no rows is NULL
    raw["tables"] = raw.get("tables") or []
    raw["extensions"] = raw.get("extensions") or []
    raw["software_tables"] = raw.get("software_tables") or []
    return build_record(ServerInfo, raw, "server")
