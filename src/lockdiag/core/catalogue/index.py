"""The programs declared, and every table the rest of lockdiag reads derived from them.

A :class:`~lockdiag.core.catalogue.entry.Program` adds itself here when it is declared (a family
module's, or a test's): its fixed keys and guesses (:data:`FIXED`), what confirms a guess
(:data:`SIGNS`, :data:`SIGN_TABLES`), the sessions that name it (:data:`BY_APPLICATION`), its
``[known]`` lists (the registry's :data:`~lockdiag.registry.KNOWN_LISTS`). The tables are
rebuilt in place, so a name imported once sees every program declared since; the rest
(tables whose rows name keys, hashed names, extensions, key spaces) is read from
:data:`PROGRAMS` when asked.
"""

from __future__ import annotations

from collections.abc import Iterator

from lockdiag.core.catalogue.entry import Hold, Known, Program, Rows, Signs
from lockdiag.keys import LockTriple
from lockdiag.registry import KNOWN_LISTS, declare_list, withdraw_list

PROGRAMS: list[Program] = []
# the keys that name their program anywhere (exact), or could (guess)
FIXED: dict[LockTriple, Known] = {}
SIGNS: dict[str, Signs] = {}
# the tables the snapshot looks for in the connected database (one catalog read)
SIGN_TABLES: list[str] = []
# sessions that software names through application_name, for the connections that hold no key
# of it (any client may set it: corroborated, not exact)
BY_APPLICATION: dict[str, Known] = {}


def declare(program: Program) -> None:
    """Add a program; refused (nothing changed) when a key, a ``[known]`` list, a hashed name
    or a table's columns contradict a program already declared."""
    _fixed([*PROGRAMS, program])  # raises on a key claimed twice
    for known in program.lists:
        found = KNOWN_LISTS.get(known.name)
        if found is not None:
            raise ValueError(f"[known] {known.name} is declared twice")
    _columns([*PROGRAMS, program])  # raises on a column typed two ways
    hashed = {h.text: p.name for p in PROGRAMS for h in p.hashed}
    for name in (h.text for h in program.hashed):
        if name in hashed:
            raise ValueError(f"hashtext({name!r}) is both {hashed[name]}'s and {program.name}'s")
    PROGRAMS.append(program)
    for known in program.lists:
        declare_list(known)
    _rebuild()


def withdraw(program: Program) -> None:
    if any(p is program for p in PROGRAMS):
        PROGRAMS[:] = [p for p in PROGRAMS if p is not program]
        for known in program.lists:
            withdraw_list(known.name)
        _rebuild()


def order(names: list[str]) -> None:
    """Put the programs named in that order first (the families', as their modules list
    them), the others after them as declared; the tables follow."""
    rank = {name: place for place, name in enumerate(names)}
    PROGRAMS.sort(key=lambda p: rank.get(p.name, len(rank)))
    _rebuild()


def _fixed(programs: list[Program]) -> dict[LockTriple, Known]:
    found: dict[LockTriple, Known] = {}
    for program in programs:
        keys = [(k, Known(program.name, m, "exact")) for k, m in program.exact.items()]
        keys += [(k, Known(program.name, m, "guess")) for k, m in program.guesses.items()]
        for key, known in keys:
            if key in found:
                other = found[key].software
                raise ValueError(f"{key.describe()} is both {other}'s and {program.name}'s")
            found[key] = known
    return found


def _rebuild() -> None:
    fixed = _fixed(PROGRAMS)
    FIXED.clear()
    FIXED.update(fixed)
    SIGNS.clear()
    SIGNS.update({p.name: p.signs for p in PROGRAMS if p.signs is not None})
    SIGN_TABLES[:] = sorted({table for signs in SIGNS.values() for table in signs.tables})
    BY_APPLICATION.clear()
    BY_APPLICATION.update(
        {
            application: Known(
                p.name, meaning, "corroborated", evidence=f"its application_name is {application!r}"
            )
            for p in PROGRAMS
            for application, meaning in p.sessions.items()
        }
    )


def row_sources() -> Iterator[tuple[Program, Rows]]:
    """Every table part of the enrichment query, with its program, in the catalogue's order."""
    for program in PROGRAMS:
        for rows in program.rows:
            yield program, rows


def row_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every table an enrichment query reads, with the columns it reads and their built-in
    types (pg_type.typname in pg_catalog): what :mod:`lockdiag.pg.trust` vets."""
    return _columns(PROGRAMS)


def _columns(programs: list[Program]) -> dict[str, dict[str, tuple[str, ...]]]:
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for program in programs:
        for rows in program.rows:
            schema, dot, name = rows.table.partition(".")
            if not (schema and dot and name) or "." in name:
                raise ValueError(f"{program.name}: table {rows.table!r} is not schema.name")
            columns = found.setdefault(rows.table, {})
            for column, types in rows.columns.items():
                if columns.setdefault(column, types) != types:
                    raise ValueError(f"{rows.table}.{column} is declared with two sets of types")
    return found


def extension_names() -> list[str]:
    """The extensions whose presence the snapshot reads (the connected database's)."""
    return sorted({p.extension for p in PROGRAMS if p.extension})


def calls_of(software: str, meaning: str) -> tuple[Hold, ...]:
    """The calls of the program named ``software`` that take its key of that meaning and that a
    holder's query shows (:attr:`Hold.query`): the advice speaks of the one its holder runs."""
    return tuple(
        hold
        for program in PROGRAMS
        if program.name == software
        for hold in program.holds
        if hold.query is not None and (not hold.keys or meaning in hold.keys)
    )
