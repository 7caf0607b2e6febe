"""The keys that installed plugins declare (:mod:`lockdiag.plugins`), added where no built-in
key, and no earlier plugin's, names them already."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from lockdiag import plugins
from lockdiag.core.catalogue.decoder import Catalogue
from lockdiag.core.catalogue.entry import SOFTWARE, Known, Software
from lockdiag.core.catalogue.extensions import REPACK_LOCK_PREFIX
from lockdiag.keys import to_uint4


@dataclass(frozen=True)
class PluginKeys:
    """The plugins' fixed keys and key spaces, none named by an earlier plugin, and the entries
    that compute keys per database. A software name that is built in, or an earlier plugin's,
    leaves that entry out."""

    declared: list[tuple[plugins.Key, Known]] = field(default_factory=list)
    computed: list[tuple[str, plugins.Entry, Software]] = field(default_factory=list)


@cache  # the same Known objects for every snapshot: findings count locks by their identity
def plugin_keys() -> PluginKeys:
    found, kept = PluginKeys(), Catalogue()
    owners: dict[str, str] = {}
    for plugin in plugins.loaded():
        for entry in plugin.entries:
            owner = "built in" if entry.software in SOFTWARE else owners.get(entry.software)
            if owner is not None:
                by = owner if owner == "built in" else f"declared by plugin {owner}"
                plugins.tell(
                    f"plugin {plugin.name}: software {entry.software!r} is {by}: this entry of "
                    "it is not used"
                )
                continue
            owners[entry.software] = plugin.name
            software = Software(entry.kind, entry.function, entry.normal, entry.check)
            if entry.per_database is not None:
                found.computed.append((plugin.name, entry, software))
            for key in entry.keys:
                known = Known(entry.software, key.meaning, "plugin", plugin.name, software)
                if _claim(kept, key, known):
                    found.declared.append((key, known))
    return found


def add_plugin_keys(catalogue: Catalogue) -> None:
    """Every plugin key that no built-in key names (the registry comes before both at every
    decode), then the keys plugins compute for each database of the catalogue."""
    declared = plugin_keys()
    for key, known in declared.declared:
        _claim(catalogue, key, known)
    for name, entry, software in declared.computed:
        for database in list(catalogue.per_database):
            try:
                keys = entry.keys_of_database(database)
            except Exception as error:  # a plugin's code: its failure leaves its keys out
                plugins.tell(
                    f"plugin {name}: per_database of {entry.software!r} not used for database "
                    f"{database!r}: {plugins.cause(error)}"
                )
                continue
            for key in keys:
                known = Known(entry.software, key.meaning, "plugin", name, software)
                _claim(catalogue, key, known, database)


def _claim(
    catalogue: Catalogue, key: plugins.Key, known: Known, database: str | None = None
) -> bool:
    """Add a plugin's key unless the catalogue names it already; a clash is told."""
    if key.form == "space":
        classid = to_uint4(key.numbers[0])
        held = [
            k
            for (d, c), k in catalogue.prefixes.items()
            if c == classid and (database is None or d in (None, database))
        ]
        if classid == REPACK_LOCK_PREFIX:
            held.append(Known("pg_repack", "key space of its table locks", "exact"))
        other = held[0] if held else None
        if other is None:
            catalogue.prefixes[(database, classid)] = known
    else:
        triple = key.triple
        other = catalogue.lookup(triple, database) or next(
            (keys[triple] for keys in catalogue.per_database.values() if triple in keys), None
        )
        if other is None:
            target = catalogue.anywhere if database is None else catalogue.per_database[database]
            target[triple] = known
    if other is None:
        return True
    by = "built in" if other.plugin is None else f"declared by plugin {other.plugin}"
    plugins.tell(
        f"plugin {known.plugin}: {key.describe()} of {known.software} is {other.software}'s "
        f"{other.meaning} ({by}): that name is used"
    )
    return False
