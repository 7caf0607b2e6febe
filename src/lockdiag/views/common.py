"""What every view shares: a lock's label and age, JSON of locks, sessions and servers,
notes, and one section per target for a fleet.

JSON field names are a documented, stable interface (README, "JSON output"): add fields, never
rename or remove them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter, itemgetter
from typing import Any

import orjson

from lockdiag.core.analysis import LockEntry
from lockdiag.core.catalogue import Known
from lockdiag.core.decoding import Decoded
from lockdiag.core.expansion import Run
from lockdiag.core.model import LockRow, PoolLink, ServerInfo, Session, Snapshot, describe_lock
from lockdiag.durations import format_duration
from lockdiag.keys import BIGINT_SUBID, to_int4, to_int8
from lockdiag.render import Block, Cells, Items, Output, Text, clean

JSON_VERSION = 1


# -- shared pieces -----------------------------------------------------------------------------


def lock_label(entry: LockEntry, server: ServerInfo) -> str:
    if entry.decoded is not None:
        return clean(entry.decoded.label)
    return clean(describe_lock(entry.lock, server))


class Labels:
    """:func:`lock_label` of many locks, for a dump: the label of a key in a space that a
    plain namespace names (``tenant_summary 73``), or that nothing names (``unregistered pair
    (7, 49996)``), is the same text around one number, made once per namespace or space; per
    lock only the number is formatted. :func:`clean` maps one character at a time, so the
    parts cleaned apart give the label cleaned whole."""

    def __init__(self) -> None:
        self.heads: dict[object, str] = {}  # by id(namespace), or by (objsubid, classid)

    def of(self, entry: LockEntry, server: ServerInfo) -> str:
        decoded = entry.decoded
        if decoded is None or decoded.last is not None or decoded.known is not None:
            return lock_label(entry, server)
        namespace = decoded.namespace
        if namespace is not None:
            if namespace.parts or namespace.exact is not None:
                return lock_label(entry, server)
            head = self.heads.get(id(namespace))
            if head is None:
                head = self.heads[id(namespace)] = clean(f"{namespace.name} ")
            return f"{head}{decoded.resource}"
        classid, objid, objsubid = decoded.triple
        if objsubid == BIGINT_SUBID:  # LockTriple.bigint, without the property's calls
            return f"unregistered bigint {to_int8(classid, objid)}"
        head = self.heads.get((objsubid, classid))
        if head is None:
            head = self.heads[(objsubid, classid)] = f"unregistered pair ({to_int4(classid)}, "
        return f"{head}{to_int4(objid)})"

    def run(self, run: Run, server: ServerInfo) -> Cells:
        """The labels of a run of a span's locks, as :meth:`of` gives each: the text around
        the numbers made once, the numbers per lock when they are written."""
        entry, objids = run
        decoded = entry.decoded
        plain = decoded is not None and decoded.known is None
        namespace = decoded.namespace if decoded is not None else None
        if not plain or (
            namespace is not None and (namespace.parts or namespace.exact is not None)
        ):
            made = [self.of(one, server) for one in run.entries()]  # each made alone
            return Cells(lambda: made, len(made), max(map(len, made)))
        assert decoded is not None
        classid, _, objsubid = decoded.triple
        bigint = objsubid == BIGINT_SUBID
        # a namespace's resource (a bigint key's objid, a pair's second int), or the key
        numbers = objids if bigint and namespace is not None else run.numbers()
        if namespace is not None:
            head, tail = clean(f"{namespace.name} "), ""
        elif bigint:
            head, tail = "unregistered bigint ", ""
        else:
            head, tail = f"unregistered pair ({to_int4(classid)}, ", ")"
        widest = max(len(str(min(numbers))), len(str(max(numbers))))
        return Cells(
            lambda: [f"{head}{n}{tail}" for n in numbers],
            len(numbers),
            len(head) + widest + len(tail),
        )


def age(entry: LockEntry) -> str:
    """How long, marked as a lower bound where it is one."""
    if entry.waited is not None:
        return f"waiting {format_duration(entry.waited)}"
    if entry.held_at_least is not None:
        return f"≥ {format_duration(entry.held_at_least)}"
    return "?" if entry.lock.granted else "waiting"


def unknown_ages(entries: Iterable[LockEntry], column: str = "AGE") -> list[str]:
    """What ``column``'s "?" means, when a held lock shows it."""
    # whether a granted lock has no bound, told in C (a dump has a hundred thousand entries)
    if None not in map(_HELD_AT_LEAST, filter(_GRANTED, entries)):
        return []
    return [
        f"{column} ?: held, for a time not known: PostgreSQL records no time a lock was taken, and "
        "the session has been at work since it may have taken it (an idle one gives ≥ a lower "
        "bound)"
    ]


