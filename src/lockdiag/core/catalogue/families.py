"""The families' programs, declared by importing their modules, and what the decoder reads of
them: fixed keys, signs, the sessions that name their program (:mod:`.index`), and the keys
computed per database and from the team's listed names.

A program is added to the module of its family (or any module that declares it), with its
test; nothing here names it. A new family module is imported here, so that its programs are
declared when the catalogue is.
"""

from __future__ import annotations

from collections.abc import Iterable

from lockdiag.core.catalogue.entry import PROGRAMS, Known
from lockdiag.core.catalogue.entry import order as _order
from lockdiag.core.catalogue.extensions import EXTENSIONS
from lockdiag.core.catalogue.index import BY_APPLICATION, FIXED, SIGN_TABLES, SIGNS
from lockdiag.core.catalogue.libraries import LIBRARIES, library_keys
from lockdiag.core.catalogue.migrations import MIGRATIONS, slonik_keys
from lockdiag.core.catalogue.queues import QUEUES
from lockdiag.core.catalogue.schedulers import SCHEDULERS, dbos_background_keys
from lockdiag.keys import LockTriple
from lockdiag.registry import Candidates

FAMILIES = (MIGRATIONS, QUEUES, SCHEDULERS, LIBRARIES, EXTENSIONS)
# the catalogue's order: the families', each as its module lists its programs
_order([p.name for family in FAMILIES for p in family.programs])

__all__ = [
    "BY_APPLICATION",
    "FAMILIES",
    "FIXED",
    "PROGRAMS",
    "SIGNS",
    "SIGN_TABLES",
    "candidate_keys",
    "database_keys",
    "name_keys",
]


def database_keys(database: str) -> dict[LockTriple, Known]:
    """Keys that software derives from the database name (computed per database)."""
    return {
        k: v
        for program in PROGRAMS
        if program.database_keys is not None
        for k, v in program.database_keys(database).items()
    }


def candidate_keys(candidates: Candidates) -> dict[LockTriple, Known]:
    """Keys of the names the team lists as candidates (the registry's ``[known]``)."""
    return {
        k: v
        for program in PROGRAMS
        if program.listed_keys is not None
        for k, v in program.listed_keys(candidates).items()
    }


def name_keys(
    with_advisory_lock: Iterable[str] = (),
    with_advisory_lock_prefix: int = 0,
    django_pglocks: Iterable[str] = (),
    pals: Iterable[str] = (),
    advisory_lock_npm: Iterable[str] = (),
    medusa: Iterable[str] = (),
    slonik_tables: Iterable[str] = (),
    dbos_apps: Iterable[str] = (),
) -> dict[LockTriple, Known]:
    """The keys of these names alone, as :func:`candidate_keys` computes them from a
    registry's lists (without its defaults: Flyway's schema public, @slonik/migrator's
    README tables)."""
    return {
        **slonik_keys(slonik_tables),
        **dbos_background_keys(dbos_apps),
        **library_keys(
            with_advisory_lock,
            with_advisory_lock_prefix,
            django_pglocks,
            pals,
            advisory_lock_npm,
            medusa,
        ),
    }
