"""`lockdiag key`, `decode` and `registry show|check`: the registry's names and numbers."""

from __future__ import annotations

from typing import Any

from lockdiag.core.analysis import Decoded
from lockdiag.durations import format_duration
from lockdiag.keys import DERIVATION, LockTriple
from lockdiag.registry import AdvisoryKey, Problem, Registry
from lockdiag.render import Block, Output, Table, Text, clean
from lockdiag.views.common import (
    known_data,
    notes_block,
)

# -- registry, key, decode ---------------------------------------------------------------------


def lock_sql(decoded: Decoded, seen: str | None = None) -> str:
    """The SQL that takes this key as its owner does: for a lock held now with a certain
    lifetime (``seen``, "session"), that lifetime's function; else a namespace's expected
    lifetime (both calls when it expects either), well-known software's own function, else
    a transaction lock (the safe default)."""
    key = decoded.triple
    namespace, known = decoded.namespace, decoded.known
    behaviour = known.behaviour if known is not None else None
    if seen == "session" and (behaviour is None or "xact" in behaviour.function):
        taken = key.sql("pg_advisory_lock")
        if namespace is not None and namespace.expect == "xact":
            return f"{taken} (as held now; {namespace.name} expects {key.sql()})"
        return f"{taken} (as held now: a session lock)"
    if namespace is not None:
        if namespace.expect == "session":
            return key.sql("pg_try_advisory_lock")
        if namespace.expect == "any":
            return f"{key.sql()} or {key.sql('pg_try_advisory_lock')}"
        return key.sql()
    if known is not None and behaviour is not None:
        return f"{key.sql(behaviour.function)} (as {known.software} takes it)"
    return key.sql()


def key_data(
    key: LockTriple, decoded: Decoded | None = None, seen: str | None = None
) -> dict[str, Any]:
    return {
        "form": key.form,
        "args": list(key.args),
        "classid": key.classid,
        "objid": key.objid,
        "objsubid": key.objsubid,
        "sql": lock_sql(decoded, seen) if decoded is not None else key.sql(),
    }


def key_output(key: AdvisoryKey, given: tuple[str, ...], function: str) -> Output:
    """``given``: the resource as typed (one number, or the namespace's parts)."""
    triple, namespace = key.triple, key.namespace
    sql = triple.sql(function)

    def blocks() -> list[Block]:
        lines = [
            clean(f"{namespace.name} {' '.join(given)}"),
            f"  pg_locks:  classid={triple.classid} objid={triple.objid} "
            f"objsubid={triple.objsubid}",
            f"  SQL:       {sql}",
        ]
        if namespace.parts:
            lines.insert(1, f"  resource:  {key.resource} (#{key.resource & 0xFFFFFFFF:08x}, "
                         f"{DERIVATION} of the parts)")  # fmt: skip
        return [Text(lines)]

    def data() -> dict[str, Any]:
        parts = dict(zip((name for name, _ in namespace.parts), given, strict=False))
        return {"namespace": namespace.name, "resource": key.resource,
                "parts": parts or None, **key_data(triple), "sql": sql}  # fmt: skip

    return Output(blocks, data)


def decode_output(decoded: Decoded, untried: list[str] | None = None) -> Output:
    """``untried``: names only a server's hashtext() could have tried (no --dsn)."""
    key = decoded.triple
    a, b = key.pair
    unnamed = decoded.namespace is None and decoded.known is None
    note = (
        f"not tried without a server (give --dsn): hashtext() of {len(untried)} name(s), "
        "pg_partman's lock names among them"
        if untried and unnamed
        else None
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
        return [Text(lines), *notes_block([note] if note else [])]

    def data() -> dict[str, Any]:
        return {
            "namespace": decoded.namespace.name if decoded.namespace else None,
            "resource": decoded.resource,
            "known": known_data(decoded.known) if decoded.known else None,
            **key_data(key, decoded),
            "notes": [note] if note else [],
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
