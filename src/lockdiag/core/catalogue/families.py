"""The families merged into the tables the decoder reads: fixed keys, signs, the sessions that
name their program, and the keys computed per database and from the team's listed names.

A program is added to the module of its family, with its test; a family is added to
:data:`FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Iterable

from lockdiag.core.catalogue.entry import Known, Program, Signs
from lockdiag.core.catalogue.extensions import EXTENSIONS
from lockdiag.core.catalogue.libraries import LIBRARIES, library_keys
from lockdiag.core.catalogue.migrations import MIGRATIONS, slonik_keys
from lockdiag.core.catalogue.queues import QUEUES
from lockdiag.core.catalogue.schedulers import SCHEDULERS, dbos_background_keys
from lockdiag.keys import LockTriple
from lockdiag.registry import Candidates

FAMILIES = (MIGRATIONS, QUEUES, SCHEDULERS, LIBRARIES, EXTENSIONS)
PROGRAMS: tuple[Program, ...] = tuple(p for family in FAMILIES for p in family.programs)


def _fixed() -> dict[LockTriple, Known]:
    found: dict[LockTriple, Known] = {}
    for program in PROGRAMS:
        keys = [(k, Known(program.name, m, "exact")) for k, m in program.exact.items()]
        keys += [(k, Known(program.name, m, "guess")) for k, m in program.guesses.items()]
        for key, known in keys:
            if key in found:
                other = found[key].software
                raise ValueError(f"{key.describe()} is both {other}'s and {program.name}'s")
            found[key] = known
    return found


# the keys that name their program anywhere (exact), or could (guess)
FIXED: dict[LockTriple, Known] = _fixed()
SIGNS: dict[str, Signs] = {p.name: p.signs for p in PROGRAMS if p.signs is not None}
# the tables the snapshot looks for in the connected database (one catalog read)
SIGN_TABLES = sorted({table for signs in SIGNS.values() for table in signs.tables})
# sessions that software names through application_name, for the connections that hold no key
# of it (any client may set it: corroborated, not exact)
BY_APPLICATION: dict[str, Known] = {
    application: Known(
        program.name, meaning, "corroborated", evidence=f"its application_name is {application!r}"
    )
    for program in PROGRAMS
    for application, meaning in program.sessions.items()
}


def database_keys(database: str) -> dict[LockTriple, Known]:
    """Keys that software derives from the database name (computed per database)."""
    return {k: v for family in FAMILIES for k, v in family.database_keys(database).items()}


def candidate_keys(candidates: Candidates) -> dict[LockTriple, Known]:
    """Keys of the names the team lists as candidates (the registry's ``[known]``)."""
    return {k: v for family in FAMILIES for k, v in family.candidate_keys(candidates).items()}


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
