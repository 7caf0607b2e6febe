"""`lockdiag key`, `decode` and `registry show|check`: the registry's names and numbers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from lockdiag.core.analysis import Decoded, LockEntry
from lockdiag.core.catalogue import Hold, Known, calls_of, database_keys
from lockdiag.durations import format_duration
from lockdiag.keys import DERIVATION, AdvisoryTag, LockTriple
from lockdiag.registry import AdvisoryKey, Problem, Registry
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.views.common import (
    known_data,
    notes_block,
)

# -- registry, key, decode ---------------------------------------------------------------------


# a lock function called with literal numbers, as a query's text shows it
CALL = re.compile(
    r"\b(pg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?)\s*\(\s*([-+]?\d{1,20})\s*"
    r"(?:,\s*([-+]?\d{1,11})\s*)?\)",
    re.IGNORECASE,
)
QUERY_PREFIX = 65536  # characters of a query searched for the call


def own_call(key: LockTriple, queries: Iterable[str | None]) -> str | None:
    """The call that takes ``key`` in one of its holders' own query texts, as written there
    (pg_stat_activity shows a session's current or last statement)."""
    for query in queries:
        for match in CALL.finditer((query or "")[:QUERY_PREFIX]):
            function, *numbers = match.groups()
            args = tuple(int(n) for n in numbers if n is not None)
            if args == key.args:
                return key.sql(function.lower())
    return None


def lock_sql(decoded: Decoded, seen: str | None = None, holders: Iterable[LockEntry] = ()) -> str:
    """The SQL that takes this key, from the strongest evidence: a holder's own query that
    calls it (``holders``); a lock held now as a certain session lock (``seen``, "session");
    the namespace's expected lifetime (both calls when it expects either); the function that
    well-known software calls (not a mere guess's); else unknown."""
    key = decoded.triple
    namespace, known = decoded.namespace, decoded.known
    expected = None
    if namespace is not None:
        expected = {
            "session": key.sql("pg_try_advisory_lock"),
            "any": f"{key.sql()} or {key.sql('pg_try_advisory_lock')}",
        }.get(namespace.expect, key.sql())
    behaviour = known.behaviour if known is not None else None
    call = own_call(key, (e.session.query for e in holders if e.session is not None))
    if call is not None:
        mismatch = namespace is not None and namespace.expect == "xact" and "xact" not in call
        return f"{call} (its holder's own query" + (
            f"; {namespace.name} expects {expected})" if mismatch and namespace else ")"
        )
    if known is not None and behaviour is not None and calls_of(known.software, known.meaning):
        return _routine_sql(key, known, calls_of(known.software, known.meaning), seen, holders)
    if seen == "session" and (behaviour is None or "xact" in behaviour.function):
        taken = key.sql("pg_advisory_lock")
        if namespace is not None and namespace.expect == "xact":
            return f"{taken} (as held now; {namespace.name} expects {expected})"
        return f"{taken} (as held now: a session lock)"
    if expected is not None:
        return expected
    if known is not None and behaviour is not None:
        return f"{key.sql(behaviour.function)} (as {known.software} takes it)"
    return f"unknown: any advisory lock function called with {key.describe()} takes it"


def _routine_sql(
    key: LockTriple,
    known: Known,
    calls: tuple[Hold, ...],
    seen: str | None,
    holders: Iterable[LockEntry],
) -> str:
    """The function of a program whose routines take one key with different functions
    (pg_partman's run_maintenance() and run_maintenance_proc()): the routine a holder's query
    names; else those that take it as held now (a certain session lock); else each of them."""
    queries = [e.session.query or "" for e in holders if e.session and not e.session.hidden]
    named = next((c for c in calls for q in queries if c.named_in(q)), None)
    software = known.software
    if named is not None:
        return (
            f"{key.sql(named.function)} (as {software}'s {named.call} takes it: its holder's "
            "query calls it)"
        )
    if seen == "session":
        session = [c for c in calls if "xact" not in c.function]
        if len({c.function for c in session}) == 1:
            routines = " or ".join(c.call for c in session)
            return (
                f"{key.sql(session[0].function)} (as {software}'s {routines} takes it: held now "
                "as a session lock)"
            )
    functions: dict[str, list[str]] = {}
    for call in calls:
        functions.setdefault(call.function, []).append(call.call)
    return " or ".join(
        f"{key.sql(function)} ({software}'s {' or '.join(routines)})"
        for function, routines in functions.items()
    )


def key_data(
    key: LockTriple | AdvisoryTag,
    decoded: Decoded | None = None,
    seen: str | None = None,
    holders: Iterable[LockEntry] = (),
) -> dict[str, Any]:
    if isinstance(key, AdvisoryTag):  # no form, no arguments, no SQL: an extension's numbers
        return {
            "form": None,
            "args": None,
            "classid": key.classid,
            "objid": key.objid,
            "objsubid": key.objsubid,
            "sql": None,
            "extension_tag": True,
        }
    return {
        "form": key.form,
        "args": list(key.args),
        "classid": key.classid,
        "objid": key.objid,
        "objsubid": key.objsubid,
        "sql": lock_sql(decoded, seen, holders) if decoded is not None else key.sql(),
    }


def key_output(key: AdvisoryKey, given: tuple[str, ...], function: str) -> Output:
    """``given``: the resource as typed (one number, or the namespace's parts)."""
    triple, namespace = key.triple, key.namespace
    sql = triple.sql(function)

    def blocks() -> list[Block]:
        lines = [
            clean(" ".join((namespace.name, *given))),
            f"  pg_locks:  classid={triple.classid} objid={triple.objid} "
            f"objsubid={triple.objsubid}",
            f"  SQL:       {sql}",
        ]
        if namespace.parts:
            lines.insert(
                1,
                f"  resource:  {key.resource} (#{key.resource & 0xFFFFFFFF:08x}, "
                f"{DERIVATION} of the parts)",
            )
        return [Text(lines)]

    def data() -> dict[str, Any]:
        parts = dict(zip((name for name, _ in namespace.parts), given, strict=False))
        return {
            "namespace": namespace.name,
            "resource": key.resource,
            "parts": parts or None,
            **key_data(triple),
            "sql": sql,
        }

    return Output(blocks, data)


def tag_output(tag: AdvisoryTag) -> Output:
    """``decode`` of an extension's tag: what it is, in one line; never a name."""

    def blocks() -> list[Block]:
        return [Text([f"{tag.label}: {tag.meaning}"])]

    def data() -> dict[str, Any]:
        return {
            "namespace": None,
            "resource": None,
            "known": None,
            **key_data(tag),
            "meaning": tag.meaning,
            "notes": [],
        }

    return Output(blocks, data)


def database_programs() -> list[str]:
    """The programs whose keys derive from a database's name (pg-boss once, whatever its
    versions)."""
    names = {re.sub(r" v\d.*$", "", k.software) for k in database_keys("postgres").values()}
    return sorted(names, key=str.lower)


def decode_output(
    decoded: Decoded, untried: list[str] | None = None, no_database: bool = False
) -> Output:
    """``untried``: names only a server's hashtext() could have tried (no --dsn);
    ``no_database``: no --database, so no key derived from a database's name was tried."""
    key = decoded.triple
    a, b = key.pair
    unnamed = decoded.namespace is None and decoded.known is None
    notes = []
    # hashtext() gives an int4: a bigint within int4, or the first number of a pair
    hashed = key.form == "pair" or key.classid in (0, 0xFFFFFFFF)
    if untried and unnamed and hashed:
        notes.append(
            f"not tried without a server (give --dsn): hashtext() of {len(untried)} name(s), "
            "pg_partman's lock names among them"
        )
    if no_database and unnamed and key.form == "bigint":  # every such key is a bigint
        *most, last = database_programs()
        notes.append(
            "not tried without a database name (give --database NAME, the lock's database): "
            f"the keys of {', '.join(most)} and {last}, which derive from it"
        )

    def blocks() -> list[Block]:
        lines = [
            clean(decoded.label),
            f"  pg_locks:  classid={key.classid} objid={key.objid} objsubid={key.objsubid}",
            f"  form:      {key.form}  (bigint {key.bigint}; pair ({a}, {b}))",
            f"  SQL:       {lock_sql(decoded)}",
        ]
        if decoded.namespace and decoded.namespace.description:
            lines.insert(1, f"  {clean(decoded.namespace.description)}")
        if decoded.known:
            lines.insert(1, f"  confidence: {decoded.known.confidence}")
        return [Text(lines), *notes_block(notes)]

    def data() -> dict[str, Any]:
        return {
            "namespace": decoded.namespace.name if decoded.namespace else None,
            "resource": decoded.resource,
            "known": known_data(decoded.known) if decoded.known else None,
            **key_data(key, decoded),
            "notes": notes,
        }

    return Output(blocks, data)


def registry_output(registry: Registry) -> Output:
    namespaces = sorted(registry.namespaces.values(), key=lambda n: (n.form, n.id))

    def blocks() -> list[Block]:
        rows = [
            [
                n.name,
                str(n.id) if n.exact is None else f"key {n.key().describe()}",
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
                    "key": list(n.key().args) if n.exact is not None else None,
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
        warnings = sum(1 for p in problems if p.severity == "warning")
        if errors:
            verdict = f"{path}: {len(errors)} error(s), {warnings} warning(s)"
            return [Text(lines, "error"), Text([verdict], "verdict")]
        verdict = f"{path}: OK, {namespaces} namespace(s), {warnings} warning(s)"
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