_GRANTED, _HELD_AT_LEAST = attrgetter("lock.granted"), attrgetter("held_at_least")

# a call that takes an advisory lock (not an unlock): a last statement that may have taken it
TAKES_ADVISORY = re.compile(r"\bpg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?\s*\(", re.I)


@dataclass(frozen=True)
class BusyBound:
    """A certain session lock whose lower bound comes from a session that keeps running
    statements (a leader's keep-alive ``SELECT 1``, a pool's health check): an idle session's
    bound counts from its last statement, and one that was not an advisory-lock call ran after
    the lock was taken. The lock is at most as old as the session."""

    entry: LockEntry  # the first of the backend's certain session locks
    label: str  # its lock's label
    bound: float  # seconds: the state bound (since the last statement ended)
    connected: float  # seconds since backend_start: how old the lock may be

    def unjudged(self, session_age: float) -> bool:
        """Whether --session-age could not judge it from this read: below it, while the lock
        may be older, in a namespace not declared long-lived."""
        decoded = self.entry.decoded
        namespace = decoded.namespace if decoded is not None else None
        expected = namespace is not None and namespace.expect == "session"
        return self.bound < session_age <= self.connected and not expected

    def words(self, column: str) -> str:
        """``pid 29844 (app), holding leader 1: AGE ≥ 317ms: its session ran a statement
        317ms ago; ...``."""
        session, bound = self.entry.session, format_duration(self.bound)
        app = session.application_name if session is not None else None
        who = f"pid {self.entry.lock.pid}" + (f" ({clean(app)})" if app else "")
        return (
            f"{who}, holding {self.label}: {column} ≥ {bound}: its session ran a statement "
            f"{bound} ago (not an "
            f"advisory-lock call); the lock may be far older (the session connected "
            f"{format_duration(self.connected)} ago)"
        )


def _busy(session: Session, now: datetime) -> bool:
    """Idle outside a transaction, its last statement not an advisory-lock call, and connected
    long before that statement ended (as :func:`figures` weighs a bound: twice it and a
    second more), so that the lock may be far older than its bound."""
    if not session.certainly_outside_transaction(now) or not session.query:
        return False
    if session.backend_start is None or session.state_change is None:
        return False
    bound = (now - session.state_change).total_seconds()
    connected = (now - session.backend_start).total_seconds()
    return connected >= 2 * bound + 1.0 and not TAKES_ADVISORY.search(session.query)


def busy_bounds(snapshot: Snapshot, entries: Iterable[LockEntry]) -> list[BusyBound]:
    """The backends among ``entries``' holders whose certain session locks have a bound from a
    session that keeps running statements, in the entries' order: one read cannot date them
    (watch, sample and the exporter can). Sessions are read first: most reads have none, and
    then no lock is looked at."""
    now = snapshot.server.now
    busy = {pid for pid, session in snapshot.sessions.items() if _busy(session, now)}
    found: dict[int, BusyBound] = {}
    if not busy:
        return []
    for entry in entries:
        lock, session = entry.lock, entry.session
        pid = lock.pid
        if pid is None or pid not in busy or pid in found or entry.lifetime != "session":
            continue
        # a key's (an extension's tag is no session lock of the team's: --session-age
        # never judges one)
        if lock.granted and entry.decoded is not None and entry.held_at_least is not None:
            assert session is not None and session.backend_start is not None  # _busy
            connected = (now - session.backend_start).total_seconds()
            label = lock_label(entry, snapshot.server)
            found[pid] = BusyBound(entry, label, entry.held_at_least, connected)
    return list(found.values())


ONE_READ = "one read cannot date it (lockdiag watch can)"


def busy_note(
    found: list[BusyBound], column: str = "AGE", target: str | None = None, why: str = ONE_READ
) -> list[str]:
    """The first such holder in words (of ``target``, in a fleet), and how many more."""
    if not found:
        return []
    where = f"{clean(target)}: " if target else ""
    more = f" ({len(found) - 1} more holder(s) alike)" if len(found) > 1 else ""
    return [f"{where}{found[0].words(column)}: {why}{more}"]


