"""The snapshot: pg_locks joined with pg_stat_activity at one instant, and its JSON file form.

Every read command works on a Snapshot, captured live by :func:`capture` or loaded from a file
by :func:`load`, so the analysis gives the same answer online and offline.
"""

from __future__ import annotations

import builtins
import json
import re
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Union

from lockdiag import queries
from lockdiag.errors import InputError
from lockdiag.keys import LockTriple

if TYPE_CHECKING:
    import psycopg

Scope = Literal["advisory", "all"]
FILE_FORMAT = "lockdiag-snapshot"
FILE_VERSION = 1
HIDDEN_QUERY = "<insufficient privilege>"


@dataclass(frozen=True, slots=True)
class Session:
    """A backend's row of pg_stat_activity. Without pg_read_all_stats, another role's session
    keeps pid, database, user and application_name; the rest is NULL (``hidden``)."""

    pid: int
    database: str | None = None
    user: str | None = None
    application_name: str | None = None
    client_addr: str | None = None
    client_port: int | None = None
    backend_start: datetime | None = None
    xact_start: datetime | None = None
    query_start: datetime | None = None
    state_change: datetime | None = None
    state: str | None = None
    wait_event_type: str | None = None
    wait_event: str | None = None
    backend_type: str | None = None
    leader_pid: int | None = None
    query: str | None = None

    @property
    def hidden(self) -> bool:
        """True when the observer's privileges hide this session's state and times."""
        return self.query == HIDDEN_QUERY or (self.state is None and self.backend_type is None)

    @property
    def certainly_outside_transaction(self) -> bool:
        """Idle with no transaction: every advisory lock it holds is session-level."""
        return self.state == "idle" and self.xact_start is None and not self.hidden

    @property
    def client(self) -> str | None:
        if self.client_addr is None:
            return None
        return f"{self.client_addr}:{self.client_port}" if self.client_port else self.client_addr


class LockRow(NamedTuple):
    """One row of pg_locks, plus the pids blocking it when it waits (pg_blocking_pids).

    A named tuple: built straight from the query's row (``_make``), a hundred thousand of them
    in a few milliseconds.
    """

    locktype: str
    database: int | None
    relation: int | None
    page: int | None
    tuple: int | None
    virtualxid: str | None
    transactionid: str | None
    classid: int | None
    objid: int | None
    objsubid: int | None
    virtualtransaction: str | None
    pid: int | None  # NULL for a prepared transaction
    mode: str
    granted: bool
    waitstart: datetime | None = None
    blocked_by: builtins.tuple[int, ...] | None = None

    @property
    def advisory_key(self) -> LockTriple | None:
        if self.locktype != "advisory" or self.classid is None or self.objid is None:
            return None
        if self.objsubid not in (1, 2):  # never from the server; a hand-edited snapshot file
            return LockTriple(self.classid, self.objid, self.objsubid or 0)
        return LockTriple.of_row(self.classid, self.objid, self.objsubid)

    @property
    def lock_object(self) -> builtins.tuple[object, ...]:
        """What is locked, without who or how: rows with equal objects can conflict."""
        return (
            self.locktype, self.database, self.relation, self.page, self.tuple,
            self.virtualxid, self.transactionid, self.classid, self.objid, self.objsubid,
        )  # fmt: skip


@dataclass(frozen=True)
class ServerInfo:
    version_num: int
    now: datetime
    current_user: str
    backend_pid: int
    in_recovery: bool
    read_all_stats: bool
    databases: dict[int, str]
    database: str = ""  # the database lockdiag connected to
    relations: dict[int, str] = field(default_factory=dict)  # oid -> schema.name, this database
    tables: list[str] = field(default_factory=list)  # well-known software's tables found here
    extensions: list[str] = field(default_factory=list)  # pg_partman, pgmq, when installed

    def relation_name(self, database: int | None, relation: int | None) -> str | None:
        """A locked relation's name, when it lives in this database (or is shared)."""
        if relation is None or database not in (0, self.database_oid):
            return None
        return self.relations.get(relation)

    @property
    def database_oid(self) -> int | None:
        return next((oid for oid, name in self.databases.items() if name == self.database), None)

    @property
    def version(self) -> str:
        return queries.format_version(self.version_num)


