"""The catalogue's part of the snapshot query, without importing the catalogue: the keys and key
spaces it lists (sent as rows, never inside a span), the names only a server's hashtext()
computes, and the tables and extensions the read looks for.

A one-off command sends its query before it imports the catalogue: declaring its programs
(their dataclasses, their tables) costs some 15 ms, which the server's time then covers
(:mod:`lockdiag.evidence.overlap` imports it while the server works). The values come from
:mod:`.ahead_table`, written from the catalogue by ``python scripts/write_ahead_table.py``;
tests/test_ahead.py says the table is what the catalogue computes. They are used only while
nothing the table cannot know is there: the catalogue loaded already (a command that needed it,
a program declared since, every read after the first), a registry's ``[known]`` lists, an
installed plugin. Otherwise the catalogue answers, as it did before the table.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lockdiag import plugins
from lockdiag.core import ahead_table
from lockdiag.keys import PAIR_SUBID, AdvisoryTag, LockTriple
from lockdiag.registry import Candidates, Registry

Key = tuple[int, int, int]  # classid, objid, objsubid, as the query's parameters take them
KeySpace = tuple[int, int]  # objsubid, classid: every key of it sent as a row

_CATALOGUE = "lockdiag.core.catalogue"


def from_table(registry: Registry | None = None) -> bool:
    """Whether the table says what the catalogue would: it is not loaded, and neither a
    registry's ``[known]`` lists nor a plugin adds to it."""
    if _CATALOGUE in sys.modules:
        return False
    return registry is None or (registry.candidates == Candidates() and not plugins.installed())


def singles(
    registry: Registry, key: LockTriple | AdvisoryTag | None = None
) -> tuple[list[Key], list[KeySpace]]:
    """The keys the catalogue lists (the registry's [known] ones included, hashtext's aside:
    the server computes those) in spaces no namespace names, and the spaces of a pair prefix
    (where ``Decoder.listed`` tells keys apart before the read knows its databases); ``key``:
    a key asked for by itself (who-holds), last."""
    keys, spaces = _table() if from_table(registry) else listed(registry.candidates)
    keys = [k for k in keys if unnamed(registry, k[2], k[0])]
    spaces = [s for s in spaces if unnamed(registry, *s)]
    if key is not None:
        keys.append((key.classid, key.objid, key.objsubid))
    return keys, spaces


def hashed_names(registry: Registry) -> list[str]:
    """The names whose keys only the server's hashtext() computes (catalogue.hashed_names)."""
    if from_table(registry):
        return list(ahead_table.NAMES)
    from lockdiag.core.catalogue import hashed_names

    return hashed_names(registry.candidates)


def probe_params() -> dict[str, Any]:
    """What the snapshot query looks for in the connected database, as the catalogue's
    programs declare it: tables that confirm a guess (by name), tables whose rows name keys
    (schema and name), extensions."""
    if from_table():  # plugins declare neither tables nor extensions
        confirming, tables, extensions = _probe_table()
    else:
        confirming, tables, extensions = probed()
    schemas_names = [table.split(".") for table in tables]
    return {
        "software_tables": confirming,
        "row_schemas": [schema for schema, _ in schemas_names],
        "row_names": [name for _, name in schemas_names],
        "extensions": extensions,
    }


def unnamed(registry: Registry, objsubid: int, classid: int) -> bool:
    """Whether no namespace names the key space (the registry comes first)."""
    return registry.decode(LockTriple.of_row(classid, 0, objsubid)) is None


def listed(candidates: Candidates) -> tuple[list[Key], list[KeySpace]]:
    """From the catalogue: the keys it lists anywhere and the key spaces it sends whole."""
    from lockdiag.core.catalogue import REPACK_LOCK_PREFIX, build_catalogue

    catalogue = build_catalogue(candidates)
    keys = [(k.classid, k.objid, k.objsubid) for k in catalogue.anywhere]
    spaces = [(PAIR_SUBID, classid) for _, classid in catalogue.prefixes]
    return keys, [*spaces, (PAIR_SUBID, REPACK_LOCK_PREFIX)]


def probed() -> tuple[list[str], list[str], list[str]]:
    """From the catalogue: the tables that confirm a guess, the tables whose rows name keys
    (schema.name), the extensions."""
    from lockdiag.core import catalogue

    return list(catalogue.SIGN_TABLES), list(catalogue.row_tables()), catalogue.extension_names()


def _table() -> tuple[list[Key], list[KeySpace]]:
    return list(ahead_table.KEYS), list(ahead_table.SPACES)


def _probe_table() -> tuple[list[str], list[str], list[str]]:
    return (
        list(ahead_table.SIGN_TABLES),
        list(ahead_table.ROW_TABLES),
        list(ahead_table.EXTENSIONS),
    )


def render() -> str:
    """The text of :mod:`.ahead_table`, from the catalogue as declared (no plugin: the table
    stands for the catalogue alone)."""
    if plugins.installed():
        raise RuntimeError("a plugin is installed: write the table where none is")
    keys, spaces = listed(Candidates())
    confirming, tables, extensions = probed()
    from lockdiag.core.catalogue import hashed_names

    values = {
        "KEYS": ("tuple[tuple[int, int, int], ...]", tuple(keys)),
        "SPACES": ("tuple[tuple[int, int], ...]", tuple(spaces)),
        "NAMES": ("tuple[str, ...]", tuple(hashed_names(Candidates()))),
        "SIGN_TABLES": ("tuple[str, ...]", tuple(confirming)),
        "ROW_TABLES": ("tuple[str, ...]", tuple(tables)),
        "EXTENSIONS": ("tuple[str, ...]", tuple(extensions)),
    }
    lines = [
        '"""The catalogue\'s part of the snapshot query, written from it (lockdiag.core.ahead):',
        "do not edit; python scripts/write_ahead_table.py writes it again, and",
        'tests/test_ahead.py fails while it is not what the catalogue computes."""',
        "",
    ]
    for name, (kind, value) in values.items():
        items = [json.dumps(item) if isinstance(item, str) else repr(item) for item in value]
        if len(items) < 2:  # as ruff formats it: on one line, a lone item's comma kept
            lines.append(f"{name}: {kind} = ({''.join(f'{item},' for item in items)})")
        else:
            lines += [f"{name}: {kind} = (", *(f"    {item}," for item in items), ")"]
    return "\n".join(lines) + "\n"