def relation(entry: LockEntry) -> str:
    if not entry.lock.granted:
        parts = []
        if entry.waits_for:
            parts.append("waits for " + ",".join(map(str, entry.waits_for)))
        if entry.queued_behind:
            parts.append("behind " + ",".join(map(str, entry.queued_behind)))
        return "; ".join(parts)
    if entry.blocks:
        return "blocks " + ",".join(map(str, entry.blocks))
    return ""


def ago(now: datetime, moment: datetime | None) -> str:
    return f"{format_duration((now - moment).total_seconds())} ago" if moment else ""


def pid_text(lock: LockRow) -> str:
    if lock.pid is not None:
        return str(lock.pid)
    return f"prepared {lock.virtualtransaction}"


def mode_text(mode: str) -> str:
    return mode.removesuffix("Lock")


def server_data(snapshot: Snapshot) -> dict[str, Any]:
    server = snapshot.server
    return {
        "source": snapshot.source,
        "version": server.version,
        "version_num": server.version_num,
        "now": server.now.isoformat(),
        "current_user": server.current_user,
        "in_recovery": server.in_recovery,
        "read_all_stats": server.read_all_stats,
        "scope": snapshot.scope,
    }


def entry_data(entry: LockEntry, session: dict[str, Any] | None = None) -> dict[str, Any]:
    """A lock as JSON; ``session``: its session_data(), when the caller has it already."""
    lock = entry.lock
    return {
        "pid": lock.pid,
        "granted": lock.granted,
        "mode": lock.mode,
        "locktype": lock.locktype,
        "database": entry.database,
        **lock_data(entry),
        "lifetime": entry.lifetime,
        "held_at_least_seconds": entry.held_at_least,
        "waited_seconds": entry.waited,
        "waitstart": lock.waitstart.isoformat() if lock.waitstart else None,
        "blocks": list(entry.blocks),
        "waits_for": list(entry.waits_for),
        "queued_behind": list(entry.queued_behind),
        "flags": list(entry.flags),
        "pool": pool_data(entry),
        **(session_data(entry) if session is None else session),
    }


HEAD_FIELDS = 5  # pid, granted, mode, locktype, database: then come lock_data()'s fields


def lock_data(entry: LockEntry) -> dict[str, Any]:
    """The fields of entry_data() that name what is locked (the rest are the holder's)."""
    lock, decoded = entry.lock, entry.decoded
    triple = decoded.triple if decoded else None
    return {
        "namespace": decoded.namespace.name if decoded and decoded.namespace else None,
        "resource": decoded.resource if decoded else None,
        "form": triple.form if triple else None,
        "known": known_data(decoded.known) if decoded and decoded.known else None,
        "key": list(triple.args) if triple else None,
        "classid": lock.classid,
        "objid": lock.objid,
        "objsubid": lock.objsubid,
        "relation": lock.relation,
        "page": lock.page,
        "tuple": lock.tuple,
        "transactionid": lock.transactionid,
        "virtualxid": lock.virtualxid,
        "virtualtransaction": lock.virtualtransaction,
        # a span of an aggregated read: how many locks, up to which key (docs/reference/json.md)
        **({"count": lock.keys, "objid_last": lock.objid_last} if lock.keys > 1 else {}),
        # an extension's advisory tag (objsubid not 1 or 2): its numbers only, never named
        **({"extension_tag": True} if lock.advisory_tag is not None else {}),
    }


_ENTRY_SHAPE = itemgetter(
    *map(LockEntry._fields.index, ("database", "lifetime", "held_at_least", "flags"))
)
_LOCK_SHAPE = itemgetter(
    *map(LockRow._fields.index, ("pid", "mode", "objsubid", "virtualtransaction"))
)
_NO_OBJECT = (None,) * 5  # relation, page, tuple, virtualxid, transactionid of an advisory lock
_MARK = b'"\\u0000"'  # a number's place in a template (see EntryEncoder._template)


