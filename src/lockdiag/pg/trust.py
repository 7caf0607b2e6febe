"""Which objects of a user's lockdiag may read: the one rule every enrichment query goes through.

lockdiag often runs as a superuser, and reading an object that somebody else owns can run that
somebody's code in lockdiag's session, with lockdiag's privileges (checked on PostgreSQL 15):

- a *view* (or a foreign table) under a name lockdiag reads runs whatever its query calls;
- a row-level security *policy* runs its expression for a role that does not bypass RLS;
- the *planner* evaluates immutable functions of constants in the table's index expressions
  and partial-index predicates (relcache.c, RelationGetIndexPredicate), in the expressions of
  its extended statistics, and in its CHECK constraints when constraint exclusion looks at
  them (a UNION ALL of tables): a superuser's plain SELECT ran the owner's function;
- a column of a user-defined type runs that type's casts and comparison functions;
- an index scan, and the planner's estimates (get_actual_variable_range), call the support
  functions of the index's operator class: a class a superuser made from an owner's function
  runs that function (checked: lockdiag's ``id = ANY(...)`` was planned as such a scan).

So, before a user table is read, :func:`vet` checks in the catalog (which runs no user code)
that it is a plain table (relkind ``r``, read with ``ONLY`` so no child is planned), that RLS
cannot apply to the connected role, that every column read has the built-in type expected and
no collation someone created (a nondeterministic one changes what ``=`` and ``DISTINCT`` see),
and that nothing an index, constraint or statistics object on it reaches is neither built in
(oid below 16384) nor owned by a superuser: the functions, operators, types, operator classes
and families it uses, and from those, step by step, an operator's code and selectivity
estimators, a type's functions and a domain's constraints, a SQL function's ``BEGIN ATOMIC``
body, and every member of an operator class's family (the support functions an index scan,
``get_actual_variable_range`` and the estimates call). The owner is what counts, not extension
membership: a database owner may ``CREATE EXTENSION`` a trusted extension (pgcrypto...), whose
script's objects belong to the bootstrap superuser, and then ``ALTER EXTENSION ... ADD
FUNCTION`` one of their own, which stays theirs (checked on PostgreSQL 15). The tables are
locked first (SHARE UPDATE EXCLUSIVE, NOWAIT, until the read is done): CREATE INDEX, CREATE
STATISTICS, ANALYZE, ALTER TABLE, CREATE POLICY and DROP all wait for that lock, so what was
checked is what is read; readers and writers do not (the lock conflicts only with DDL and
VACUUM). A table that fails any check is skipped with a note that says why.

What else could reach user code, and why it cannot:

- lockdiag's own queries: every name is qualified and ``search_path`` is ``pg_catalog``
  (verified after connecting), so operators and functions resolve to built-in ones; casts are
  between built-in types only, which no user can redefine; every column lockdiag selects has a
  built-in type, so output functions are built in.
- Operator classes and families, access methods (of tables and indexes), base types with their
  own input or output functions (written in C), planner support functions, event triggers
  (login included) and untrusted languages need a superuser to create: what exists of them is
  the administrator's, trusted like the server's own code. So are the extensions' own scripts;
  a superuser-owned function that calls an owner's function inside its body, and an extension
  function that looks names up through a ``search_path`` of its own, are out of reach of any
  catalog check: that code is the administrator's choice.
- Columns that are not read: the executor never calls a type's functions for them, and the
  planner estimates only lockdiag's own clauses, on read columns of built-in types.
- CHECK constraints: constraint exclusion is off in the read's transaction, so the planner
  never looks at them; they are vetted anyway.
- Defaults, generated columns, triggers, foreign keys: never evaluated by a read.
- Settings a database owner attaches to the database or to a role (ALTER DATABASE ... SET) are
  overridden by lockdiag's startup options and verified (:mod:`lockdiag.pg.connection`);
  ``local_preload_libraries`` loads only what the administrator put in ``$libdir/plugins``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from lockdiag.pg import queries
from lockdiag.pg.raw_text import UTF8, Texts, codec


@dataclass(frozen=True)
class Verdict:
    """The catalog's answer for one table: empty ``reasons`` means it may be read."""

    table: str
    reasons: tuple[str, ...]

    @property
    def readable(self) -> bool:
        return not self.reasons


def lock(connection: psycopg.Connection[Any], tables: list[str]) -> None:
    """Inside the caller's transaction: constraint exclusion off (no CHECK expression is
    planned), then each table locked against DDL until the transaction ends. NOWAIT: a table
    being vacuumed or altered raises LockNotAvailable at once instead of queueing lockdiag."""
    statements: list[sql.Composable] = [sql.SQL("SET LOCAL constraint_exclusion = off")]
    for table in tables:
        schema, name = table.split(".")
        statements.append(
            sql.SQL("LOCK TABLE ONLY {} IN SHARE UPDATE EXCLUSIVE MODE NOWAIT").format(
                sql.Identifier(schema, name)
            )
        )
    # no parameters: one simple query, one round trip
    connection.execute(sql.SQL("; ").join(statements).as_bytes(connection))


class Vetted(NamedTuple):
    """A row of trust_tables.sql (tests/test_query_rows.py checks its columns against these
    names): a table, its relkind, whether row-level security applies to this role, the columns
    read that are not as declared, what its indexes, constraints and statistics reach that is
    neither built in nor a superuser's (as bytes, in the database's encoding)."""

    name: str
    relkind: str
    row_security: bool
    wrong_columns: list[str]
    untrusted: list[str]
    encoding: str


def vet(
    connection: psycopg.Connection[Any], tables: dict[str, dict[str, tuple[str, ...]]]
) -> list[Verdict]:
    """What the catalog says of each table (locked by :func:`lock`): one query. ``tables``:
    every column the enrichment query reads of each, with the built-in types (pg_type.typname
    in pg_catalog) it may have, as the catalogue's entries declare them
    (``catalogue.row_tables()``); the query reads nothing else."""
    wanted = [{"name": t, "columns": columns} for t, columns in tables.items()]
    text = queries.query("trust_tables", connection.info.server_version)
    rows = connection.execute(text.encode(), {"tables": json.dumps(wanted)}).fetchall()
    found = {row.name: row for row in map(Vetted._make, rows)}
    verdicts, texts = [], Texts()
    for table in tables:
        if table not in found:
            verdicts.append(Verdict(table, ("no longer exists",)))
            continue
        row = found[table]
        untrusted = [texts.decoded(u, UTF8, codec(row.encoding)) or "" for u in row.untrusted]
        verdicts.append(
            Verdict(table, reasons(row.relkind, row.row_security, row.wrong_columns, untrusted))
        )
    return verdicts


_KINDS = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "p": "a partitioned table",
}


def reasons(
    kind: str, row_security: bool, wrong_columns: list[str], untrusted: list[str]
) -> tuple[str, ...]:
    """Why a table may not be read (nothing when it may)."""
    if kind != "r":  # whatever else it has, it is not read for this
        return (f"is {_KINDS.get(kind, f'not a plain table (relkind {kind})')}",)
    found = []
    if row_security:
        found.append("has row-level security that applies to this role")
    found += [f"has {column}" for column in wrong_columns]
    found += [f"has {what}, neither built in nor a superuser's" for what in untrusted]
    return tuple(found)


def note(verdict: Verdict) -> str:
    """``public.que_jobs is a view: not read``."""
    return f"{verdict.table} {'; '.join(verdict.reasons)}: not read"
