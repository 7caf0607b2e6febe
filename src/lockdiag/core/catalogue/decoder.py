"""How a key is named from the catalogue: :class:`Catalogue` holds the keys known for one
snapshot (everywhere, per database, pair prefixes) and looks a key up; what confirms a guess
(:func:`corroboration`); which program a session's application_name names."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from functools import cached_property

from lockdiag.core.catalogue.entry import Known, Program
from lockdiag.core.catalogue.extensions import REPACK_LOCK_PREFIX, repack_known
from lockdiag.core.catalogue.families import BY_APPLICATION, SIGNS
from lockdiag.core.model import Session
from lockdiag.keys import PAIR_SUBID, AdvisoryTag, LockTriple

QUERY_PREFIX = 4096  # characters of a query searched for a software's words


@dataclass
class Catalogue:
    """Known keys for one snapshot: everywhere, per database, and pair prefixes."""

    anywhere: dict[LockTriple, Known] = field(default_factory=dict)
    per_database: dict[str, dict[LockTriple, Known]] = field(default_factory=dict)
    prefixes: dict[tuple[str | None, int], Known] = field(default_factory=dict)
    # the programs whose extension is installed in a database, by (database, the objsubid of
    # their advisory tags): only there are their tags theirs (another extension may use the
    # same objsubid: Citus 10 too)
    tagged: dict[tuple[str, int], Program] = field(default_factory=dict)
    _tags: dict[tuple[str, AdvisoryTag], Known] = field(default_factory=dict, repr=False)

    @cached_property
    def _spaces(self) -> dict[tuple[int, int], frozenset[LockTriple]]:
        found: dict[tuple[int, int], set[LockTriple]] = {}
        for keys in [self.anywhere, *self.per_database.values()]:
            for triple in keys:
                found.setdefault((triple.objsubid, triple.classid), set()).add(triple)
        return {space: frozenset(triples) for space, triples in found.items()}

    def listed(self, objsubid: int, classid: int) -> frozenset[LockTriple] | None:
        """The keys listed in one key space (form and high word), in any database: a key of
        the space not among them is named by none. None when a pair prefix covers the space
        (its every key is named)."""
        if objsubid == PAIR_SUBID and (
            classid == REPACK_LOCK_PREFIX or any(c == classid for _, c in self.prefixes)
        ):
            return None
        return self._spaces.get((objsubid, classid), frozenset())

    def tag(self, tag: AdvisoryTag, database: str | None) -> Known | None:
        """An extension's advisory tag named by the program whose extension is installed in
        the lock's database (the meaning with its numbers, as who-holds --key takes them);
        None elsewhere, or for an objsubid no such program takes."""
        if database is None:
            return None
        program = self.tagged.get((database, tag.objsubid))
        if program is None:
            return None
        found = self._tags.get((database, tag))
        if found is None:  # one Known per tag: findings count locks by the identity of theirs
            meaning = program.tags[tag.objsubid].format(classid=tag.classid, objid=tag.objid)
            evidence = f"its extension {program.extension} is installed in database {database}"
            found = Known(program.name, f"{meaning} (tag {tag})", "corroborated", evidence=evidence)
            self._tags[(database, tag)] = found
        return found

    def lookup(self, triple: LockTriple, database: str | None) -> Known | None:
        if database is not None:
            found = self.per_database.get(database, {}).get(triple)
            if found is not None:
                return found
        found = self.anywhere.get(triple)
        if found is None and triple.objsubid == PAIR_SUBID and triple.classid == REPACK_LOCK_PREFIX:
            return repack_known(triple)  # a table's OID, named per snapshot when it can be
        if found is None and triple.objsubid == 2:
            found = self.prefixes.get((database, triple.classid)) or self.prefixes.get(
                (None, triple.classid)
            )
        return found


def corroboration(
    known: Known, database: str, tables: Collection[str] | None, sessions: Iterable[Session]
) -> str:
    """What confirms a guess in one database ("" when nothing does): its software's tables
    there (``tables``: None when the snapshot could not see that database's), or a session
    that holds or waits for the key naming that software (application_name, query text)."""
    signs = SIGNS.get(known.software)
    if signs is None:
        return ""
    if tables is not None and signs.tables and set(signs.tables) <= set(tables):
        return f"its tables {', '.join(signs.tables)} are in database {database}"
    for session in sessions:
        app = (session.application_name or "").lower()
        if signs.applications and app.startswith(signs.applications):
            return f"its holder's application_name is {session.application_name!r}"
        query = (session.query or "")[:QUERY_PREFIX]
        found = signs.query.search(query) if signs.query is not None else None
        if found is not None:
            return f"its holder's query names {found.group(0)}"
    return ""


def software_of_session(application_name: str | None) -> Known | None:
    """Software told by the application_name it sets (any client may set it: corroborated,
    not exact)."""
    return BY_APPLICATION.get(application_name or "")