class EntryEncoder:
    """Locks as JSON bytes (orjson), the document entry_data() gives, at a hundred thousand
    locks a second. What every uncontested lock of a backend shares (who holds it, how, since
    when) is encoded once per backend; for an advisory lock, once per backend and namespace
    too, as a template whose numbers (resource, key, classid, objid) are filled in per lock."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        self.extra = extra or {}  # fields every item ends with (a fleet's target)
        self.sessions: dict[int, dict[str, Any]] = {}  # session_data() by id(session)
        self.shared: dict[tuple[object, ...], tuple[bytes, bytes]] = {}
        self.templates: dict[tuple[object, ...], tuple[bytes, bytes, bytes]] = {}

    def encode(self, entry: LockEntry) -> bytes:
        lock, decoded = entry.lock, entry.decoded
        if not lock.granted or entry.blocks:  # contested: its own queue fields
            return orjson.dumps({**entry_data(entry, self._session(entry)), **self.extra})
        # not a key (another lock type, an extension's tag), or a span (its count and last
        # key are its own): lock fields its own
        if decoded is None or lock[2:7] != _NO_OBJECT or lock.keys > 1:
            head, tail = self._parts(entry)
            return head + orjson.dumps(lock_data(entry))[1:-1] + tail
        template = self._shaped(entry, decoded)
        classid, objid, objsubid = decoded.triple
        if objsubid == BIGINT_SUBID:  # LockTriple.args, without the properties' calls
            key: tuple[int, ...] = (to_int8(classid, objid),)
        else:
            key = (to_int4(classid), to_int4(objid))
        before, numbers, after = template
        if decoded.namespace is None:
            return b"".join((before, numbers % (*key, lock.classid, lock.objid), after))
        return b"".join(
            (before, numbers % (decoded.resource, *key, lock.classid, lock.objid), after)
        )

    def encode_run(self, run: Run) -> Items:
        """A run of a span's locks (core.expansion): their items, joined by commas, each its
        template with its numbers; the numbers a lock's key gives are worked out here, as
        :meth:`encode` works them out for one lock, without an entry per lock."""
        entry, objids = run
        decoded = entry.decoded
        if decoded is None:  # an extension's tags: never named, each its own item
            return Items(b",".join(map(self.encode, run.entries())))
        before, numbers, after = self._shaped(next(run.entries()), decoded)
        classid, _, objsubid = decoded.triple
        named = decoded.namespace is not None  # its resource: a bigint's objid, a pair's n
        keys = zip(objids, run.numbers(), strict=True)
        if objsubid == BIGINT_SUBID:  # the key, n: classid << 32 | objid, as an int8
            if named:
                made = [numbers % (o, n, classid, o) for o, n in keys]
            else:
                made = [numbers % (n, classid, o) for o, n in keys]
        else:  # a pair: classid and n, the objid, each as an int4
            high = to_int4(classid)
            if named:
                made = [numbers % (n, high, n, classid, o) for o, n in keys]
            else:
                made = [numbers % (high, n, classid, o) for o, n in keys]
        # one copy of the run's megabyte: its ends go on its first and last items (joining
        # them to the whole would copy it twice more, and cost five times the formatting)
        made[0] = before + made[0]
        made[-1] += after
        return Items((after + b"," + before).join(made))

    def _shaped(self, entry: LockEntry, decoded: Decoded) -> tuple[bytes, bytes, bytes]:
        """The template of an advisory lock's item (:meth:`_template`), made once per shape:
        who holds it, how and since when (database, lifetime, bound, flags; pid, mode,
        objsubid, virtualtransaction), each group taken in C."""
        shape = (
            id(entry.session),
            id(entry.pool),
            id(decoded.namespace),
            id(decoded.known),
            _ENTRY_SHAPE(entry),
            _LOCK_SHAPE(entry.lock),
        )
        template = self.templates.get(shape)
        if template is None:
            template = self.templates[shape] = self._template(entry)
        return template

    def _session(self, entry: LockEntry) -> dict[str, Any]:
        session = self.sessions.get(id(entry.session))
        if session is None:
            session = self.sessions[id(entry.session)] = session_data(entry)
        return session

    def _parts(self, entry: LockEntry) -> tuple[bytes, bytes]:
        """The encoded fields before and after lock_data()'s, as one item's beginning and end."""
        lock = entry.lock
        context = (
            id(entry.session),
            lock.pid,
            lock.mode,
            lock.locktype,
            entry.database,
            entry.lifetime,
            entry.held_at_least,
            entry.flags,
            id(entry.pool),
        )
        parts = self.shared.get(context)
        if parts is None:
            full = {**entry_data(entry, self._session(entry)), **self.extra}
            names = list(full)
            middle = set(lock_data(entry))  # a span's and a tag's fields too
            head = {k: full[k] for k in names[:HEAD_FIELDS]}
            tail = {k: v for k, v in full.items() if k not in head and k not in middle}
            parts = self.shared[context] = (
                orjson.dumps(head)[:-1] + b",",
                b"," + orjson.dumps(tail)[1:],
            )
        return parts

    def _template(self, entry: LockEntry) -> tuple[bytes, bytes, bytes]:
        """The whole item of an advisory lock in three parts: the bytes before its first
        number, a format with ``%d`` for its resource (when it has a namespace), its key's
        numbers, classid and objid, in that order (``%`` elsewhere doubled), and the bytes
        after its last number. Only the short format is formatted per lock: ``%`` reads every
        byte of its format, and the item's other kilobyte is only copied. The numbers are
        marked by a NUL string, which no server string can hold."""
        head, tail = self._parts(entry)
        data = lock_data(entry)
        if data["resource"] is not None:
            data["resource"] = "\0"
        data["key"] = ["\0"] * len(data["key"])
        data["classid"] = data["objid"] = "\0"
        middle = orjson.dumps(data)[1:-1]
        first, last = middle.index(_MARK), middle.rindex(_MARK) + len(_MARK)
        numbers = middle[first:last].replace(b"%", b"%%").replace(_MARK, b"%d")
        return head + middle[:first], numbers, middle[last:] + tail


def pool_attached(pool: PoolLink) -> str:
    """Who uses a pooled server connection right now, as the console says."""
    return f"client {pool.client} attached" if pool.client else "no client attached"


def pool_data(entry: LockEntry) -> dict[str, Any] | None:
    pool = entry.pool
    if pool is None:
        return None
    return {
        "pooler": pool.pooler,
        "pool": pool.pool or None,
        "pool_mode": pool.pool_mode or None,
        "server_state": pool.server_state or None,
        "client": pool.client,
        "client_application_name": pool.client_application,
        "known_from": pool.via,
        # PgBouncer shows, and sets on the server, the last client's name only when that
        # client sent one: a backend's application_name may belong to an earlier client
        "application_name_may_be_inherited": True,
    }


def pool_text(entry: LockEntry) -> str:
    pool = entry.pool
    if pool is None:
        return ""
    if pool.via == "address":
        return f"via {pool.pooler}"
    attached = f"client {pool.client}" if pool.client else "no client"
    return f"{pool.pooler} {pool.pool} ({attached})"


def known_data(known: Known) -> dict[str, Any]:
    data = {"software": known.software, "meaning": known.meaning, "confidence": known.confidence}
    return data | ({"plugin": known.plugin} if known.plugin else {})


def session_data(entry: LockEntry) -> dict[str, Any]:
    session = entry.session
    if session is None:
        return {"application_name": None, "user": None, "state": None, "session_hidden": None}

    def iso(moment: datetime | None) -> str | None:
        return moment.isoformat() if moment else None

    return {
        "application_name": session.application_name,
        "user": session.user,
        "client_addr": session.client_addr,
        "client_port": session.client_port,
        "backend_start": iso(session.backend_start),
        "xact_start": iso(session.xact_start),
        "state": session.state,
        "state_change": iso(session.state_change),
        "wait_event_type": session.wait_event_type,
        "wait_event": session.wait_event,
        "backend_type": session.backend_type,
        "query": session.query,
        "session_hidden": session.hidden,
    }


def notes_block(notes: list[str]) -> list[Block]:
    return [Text([f"note: {n}" for n in notes], "note")] if notes else []


def fleet_sections(parts: list[tuple[str, Output | None, str | None]]) -> Output:
    """One section per target, for answers that do not merge into one table; the answer of a
    single server as it is, under no heading (one server is a fleet of one)."""
    if len(parts) == 1 and parts[0][1] is not None:
        return parts[0][1]

    def sections(document: bool) -> list[Block]:
        out: list[Block] = []
        for target, output, error in parts:
            out.append(Text([f"== {clean(target)}"], "verdict"))
            if output is None:
                out.append(Text([f"FAILED: {clean(error)}"], "error"))
                continue
            out += ((document and output.document) or output.blocks)()
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "targets": [
                {
                    "target": target,
                    "ok": output is not None,
                    "error": error,
                    "result": _complete(output) if output else None,
                }
                for target, output, error in parts
            ],
        }

    return Output(lambda: sections(False), data, document=lambda: sections(True))


def _complete(output: Output) -> Any:
    data = output.data()
    if output.items is not None:
        key, items = output.items
        data = {**data, key: list(items())}
    return data