@dataclass(frozen=True)
class PoolLink:
    """A backend that is a connection pooler's server connection."""

    pooler: str  # the console's host:port, or the pooler's address
    pool: str  # "database/user" (empty when known by address only)
    pool_mode: str  # session, transaction, statement ("" when unknown)
    server_state: str  # PgBouncer's state of the server connection: active, idle, used...
    client: str | None  # the client attached right now (addr:port), None when none is
    client_application: str | None
    via: Literal["console", "address"]  # read from the admin console, or only the address


@dataclass(frozen=True)
class DerivedKey:
    """A key of well-known software computed on the server (from its rows, or hashtext)."""

    database: str | None  # None: the same in every database
    key: int  # the bigint key; for a "pair-prefix", the first int4 argument
    form: Literal["bigint", "pair-prefix"]
    software: str
    meaning: str


@dataclass(frozen=True)
class Snapshot:
    server: ServerInfo
    source: str  # where it was captured from, never with a password
    scope: Scope
    sessions: dict[int, Session]
    locks: list[LockRow]
    query_seconds: float = 0.0
    derived: list[DerivedKey] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, for the user
    pool: dict[int, PoolLink] = field(default_factory=dict)  # backend pid -> pooler link

    def session(self, pid: int | None) -> Session | None:
        return None if pid is None else self.sessions.get(pid)


def capture(
    connection: psycopg.Connection[Any], source: str, scope: Scope = "advisory"
) -> Snapshot:
    """One query, one round trip: every lock (or every advisory lock) with its sessions."""
    sql = queries.query("snapshot", connection.info.server_version)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, {"all_types": scope == "all"})
        rows = cursor.fetchall()
    elapsed = time.perf_counter() - started
    locks: list[LockRow] = []
    sessions: dict[int, Session] = {}
    server: dict[str, Any] = {}
    relations: dict[int, str] = {}
    make = LockRow._make
    for row in rows:
        kind = row[0]
        if kind == "lock":
            lock = make(row[1:17])  # the LockRow fields, in order; blocked_by last
            if lock.blocked_by is not None:  # an array arrives as a list
                lock = lock._replace(blocked_by=tuple(lock.blocked_by))
            locks.append(lock)
            if row[17] is not None:
                relations[row[3]] = row[17]
        elif kind == "session":
            session = _build(Session, row[18], "session")
            sessions[session.pid] = session
        else:
            server = row[18]
    info = _build_server(dict(server, relations=relations), connection.info.server_version)
    return Snapshot(info, source, scope, sessions, locks, elapsed)


def _build_server(raw: dict[str, Any], version_num: int) -> ServerInfo:
    raw = dict(raw, version_num=version_num)
    raw["relations"] = raw.get("relations") or {}  # json_object_agg of no rows is NULL
    raw["tables"] = raw.get("tables") or []
    raw["extensions"] = raw.get("extensions") or []
    return _build(ServerInfo, raw, "server")


# -- the snapshot file -------------------------------------------------------------------------


def dumps(snapshot: Snapshot) -> str:
    document = {
        "format": FILE_FORMAT,
        "version": FILE_VERSION,
        "source": snapshot.source,
        "scope": snapshot.scope,
        "server": _plain(asdict(snapshot.server)),
        "sessions": [_plain(asdict(s)) for s in snapshot.sessions.values()],
        "locks": [_plain(lock._asdict()) for lock in snapshot.locks],
        "derived": [asdict(key) for key in snapshot.derived],
        "notes": snapshot.notes,
        "pool": [{"pid": pid, **asdict(link)} for pid, link in snapshot.pool.items()],
    }
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def save(snapshot: Snapshot, path: Path) -> None:
    text = dumps(snapshot)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write snapshot file {path}: {error.strerror or error}") from None


