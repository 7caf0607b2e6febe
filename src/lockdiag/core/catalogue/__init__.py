"""The catalogue of advisory keys that well-known software takes, by software family.

Formulas and constants come from each project's source (see the README's table and
``tests/test_known.py`` for the checked example values). A registry namespace always wins over
the catalogue, and the catalogue over a plugin's entries (:mod:`lockdiag.plugins`). Five
confidences:

- ``exact``: a fixed key that the software uses, recognisable from the triple alone;
- ``derived``: computed from the lock's database name, the software's rows or a listed name;
- ``corroborated``: a guess that its database or its sessions confirm (:data:`SIGNS`);
- ``guess``: a small number that many programs could use (Airflow's 1 and 2), and nothing
  seen confirms it: it names nothing ("could be Apache Airflow"), and no advice speaks in that
  software's terms;
- ``plugin``: declared by an installed plugin, lockdiag has not checked it.

Where things are:

- the entries, one module per family: ``migrations`` (migration and deploy tools), ``queues``
  (job queues), ``schedulers`` (schedulers, workflow engines, leader election), ``libraries``
  (lock libraries and frameworks), ``extensions`` (server extensions). Each declares its
  programs as data (:class:`~lockdiag.core.catalogue.entry.Program`) next to the formulas of
  its keys: one entry per program holds all of it (its advice texts, how each call holds the
  lock, fixed keys, signs, session names, the keys of a database's name or of the names a
  team lists under ``[known]``, the names the server hashes, the tables whose rows name its
  keys with the SQL that reads them, the key spaces it uses whole, its extension and tags);
  ``formulas`` holds the hashes several families share, ``entry`` what an entry is written in
  and the programs declared (a Program adds itself when it is made, a test's too);
- ``index``: every table derived from the programs declared, rebuilt when one is: the fixed
  keys, signs and sessions the decoder reads, and what the server layer assembles (the tables
  the snapshot probes, the columns ``pg.trust`` vets, the enrichment query's parts, the
  extensions);
  ``families`` imports the family modules in their order, and computes the keys per database
  and from the team's listed names; adding a program touches its family's module (and its
  test) alone, adding a family touches ``families`` too;
- the decoder: ``decoder`` (:class:`Catalogue`, lookup, what confirms a guess, an extension's
  tags), ``build`` (the catalogue of a registry or a snapshot, collisions with a namespace),
  ``plugin_keys`` (what installed plugins declare), ``server_keys`` (keys only the server can
  compute: the hashed names, the enrichment's rows read back).

It is part of ``core``, pure: it may import ``lockdiag.keys``, ``lockdiag.registry``,
``lockdiag.plugins`` and ``lockdiag.core.model``, nothing that talks to a server or a screen.
"""

from lockdiag.core.catalogue.build import (
    build_catalogue,
    collisions,
    snapshot_catalogue,
    unmatched_keys,
)
from lockdiag.core.catalogue.decoder import (
    QUERY_PREFIX,
    Catalogue,
    corroboration,
    software_of_session,
)
from lockdiag.core.catalogue.entry import (
    SOFTWARE,
    Confidence,
    Family,
    Hold,
    Known,
    Program,
    Sibling,
    Signs,
    Software,
    SoftwareKind,
)
from lockdiag.core.catalogue.extensions import (
    PARTMAN_NAMES,
    REPACK_LOCK_PREFIX,
    repack_known,
    repack_table_oid,
)
from lockdiag.core.catalogue.families import (
    BY_APPLICATION,
    FIXED,
    SIGN_TABLES,
    SIGNS,
    candidate_keys,
    database_keys,
    name_keys,
)
from lockdiag.core.catalogue.formulas import crc32, java_hash
from lockdiag.core.catalogue.index import calls_of, extension_names, row_sources, row_tables
from lockdiag.core.catalogue.libraries import (
    DIGEST_HELPERS,
    DIGESTS,
    Shape,
    digest_keys,
    medusa_hash,
)
from lockdiag.core.catalogue.migrations import (
    FLYWAY_BASE,
    FLYWAY_CLASSIDS,
    SLONIK_TABLES,
    flyway_key,
    flyway_keys,
    grafana_key,
    slonik_migrator_key,
)
from lockdiag.core.catalogue.plugin_keys import PluginKeys, plugin_keys
from lockdiag.core.catalogue.queues import (
    PG_BOSS_KEYS,
    PG_BOSS_TABLE_KEYS,
    PG_BOSS_TABLES,
    PGQUEUER_STATISTICS,
    SAQ_QUEUE,
    goodjob_key,
    pg_boss_key,
    pg_boss_keys,
)
from lockdiag.core.catalogue.schedulers import dbos_background_key, dbos_key, tooz_key, tooz_keys
from lockdiag.core.catalogue.server_keys import KeyRow, derived_keys, hashed_names, row_parts

__all__ = [
    "BY_APPLICATION",
    "DIGESTS",
    "DIGEST_HELPERS",
    "FIXED",
    "FLYWAY_BASE",
    "FLYWAY_CLASSIDS",
    "PARTMAN_NAMES",
    "PGQUEUER_STATISTICS",
    "PG_BOSS_KEYS",
    "PG_BOSS_TABLES",
    "PG_BOSS_TABLE_KEYS",
    "QUERY_PREFIX",
    "REPACK_LOCK_PREFIX",
    "SAQ_QUEUE",
    "SIGNS",
    "SIGN_TABLES",
    "SLONIK_TABLES",
    "SOFTWARE",
    "Catalogue",
    "Confidence",
    "Family",
    "Hold",
    "KeyRow",
    "Known",
    "PluginKeys",
    "Program",
    "Shape",
    "Sibling",
    "Signs",
    "Software",
    "SoftwareKind",
    "build_catalogue",
    "calls_of",
    "candidate_keys",
    "collisions",
    "corroboration",
    "crc32",
    "database_keys",
    "dbos_background_key",
    "dbos_key",
    "derived_keys",
    "digest_keys",
    "extension_names",
    "flyway_key",
    "flyway_keys",
    "goodjob_key",
    "grafana_key",
    "hashed_names",
    "java_hash",
    "medusa_hash",
    "name_keys",
    "pg_boss_key",
    "pg_boss_keys",
    "plugin_keys",
    "repack_known",
    "repack_table_oid",
    "row_parts",
    "row_sources",
    "row_tables",
    "slonik_migrator_key",
    "snapshot_catalogue",
    "software_of_session",
    "tooz_key",
    "tooz_keys",
    "unmatched_keys",
]
