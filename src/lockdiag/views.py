"""Reports turned into what people read (tables and lines) and what scripts read (JSON).

JSON field names are a documented, stable interface (README, "JSON output"): add fields, never
rename or remove them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from lockdiag.analysis import FLAG_MEANINGS, Decoded, ListReport, LockEntry, WhoHolds
from lockdiag.durations import format_duration
from lockdiag.keys import LockTriple
from lockdiag.known import Known
from lockdiag.registry import Problem, Registry
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.snapshot import LockRow, ServerInfo, Snapshot

JSON_VERSION = 1
HOLDER_HEADERS = [
    "PID", "MODE", "APPLICATION", "USER", "CLIENT", "POOL", "DATABASE", "CONNECTED",
    "STATE", "XACT START", "LIFETIME", "HELD", "FLAGS", "QUERY",
]  # fmt: skip
WAITER_HEADERS = [
    "#",
    "PID",
    "MODE",
    "APPLICATION",
    "USER",
    "CLIENT",
    "WAITING",
    "BLOCKED BY",
    "QUERY",
]

# -- shared pieces -----------------------------------------------------------------------------


def lock_label(entry: LockEntry, server: ServerInfo) -> str:
    if entry.decoded is not None:
        return clean(entry.decoded.label)
    return clean(describe_lock(entry.lock, server))


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
    return kind


def age(entry: LockEntry) -> str:
    """How long, marked as a lower bound where it is one."""
    if entry.waited is not None:
        return f"waiting {format_duration(entry.waited)}"
    if entry.held_at_least is not None:
        return f"≥ {format_duration(entry.held_at_least)}"
    return "?" if entry.lock.granted else "waiting"


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
    lock, decoded = entry.lock, entry.decoded
    triple = decoded.triple if decoded else None
    return {
        "pid": lock.pid,
        "granted": lock.granted,
        "mode": lock.mode,
        "locktype": lock.locktype,
        "database": entry.database,
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
    return {"software": known.software, "meaning": known.meaning, "confidence": known.confidence}


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


# -- list --------------------------------------------------------------------------------------


def list_output(report: ListReport) -> Output:
    return fleet_list_output([(None, report)], [])


def fleet_list_output(
    parts: Sequence[tuple[str | None, ListReport]], failures: list[tuple[str, str]]
) -> Output:
    """One table for one server or many; with many, every row carries its target."""
    fleet = len(parts) + len(failures) > 1 or any(target for target, _ in parts)
    entries = [(target, report, e) for target, report in parts for e in report.entries]

    def blocks() -> list[Block]:
        rows: list[list[str]] = []
        important: list[bool] = []  # rows a capped terminal view keeps first
        waiting: dict[str | None, int] = dict.fromkeys((t for t, _ in parts), 0)
        seen: set[tuple[str | None, int | None, bool, tuple[str, ...]]] = set()  # kinds of row
        # most locks are held by few backends and wait for nothing: every cell but the first is
        # then the backend's, made once per backend, database, mode and flags
        by_backend: dict[tuple[object, ...], list[str]] = {}
        for target, report, e in entries:
            lock, label = e.lock, lock_label(e, report.snapshot.server)
            if lock.granted and not e.blocks:
                shared = (id(e.session), lock.pid, lock.database, lock.mode, e.flags, target)
                tail = by_backend.get(shared)
                if tail is None:
                    tail = by_backend[shared] = lock_cells(e)[1:]
                    seen.add((target, lock.database, e.pool is not None, e.flags))
                rows.append([label, *tail])
                important.append(bool(e.flags))
                continue
            rows.append(lock_cells(e, label))
            important.append(True)
            seen.add((target, lock.database, e.pool is not None, e.flags))
            waiting[target] += not lock.granted
        headers = ["LOCK", "MODE", "STATUS", "PID", "APPLICATION", "USER", "CLIENT", "STATE"]
        headers += ["LIFETIME", "AGE", "WAITS/BLOCKS", "FLAGS"]
        # columns only some tables have: POOL, DATABASE, TARGET
        extra: list[tuple[int, str, Callable[[str | None, LockEntry], str | None]]] = []
        if any(pooled for _, _, pooled, _ in seen):
            extra.append((7, "POOL", lambda _, e: pool_text(e)))
        if len({(target, database) for target, database, _, _ in seen}) > 1:
            extra.append((1, "DATABASE", lambda _, e: e.database))
        if fleet:
            extra.append((0, "TARGET", lambda target, _: target))
        for position, header, value in extra:
            headers.insert(position, header)
            for row, (target, _, e) in zip(rows, entries, strict=True):
                row.insert(position, clean(value(target, e)))
        flags = sorted({f for *_, found in seen for f in found})
        scope = parts[0][1].snapshot.scope if parts else "advisory"
        return [
            Table(
                headers,
                rows,
                important=important,
                wide={headers.index(h) for h in ("LOCK", "APPLICATION", "CLIENT", "WAITS/BLOCKS")},
                styles={len(headers) - 1: "yellow"},
                optional=[headers.index(h) for h in ("USER", "CLIENT", "MODE", "LIFETIME")],
                empty="no advisory locks" if scope == "advisory" else "no locks",
            ),
            Text([_summary(report, waiting[target], target) for target, report in parts]),
            Text([f"{t}: FAILED: {clean(error)}" for t, error in failures], "error"),
            Text([f"{f}: {FLAG_MEANINGS[f]}" for f in flags], "note"),
            *notes_block([n for _, report in parts for n in report.notes]),
        ]

    def data() -> dict[str, Any]:
        if not fleet:
            report = parts[0][1]
            return {
                "version": JSON_VERSION,
                "server": server_data(report.snapshot),
                "total": report.total,
                "notes": report.notes,
            }
        return {
            "version": JSON_VERSION,
            "targets": [
                {"target": target, "ok": True, "error": None,
                 "server": server_data(report.snapshot), "total": report.total,
                 "notes": report.notes}
                for target, report in parts
            ] + [
                {"target": target, "ok": False, "error": error}
                for target, error in failures
            ],
        }  # fmt: skip

    def items() -> Iterable[dict[str, Any]]:
        sessions: dict[int, dict[str, Any]] = {}  # a session's fields, made once per session
        for target, _, entry in entries:
            session = sessions.get(id(entry.session))
            if session is None:
                session = sessions[id(entry.session)] = session_data(entry)
            item = entry_data(entry, session)
            if fleet:
                item["target"] = target
            yield item

    return Output(blocks, data, ("locks", items))


def lock_cells(e: LockEntry, label: str = "") -> list[str]:
    """A row of the lock table, before the POOL, DATABASE and TARGET columns."""
    s = e.session
    return [
        label,
        mode_text(e.lock.mode),
        "held" if e.lock.granted else "WAITING",
        pid_text(e.lock),
        clean(s.application_name) if s else "",
        clean(s.user) if s else "",
        clean(s.client) if s and s.client else ("local" if s and s.backend_start else ""),
        clean(s.state) if s and s.state else ("hidden" if s and s.hidden else ""),
        e.lifetime or "",
        age(e),
        relation(e),
        ",".join(e.flags),
    ]


def _summary(report: ListReport, waiting: int, target: str | None = None) -> str:
    entries = report.entries
    server = report.snapshot.server
    shown = (
        f"{len(entries)} of {report.total}" if len(entries) != report.total else str(len(entries))
    )
    where = f"{target}: " if target else ""
    if report.narrowed:
        shown += " (waiters, their holders and long-idle holders first; --format plain for all)"
    return (
        f"{where}{shown} lock(s), {waiting} waiting; {report.snapshot.source}, "
        f"PostgreSQL {server.version}, at {server.now:%Y-%m-%d %H:%M:%S %Z}"
    )


# -- who-holds ---------------------------------------------------------------------------------


def who_holds_output(report: WhoHolds, snapshot: Snapshot) -> Output:
    now = snapshot.server.now
    key = report.key

    def holder_rows() -> list[list[str]]:
        rows = []
        for e in report.holders:
            s = e.session
            rows.append(
                [
                    pid_text(e.lock),
                    mode_text(e.lock.mode),
                    clean(s.application_name) if s else "",
                    clean(s.user) if s else "",
                    clean(s.client) if s else "",
                    clean(pool_text(e)),
                    clean(e.database),
                    ago(now, s.backend_start) if s else "",
                    (clean(s.state) + " " + ago(now, s.state_change)).strip() if s else "",
                    ago(now, s.xact_start) if s and s.xact_start else "-",
                    e.lifetime or "",
                    age(e),
                    ",".join(e.flags),
                    clean(s.query) if s else "",
                ]
            )
        return rows

    def waiter_rows() -> list[list[str]]:
        return [
            [
                str(position),
                pid_text(e.lock),
                mode_text(e.lock.mode),
                clean(e.session.application_name) if e.session else "",
                clean(e.session.user) if e.session else "",
                clean(e.session.client) if e.session else "",
                age(e),
                relation(e),
                clean(e.session.query) if e.session else "",
            ]
            for position, e in enumerate(report.waiters, start=1)
        ]

    def blocks() -> list[Block]:
        return [
            Text([clean(report.verdict)], "verdict"),
            Text([f"key: pg_locks {key}, {key.form} {key.describe()}; SQL: {key.sql()}"]),
            Table(
                HOLDER_HEADERS,
                holder_rows(),
                title="Holders",
                wide={2, 4, 5, 13},
                optional=[3, 6, 7, 8, 4],
                empty="nobody holds it",
            ),
            Table(
                WAITER_HEADERS,
                waiter_rows(),
                title="Waiters (in queue order, by wait start)",
                wide={3, 5, 8},
                empty="nobody waits",
            ),
            *notes_block(report.notes),
        ]

    def data() -> dict[str, Any]:
        decoded = report.decoded
        return {
            "version": JSON_VERSION,
            "server": server_data(snapshot),
            "namespace": decoded.namespace.name if decoded.namespace else None,
            "resource": decoded.resource,
            "known": known_data(decoded.known) if decoded.known else None,
            "key": key_data(key),
            "held": report.held,
            "verdict": report.verdict,
            "holders": [entry_data(e) for e in report.holders],
            "waiters": [entry_data(e) for e in report.waiters],
            "notes": report.notes,
        }

    return Output(blocks, data)


# -- registry, key, decode ---------------------------------------------------------------------


def key_data(key: LockTriple) -> dict[str, Any]:
    return {
        "form": key.form,
        "args": list(key.args),
        "classid": key.classid,
        "objid": key.objid,
        "objsubid": key.objsubid,
        "sql": key.sql(),
    }


def key_output(namespace: str, resource: int, key: LockTriple, function: str) -> Output:
    sql = key.sql(function)

    def blocks() -> list[Block]:
        return [
            Text(
                [
                    f"{namespace} {resource}",
                    f"  pg_locks:  classid={key.classid} objid={key.objid} objsubid={key.objsubid}",
                    f"  SQL:       {sql}",
                ]
            )
        ]

    def data() -> dict[str, Any]:
        return {"namespace": namespace, "resource": resource, **key_data(key), "sql": sql}

    return Output(blocks, data)


def decode_output(decoded: Decoded) -> Output:
    key = decoded.triple
    a, b = key.pair

    def blocks() -> list[Block]:
        lines = [
            clean(decoded.label),
            f"  pg_locks:  classid={key.classid} objid={key.objid} objsubid={key.objsubid}",
            f"  form:      {key.form}  (bigint {key.bigint}; pair ({a}, {b}))",
            f"  SQL:       {key.sql()}",
        ]
        if decoded.namespace and decoded.namespace.description:
            lines.insert(1, f"  {clean(decoded.namespace.description)}")
        if decoded.known:
            lines.insert(1, f"  confidence: {decoded.known.confidence}")
        return [Text(lines)]

    def data() -> dict[str, Any]:
        return {
            "namespace": decoded.namespace.name if decoded.namespace else None,
            "resource": decoded.resource,
            "known": known_data(decoded.known) if decoded.known else None,
            **key_data(key),
        }

    return Output(blocks, data)


def registry_output(registry: Registry) -> Output:
    namespaces = sorted(registry.namespaces.values(), key=lambda n: (n.form, n.id))

    def blocks() -> list[Block]:
        rows = [
            [
                n.name,
                str(n.id),
                n.form,
                n.expect,
                format_duration(n.max_hold) if n.max_hold is not None else "",
                clean(n.owner),
                clean(n.description),
            ]
            for n in namespaces
        ]
        source = str(registry.path) if registry.path else "no registry file found"
        return [
            Text([f"registry: {source}"]),
            Table(
                ["NAMESPACE", "ID", "FORM", "EXPECT", "MAX HOLD", "OWNER", "DESCRIPTION"],
                rows,
                wide={6},
                empty="no namespaces",
            ),
        ]

    def data() -> dict[str, Any]:
        return {
            "path": str(registry.path) if registry.path else None,
            "namespaces": [
                {
                    "name": n.name,
                    "id": n.id,
                    "form": n.form,
                    "expect": n.expect,
                    "max_hold_seconds": n.max_hold,
                    "owner": n.owner,
                    "description": n.description,
                }
                for n in namespaces
            ],
        }

    return Output(blocks, data)


def check_output(path: str, problems: list[Problem], namespaces: int) -> Output:
    errors = [p for p in problems if p.severity == "error"]

    def blocks() -> list[Block]:
        lines = [clean(str(p)) for p in problems]
        if errors:
            verdict = f"{path}: {len(errors)} error(s), {len(problems) - len(errors)} warning(s)"
            return [Text(lines, "error"), Text([verdict], "verdict")]
        verdict = f"{path}: OK, {namespaces} namespace(s), {len(problems)} warning(s)"
        return [Text(lines, "note"), Text([verdict], "verdict")]

    def data() -> dict[str, Any]:
        return {
            "path": path,
            "valid": not errors,
            "namespaces": namespaces,
            "problems": [
                {"severity": p.severity, "line": p.line, "message": p.message} for p in problems
            ],
        }

    return Output(blocks, data)


def fleet_sections(parts: list[tuple[str, Output | None, str | None]]) -> Output:
    """One section per target, for answers that do not merge into one table."""

    def blocks() -> list[Block]:
        out: list[Block] = []
        for target, output, error in parts:
            out.append(Text([f"== {clean(target)}"], "verdict"))
            out += output.blocks() if output else [Text([f"FAILED: {clean(error)}"], "error")]
        return out

    def data() -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "targets": [
                {"target": target, "ok": output is not None, "error": error,
                 "result": _complete(output) if output else None}
                for target, output, error in parts
            ],
        }  # fmt: skip

    return Output(blocks, data)


def _complete(output: Output) -> Any:
    data = output.data()
    if output.items is not None:
        key, items = output.items
        data = {**data, key: list(items())}
    return data