def load(path: Path) -> Snapshot:
    """Read a snapshot file; any problem is an InputError naming the file and the place."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise InputError(f"cannot read snapshot file {path}: {reason}") from None
    return loads(text, str(path))


def loads(text: str, name: str = "<snapshot>") -> Snapshot:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{name}:{error.lineno}: not a snapshot file: invalid JSON ({error.msg})"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FILE_FORMAT:
        raise InputError(f'{name}: not a lockdiag snapshot file (no "format": "{FILE_FORMAT}")')
    if document.get("version") != FILE_VERSION:
        raise InputError(
            f"{name}: snapshot file version {document.get('version')!r} is not supported "
            f"(this lockdiag reads version {FILE_VERSION})"
        )
    try:
        scope = document.get("scope")
        if scope not in ("advisory", "all"):
            raise _FieldError("scope", 'expected "advisory" or "all"')
        source = document.get("source")
        if not isinstance(source, str):
            raise _FieldError("source", "expected a string")
        raw_server = _expect_dict(document.get("server"), "server")
        version_num = _convert(raw_server.get("version_num"), int, "server.version_num")
        server = _build_server(raw_server, version_num)
        sessions = {}
        for index, raw in enumerate(_expect_list(document.get("sessions"), "sessions")):
            session = _build(Session, raw, f"sessions[{index}]")
            sessions[session.pid] = session
        locks = [
            _build(LockRow, raw, f"locks[{index}]")
            for index, raw in enumerate(_expect_list(document.get("locks"), "locks"))
        ]
        derived = [
            _build(DerivedKey, raw, f"derived[{index}]")
            for index, raw in enumerate(_expect_list(document.get("derived", []), "derived"))
        ]
        notes = [
            _convert(note, str, f"notes[{index}]")
            for index, note in enumerate(_expect_list(document.get("notes", []), "notes"))
        ]
        pool = {}
        for index, item in enumerate(_expect_list(document.get("pool", []), "pool")):
            fields_of_link = dict(_expect_dict(item, f"pool[{index}]"))
            pid = _convert(fields_of_link.pop("pid", None), int, f"pool[{index}].pid")
            pool[pid] = _build(PoolLink, fields_of_link, f"pool[{index}]")
    except _FieldError as error:
        raise InputError(f"{name}: {error.where}: {error.reason}") from None
    except InputError as error:
        raise InputError(f"{name}: {error}") from None
    return Snapshot(server, source, scope, sessions, locks, 0.0, derived, notes, pool)


class _FieldError(Exception):
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


def _build(cls: type[_T], raw: Any, where: str) -> _T:
    """An instance of dataclass or named tuple ``cls`` from a JSON object, checking every
    field's type. The checks are made once per class (a snapshot file holds a hundred
    thousand locks), and a place is only spelled out for the error."""
    raw = _expect_dict(raw, where)
    known = _FIELDS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        tuple_fields = getattr(cls, "_fields", None)  # a named tuple's, else a dataclass's
        names = frozenset(tuple_fields or (f.name for f in fields(cls)))  # type: ignore[arg-type]
        known = _FIELDS[cls] = (names, {name: _converter(hints[name]) for name in names})
    names, converters = known
    if not names.issuperset(raw):
        raise _FieldError(where, f"unknown field {sorted(set(raw) - names)[0]!r}")
    values = {}
    for name, value in raw.items():
        try:
            values[name] = converters[name](value)
        except _Mismatch as error:
            raise _FieldError(f"{where}.{name}{error.path}", error.reason) from None
    try:
        return cls(**values)
    except TypeError as error:
        missing = re.search(r"'(\w+)'", str(error))
        raise _FieldError(where, f"missing field {missing.group(1) if missing else ''}") from None


def _convert(value: Any, hint: Any, where: str) -> Any:
    try:
        return _converter(hint)(value)
    except _Mismatch as error:
        raise _FieldError(f"{where}{error.path}", error.reason) from None


def _converter(hint: Any) -> Converter:
    """A function that checks (and converts) a JSON value against a type hint."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        (inner,) = [o for o in typing.get_args(hint) if o is not type(None)]
        convert = _converter(inner)
        return lambda value: None if value is None else convert(value)
    if hint is datetime:
        return _timestamp
    if hint in _SCALARS:
        return _SCALARS[hint]
    if origin is tuple:
        return lambda value: tuple(_items(value, _SCALARS[int]))
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


_SCALARS: dict[Any, Converter] = {
    bool: _scalar(bool, "true or false", lambda v: isinstance(v, bool)),
    int: _scalar(int, "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: _scalar(
        float, "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
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
        try:
            oid = int(key)
        except ValueError:
            raise _Mismatch("expected oids as keys") from None
        try:
            names[oid] = _SCALARS[str](name)
        except _Mismatch as error:
            raise _Mismatch(error.reason, f".{key}") from None
    return names


def _expect_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _FieldError(where, "expected an object")
    return value


def _expect_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _FieldError(where, "expected an array")
    return value


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready values: timestamps as ISO 8601, tuples as lists."""
    return {
        key: value.isoformat() if isinstance(value, datetime)
        else list(value) if isinstance(value, tuple)
        else value
        for key, value in values.items()
    }  # fmt: skip
