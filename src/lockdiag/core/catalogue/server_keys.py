"""Keys that only the inspected server can compute (hashtext(), or rows of the software's
tables): the names to send, as the programs declare them (the query itself is
:mod:`lockdiag.pg.capture`'s), and its rows read back as
:class:`~lockdiag.core.model.DerivedKey`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from lockdiag.core.catalogue.entry import PROGRAMS, Hashed, Program, Rows
from lockdiag.core.catalogue.index import row_sources
from lockdiag.core.model import DerivedKey
from lockdiag.keys import to_uint4
from lockdiag.registry import Candidates, KnownList, declare_list

# any string the team's code passes to hashtext(): named as itself, no software's
declare_list(KnownList("hashtext", "any string your code passes to hashtext()"))


class KeyRow(NamedTuple):
    """A key the server computed, as :func:`derived_keys` reads it: enrich_hashtext.sql's
    columns (tests/test_query_rows.py checks them against these names), ``source``
    'hashtext'; the enrichment query's rows come as (part number, name, key)."""

    source: str | int
    name: str
    key: int


def _hashed() -> Iterator[tuple[Program, Hashed]]:
    for program in PROGRAMS:
        for hashed in program.hashed:
            yield program, hashed


def hashed_names(candidates: Candidates) -> list[str]:
    """Names whose keys only a server's hashtext() computes: the team's (``[known]
    hashtext``), every program's constant names (pg_partman's are always tried: the extension
    may live in another database of the cluster, and hashtext() gives the same number in every
    database), and each listed name in its program's template."""
    strings = list(candidates.names("hashtext"))
    strings += [hashed.text for _, hashed in _hashed() if not hashed.listed]
    for _, hashed in _hashed():
        if hashed.listed:
            strings += [hashed.text.format(name=name) for name in candidates.names(hashed.listed)]
    return strings


def _program_of(name: str) -> tuple[Program, Hashed, str] | None:
    """The declaration a hashed string is a program's: a constant first, then a template."""
    templates = []
    for program, hashed in _hashed():
        if not hashed.listed and hashed.text == name:
            return program, hashed, name
        templates.append((program, hashed))
    for program, hashed in templates:
        listed = hashed.name_of(name)
        if listed is not None:
            return program, hashed, listed
    return None


def derived_keys(rows: Iterable[tuple[str | int, str, int]], database: str) -> list[DerivedKey]:
    """The rows of the snapshot's hashed names (``("hashtext", name, key)``: both call forms
    unless a program declares others) and of the enrichment query (``(part, name, key)``, a
    part its index in :func:`row_parts`) as DerivedKey."""
    found: list[DerivedKey] = []
    parts: list[tuple[Program, Rows]] | None = None
    for source, name, key in rows:
        if source == "hashtext":
            found += _hashtext_keys(name, key)
            continue
        if parts is None:
            parts = list(row_sources())
        if not isinstance(source, int) or not 0 <= source < len(parts):
            continue  # no part of this catalogue's
        program, part = parts[source]
        if part.describe is not None:
            software, meaning = part.describe(name)
        else:
            software, meaning = program.name, part.meaning.format(name=name)
        found.append(DerivedKey(database, key, part.form, software, meaning))
    return found


def _hashtext_keys(name: str, key: int) -> list[DerivedKey]:
    declared = _program_of(name)
    if declared is None:
        meaning = f"hashtext({name!r})"
        return [
            DerivedKey(None, key, "bigint", "hashtext", meaning),
            DerivedKey(None, key, "pair-prefix", "hashtext", meaning),
        ]
    program, hashed, listed = declared
    meaning = hashed.meaning.format(name=listed)
    found = []
    for form in hashed.forms:
        if form == "pair-after-0":  # (0, hashtext(name)): the pair as one 64-bit number
            found.append(DerivedKey(None, to_uint4(key), "pair", program.name, meaning))
        else:
            found.append(DerivedKey(None, key, form, program.name, meaning))
    return found


def row_parts() -> list[tuple[str, str]]:
    """Each table part of the enrichment query, in order: its table and its SQL (the part's
    index is the first column the query returns for its rows)."""
    return [(rows.table, rows.sql) for _, rows in row_sources()]
