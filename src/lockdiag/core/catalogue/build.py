"""The catalogue of one registry, or of one snapshot: the families' keys, the keys the server
derived, and the plugins' keys, with the evidence that confirms a guess; and which of them fall
inside a namespace of the team."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from operator import attrgetter

from lockdiag import plugins
from lockdiag.core.catalogue.decoder import Catalogue, corroboration
from lockdiag.core.catalogue.entry import Known
from lockdiag.core.catalogue.extensions import REPACK_LOCK_PREFIX, repack_known, repack_table_oid
from lockdiag.core.catalogue.families import FIXED, PROGRAMS, candidate_keys, database_keys
from lockdiag.core.catalogue.plugin_keys import add_plugin_keys, plugin_keys
from lockdiag.core.model import DerivedKey, Snapshot
from lockdiag.keys import (
    PAIR_SUBID,
    LockTriple,
    from_bigint,
    from_pair,
    to_int4,
    to_uint4,
)
from lockdiag.registry import Candidates, Namespace, Registry


def build_catalogue(
    candidates: Candidates,
    databases: Iterable[str] = (),
    derived: Iterable[DerivedKey] = (),
) -> Catalogue:
    guesses = {k: v for k, v in FIXED.items() if v.confidence == "guess"}
    exact = {k: v for k, v in FIXED.items() if v.confidence == "exact"}
    catalogue = Catalogue(
        anywhere={
            **guesses,
            **candidate_keys(candidates),
            **exact,
        },
        per_database={name: database_keys(name) for name in databases},
    )
    for key in derived:
        known = Known(key.software, key.meaning, "derived")
        if key.form == "pair-prefix":
            catalogue.prefixes[(key.database, to_uint4(key.key))] = known
            continue
        triple = (
            from_pair(to_int4(key.key >> 32 & 0xFFFFFFFF), to_int4(key.key & 0xFFFFFFFF))
            if key.form == "pair"
            else from_bigint(key.key)
        )
        target = (
            catalogue.per_database.setdefault(key.database, {})
            if key.database
            else catalogue.anywhere
        )
        target.setdefault(triple, known)
    add_plugin_keys(catalogue)
    return catalogue


_TYPE_AND_DATABASE = attrgetter("locktype", "database")


def snapshot_catalogue(snapshot: Snapshot, candidates: Candidates) -> Catalogue:
    names = snapshot.server.databases
    # the (lock type, database) pairs made in C: a Python test per lock costs more than this
    pairs = set(map(_TYPE_AND_DATABASE, snapshot.locks))
    databases = {names[d] for t, d in pairs if t == "advisory" and d in names}
    catalogue = build_catalogue(candidates, databases, snapshot.derived)
    for program in PROGRAMS:  # the tags of the extensions installed here (the connected
        # database's: pg_extension is per database)
        if program.tags and program.extension in snapshot.server.extensions:
            for objsubid in program.tags:
                catalogue.tagged[(snapshot.server.database, objsubid)] = program
    guesses = {k: v for k, v in catalogue.anywhere.items() if v.confidence == "guess"}
    # a guessed key's objid or pg_repack's classid: an int's test tells nearly every lock
    # apart before a key is made of it (0.1 s of 0.2 s at a hundred thousand locks)
    objids = {key.objid for key in guesses}
    sessions_on: dict[tuple[str, LockTriple], set[int]] = {}  # the pids on each guessed key
    for lock in snapshot.locks:
        if lock.objid not in objids and lock.classid != REPACK_LOCK_PREFIX:
            continue
        key = lock.advisory_key
        if key is None or lock.database not in names:
            continue
        if key in guesses:
            sessions_on.setdefault((names[lock.database], key), set()).add(lock.pid or 0)
        if key.objsubid != PAIR_SUBID or key.classid != REPACK_LOCK_PREFIX:
            continue
        name = snapshot.server.relation_name(lock.database, repack_table_oid(key))
        if name is not None:  # pg_repack: the table, by name where this snapshot knows it
            catalogue.per_database.setdefault(names[lock.database], {})[key] = repack_known(
                key, name
            )
    for (database, key), pids in sessions_on.items():
        known = guesses[key]
        tables = snapshot.server.software_tables if database == snapshot.server.database else None
        sessions = [snapshot.sessions[pid] for pid in sorted(pids) if pid in snapshot.sessions]
        evidence = corroboration(known, database, tables, sessions)
        if evidence:  # one Known per database and key: findings count locks by identity
            confirmed = replace(known, confidence="corroborated", evidence=evidence)
            catalogue.per_database.setdefault(database, {}).setdefault(key, confirmed)
    return catalogue


def unmatched_keys(snapshot: Snapshot, registry: Registry) -> set[int]:
    """Advisory keys (as bigints) that neither the registry nor the catalogue names."""
    catalogue = snapshot_catalogue(snapshot, registry.candidates)
    names = snapshot.server.databases
    return {
        key.bigint
        for lock in snapshot.locks
        if (key := lock.advisory_key) is not None
        and registry.decode(key) is None
        and catalogue.lookup(key, names.get(lock.database or 0)) is None
    }


def collisions(namespace: Namespace, guesses: bool = True) -> list[str]:
    """Well-known software keys that fall inside a namespace of the team (with ``guesses``
    False, only the keys that name a lock by themselves: a guess is a number others use)."""
    found = [
        f"namespace {namespace.name!r} contains the key {triple.describe()} that "
        f"{known.software} uses ({known.meaning})"
        for triple, known in FIXED.items()
        if namespace.covers(triple) and (guesses or known.names)
    ]
    found += [
        f"namespace {namespace.name!r} covers the keys of {program.name}'s {space.meaning} "
        f"({space.where})"
        for program in PROGRAMS
        for space in program.spaces
        if namespace.form == space.form and namespace.id in space.ids
    ]
    found += [
        f"namespace {namespace.name!r} contains the {key.describe()} that {known.software} "
        f"uses ({known.meaning}, declared by plugin {known.plugin})"
        for key, known in plugin_keys().declared
        if _in_namespace(key, namespace)
    ]
    return found


def _in_namespace(key: plugins.Key, namespace: Namespace) -> bool:
    if key.form == "space":
        return namespace.form == "pair" and key.numbers[0] == namespace.id
    return namespace.covers(key.triple)
