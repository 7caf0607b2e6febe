"""The snapshot's data: pg_locks rows, pg_stat_activity sessions and server facts at one instant.

Plain immutable records, built by the server layer (:mod:`lockdiag.pg.capture`) or read from a
file (:mod:`lockdiag.core.snapshot_file`), so the analysis gives the same answer online and
offline.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Literal, NamedTuple

from lockdiag.keys import PAIR_SUBID, TAG_WORDS, AdvisoryTag, LockTriple, is_key_form, to_int4

Extent = Literal["advisory", "all"]  # the lock types a snapshot holds


@dataclass(frozen=True)
class Aggregated:
    """A read of what an answer needs (snapshot_aggregated_post_140000.sql): every lock in a
    wait, every lock of the backends in one, and the keys that must be named one by one
    (``key``: who-holds' key) come as rows; the other granted advisory locks of a backend come
    as one span per key space (:attr:`LockRow.keys`). Its diagnosis is the full read's
    (tests/test_aggregated.py). ``members``: each span's keys come too (their objids), for a
    dump that writes every lock without analysing each (:attr:`Snapshot.members`)."""

    all_types: bool = True
    key: LockTriple | AdvisoryTag | None = None
    members: bool = False


# what a capture reads: advisory locks, every lock, or Aggregated (what an answer needs)
Scope = Literal["advisory", "all"] | Aggregated


def extent_of(scope: Scope) -> Extent:
    """The lock types a read of ``scope`` holds: the full read that can stand in for it."""
    if isinstance(scope, Aggregated):
        return "all" if scope.all_types else "advisory"
    return scope


# a backend's granted advisory locks of one key space in one database and mode, as a span of
# an aggregated read groups them: (pid, database, mode, objsubid, classid)
Space = tuple[int | None, int | None, str, int | None, int | None]
HIDDEN_QUERY = "<insufficient privilege>"
IDLE_STATES = frozenset({"idle", "idle in transaction", "idle in transaction (aborted)"})
IN_TRANSACTION_IDLE = frozenset({"idle in transaction", "idle in transaction (aborted)"})
OLDEST_SUPPORTED = 140000  # server_version_num: pg_locks.waitstart appeared in 14


def format_version(server_version_num: int) -> str:
    major, minor = divmod(server_version_num, 10000)
    return f"{major}.{minor}" if major >= 10 else f"{major}.{minor // 100}.{minor % 100}"


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
    # backend_xid as a number, 0 when it has none (InvalidTransactionId; the view shows NULL);
    # None when not read (a snapshot file from before lockdiag read it). Visible for every
    # role's session, pg_read_all_stats or not.
    backend_xid: int | None = None

    @property
    def wrote(self) -> bool | None:
        """Whether its transaction may have written: a transaction id is assigned at its first
        write (or row lock), so a backend without one has written nothing and ending it loses
        no writes. None when unknown."""
        return None if self.backend_xid is None else self.backend_xid != 0

    @property
    def hidden(self) -> bool:
        """True when the observer's privileges hide this session's state and times."""
        return self.query == HIDDEN_QUERY or (self.state is None and self.backend_type is None)

    def idle_throughout(self, started: datetime) -> bool:
        """Idle (in a transaction or not) since before ``started``, the snapshot statement's
        start, and still idle when pg_stat_activity was read: idle for the whole read of
        pg_locks, however busy the server. A backend that changed state after ``started``
        may have held a lock as part of work that ended between the two reads."""
        return (
            self.state in IDLE_STATES
            and self.state_change is not None
            and self.state_change < started
        )

    def certainly_outside_transaction(self, started: datetime) -> bool:
        """Idle with no transaction for the whole pg_locks read: every advisory lock it held
        then is a session-level lock."""
        return (
            self.state == "idle"
            and self.xact_start is None
            and not self.hidden
            and self.idle_throughout(started)
        )

    @property
    def client(self) -> str | None:
        if self.client_addr is None:
            return None
        return f"{self.client_addr}:{self.client_port}" if self.client_port else self.client_addr


class LockRow(NamedTuple):
    """One row of pg_locks, plus the pids blocking it when it waits (pg_blocking_pids).

    A named tuple: built straight from the query's row (``_make``), a hundred thousand of them
    in a few milliseconds.

    A span (``keys`` > 1, an aggregated read's): that many granted advisory locks of one
    backend in one key space and mode, from ``objid`` (the lowest key) to ``objid_last``
    (the highest; by signed value for an int4 pair), none of them waited for.
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
    keys: int = 1  # the locks this row stands for: more than one for a span
    objid_last: int | None = None  # a span's highest key's objid

    @property
    def advisory_key(self) -> LockTriple | None:
        """The key a SQL function takes (objsubid 1 or 2); None for an extension's tag."""
        if self.locktype != "advisory" or self.classid is None or self.objid is None:
            return None
        if not is_key_form(self.objsubid):
            return None  # an extension's tag (advisory_tag)
        return LockTriple.of_row(self.classid, self.objid, self.objsubid or 0)

    @property
    def advisory_tag(self) -> AdvisoryTag | None:
        """An advisory lock an extension's C code took with another objsubid
        (pg_auto_failover's monitor 10 and 11, Citus 4 and up): its raw numbers, never a
        key of the registry's or the catalogue's."""
        if self.locktype != "advisory" or self.classid is None or self.objid is None:
            return None
        if is_key_form(self.objsubid):
            return None
        return AdvisoryTag.of_row(self.classid, self.objid, self.objsubid or 0)

    @property
    def held_object(self) -> builtins.tuple[object, ...]:
        """What commands that read over time follow of a granted lock (core.observe): its
        object, and a span's extent too (a span whose count or ends change is another hold:
        its keys cannot be told apart)."""
        if self.keys == 1:
            return self.lock_object
        return (*self.lock_object, self.keys, self.objid_last)

    @property
    def sparse(self) -> bool:
        """A span with gaps between its ends: the same ends and count may hold other keys."""
        if self.keys == 1 or self.objid is None or self.objid_last is None:
            return False
        low, high = self.objid, self.objid_last
        if self.objsubid == PAIR_SUBID:  # an int4 pair's objid is its signed second int
            low, high = to_int4(low), to_int4(high)
        return high - low + 1 != self.keys

    @property
    def lock_object(self) -> builtins.tuple[object, ...]:
        """What is locked, without who or how: rows with equal objects can conflict."""
        return (
            self.locktype,
            self.database,
            self.relation,
            self.page,
            self.tuple,
            self.virtualxid,
            self.transactionid,
            self.classid,
            self.objid,
            self.objsubid,
        )


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
    # tables here that confirm a guessed key's software (catalogue.SIGN_TABLES), by name
    software_tables: list[str] = field(default_factory=list)

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
        return format_version(self.version_num)


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

    @property
    def lends(self) -> bool:
        """Whether the pool hands this server connection to another client at every
        transaction end (transaction or statement pooling, read from the console): a
        session lock on it outlives the client that took it, whoever is attached now."""
        return self.via == "console" and self.pool_mode in ("transaction", "statement")


@dataclass(frozen=True)
class Remembered:
    """What earlier reads showed of one pooled server connection, kept by commands that read
    over time (:mod:`lockdiag.core.pool_memory`; never written to a file): the console showed
    it with no client attached while it held these locks as certain session locks, and every
    read since showed the same backend holding them."""

    seen: datetime  # the server's time of the first read that showed it so
    locks: frozenset[tuple[object, ...]]  # their LockRow.lock_object


@dataclass(frozen=True)
class DerivedKey:
    """A key of well-known software computed on the server (from its rows, or hashtext)."""

    database: str | None  # None: the same in every database
    key: int  # the bigint key; for a "pair-prefix", the first int4 argument; for a "pair",
    # both int4 arguments as one number: (a << 32) | (b & 0xFFFFFFFF)
    form: Literal["bigint", "pair-prefix", "pair"]
    software: str
    meaning: str


# a lock's Space (a span's: its backend, database, mode and key space), taken in C
space_of: Callable[[LockRow], Space] = attrgetter("pid", "database", "mode", "objsubid", "classid")


@dataclass(frozen=True)
class Snapshot:
    server: ServerInfo
    source: str  # where it was captured from, never with a password
    scope: Extent
    sessions: dict[int, Session]
    locks: list[LockRow]
    query_seconds: float = 0.0
    derived: list[DerivedKey] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, for the user
    pool: dict[int, PoolLink] = field(default_factory=dict)  # backend pid -> pooler link
    # backend pid -> what earlier reads showed of it (pool_memory; never in a file)
    remembered: dict[int, Remembered] = field(default_factory=dict)
    # an aggregated read's with members (Aggregated.members): each span's objids, ascending,
    # by its Space (never in a file)
    members: dict[Space, list[int]] = field(default_factory=dict)

    def session(self, pid: int | None) -> Session | None:
        return None if pid is None else self.sessions.get(pid)

    def members_of(self, lock: LockRow) -> list[int] | None:
        """A span's objids, ascending, when this read has them (Aggregated.members)."""
        return self.members.get(space_of(lock)) if lock.keys > 1 else None


def describe_lock(lock: LockRow, server: ServerInfo) -> str:
    """A non-advisory lock in pg_locks' own terms; a relation by name when the snapshot's
    database is the relation's (pg_class is per database), else by OID."""
    kind = lock.locktype
    relation = server.relation_name(lock.database, lock.relation) or f"oid {lock.relation}"
    if kind in ("relation", "extend"):
        return f"{kind} {relation}"
    if kind == "page":
        return f"page {relation} {lock.page}"
    if kind == "tuple":
        return f"tuple {relation} ({lock.page},{lock.tuple})"
    if kind == "transactionid":
        return f"transactionid {lock.transactionid}"
    if kind == "virtualxid":
        return f"virtualxid {lock.virtualxid}"
    if kind == "object":
        return f"object {lock.classid}:{lock.objid}:{lock.objsubid}"
    return tag_label(lock) or kind


def tag_label(lock: LockRow) -> str | None:
    """An extension's advisory tag by its numbers (``extension advisory tag 0,822708183,10``);
    a span of them (an aggregated read's: one backend's tags of one classid and objsubid) by
    its ends and count. None for any other lock."""
    tag = lock.advisory_tag
    if tag is None:
        return None
    if lock.keys == 1 or lock.objid_last is None:
        return tag.label
    last = tag._replace(objid=lock.objid_last)
    return f"{TAG_WORDS}s {tag}..{last} ({lock.keys:,} tags)"
