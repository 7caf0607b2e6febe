"""The tables the rest of lockdiag reads, derived from the programs declared.

A :class:`~lockdiag.core.catalogue.entry.Program` adds itself to the programs declared
(:data:`~lockdiag.core.catalogue.entry.PROGRAMS`) when it is made (a family module's, or a
test's), and the tables here are rebuilt from them: the fixed keys and guesses
(:data:`FIXED`), what confirms a guess (:data:`SIGNS`, :data:`SIGN_TABLES`), the sessions that
name a program (:data:`BY_APPLICATION`); its ``[known]`` lists are the registry's
(:data:`~lockdiag.registry.KNOWN_LISTS`). The tables are rebuilt in place, so a name imported
once sees every program declared since; the rest (tables whose rows name keys, hashed names,
extensions, key spaces) is read from the programs when asked.
"""

from __future__ import annotations

from collections.abc import Iterator

from lockdiag.core.catalogue.entry import (
    PROGRAMS,
    Hold,
    Known,
    Program,
    Rows,
    Signs,
    fixed_keys,
    on_change,
    table_columns,
)
from lockdiag.keys import LockTriple

# the keys that name their program anywhere (exact), or could (guess)
FIXED: dict[LockTriple, Known] = {}
SIGNS: dict[str, Signs] = {}
# the tables the snapshot looks for in the connected database (one catalog read)
SIGN_TABLES: list[str] = []
# sessions that software names through application_name, for the connections that hold no key
# of it (any client may set it: corroborated, not exact)
BY_APPLICATION: dict[str, Known] = {}


def _rebuild() -> None:
    fixed = fixed_keys(PROGRAMS)
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


on_change(_rebuild)
_rebuild()  # the programs declared before this module was loaded


def row_sources() -> Iterator[tuple[Program, Rows]]:
    """Every table part of the enrichment query, with its program, in the catalogue's order."""
    for program in PROGRAMS:
        for rows in program.rows:
            yield program, rows


def row_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every table an enrichment query reads, with the columns it reads and their built-in
    types (pg_type.typname in pg_catalog): what :mod:`lockdiag.pg.trust` vets."""
    return table_columns(PROGRAMS)


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
