"""Keys that only the inspected server can compute (hashtext(), or rows of the software's
tables): the names to send (the query itself is :mod:`lockdiag.pg.capture`'s), and its rows
read back as :class:`~lockdiag.core.model.DerivedKey`."""

from __future__ import annotations

from collections.abc import Iterable

from lockdiag.core.catalogue.extensions import PARTMAN_NAMES
from lockdiag.core.catalogue.queues import PG_BOSS_TABLE_KEYS, PGQUEUER_STATISTICS, SAQ_QUEUE
from lockdiag.core.model import DerivedKey
from lockdiag.keys import to_uint4
from lockdiag.registry import Candidates

SERVER_HASHED = (PGQUEUER_STATISTICS, SAQ_QUEUE)


def hashed_names(candidates: Candidates) -> list[str]:
    """Names whose keys only a server's hashtext() can compute. pg_partman's are always
    tried: the extension may live in another database of the cluster, and hashtext() gives
    the same number in every database."""
    strings = [*candidates.hashtext, *PARTMAN_NAMES, *SERVER_HASHED]
    return strings + [f"pgmq.queue_{queue}" for queue in candidates.pgmq_queues]


_SOURCES = {
    "pgmq": ("pgmq", "queue {name!r}"),
    "que": ("Que", "job {name}"),
    "good_job": ("GoodJob", "job {name}"),
    "good_job_concurrency": ("GoodJob", "concurrency key {name!r}"),
    "good_job_process": ("GoodJob", "process {name}"),
}
_SOURCES["dramatiq"] = ("dramatiq-pg", "message {name}")  # "<queue>/<message_id>"


def derived_keys(rows: Iterable[tuple[str, str, int]], database: str) -> list[DerivedKey]:
    """The enrichment query's rows as DerivedKey (hashtext: both call forms)."""
    found: list[DerivedKey] = []
    for source, name, key in rows:
        if source == "hashtext" and name == PGQUEUER_STATISTICS:  # pg_try_advisory_xact_lock
            found.append(DerivedKey(None, key, "bigint", "PgQueuer", "log aggregation lock"))
            continue
        if source == "hashtext" and name == SAQ_QUEUE:  # (saq_lock_keyspace 0, hashtext(queue))
            meaning = f"sweep lock of queue {name!r}"
            found.append(DerivedKey(None, to_uint4(key), "pair", "SAQ", meaning))
            continue
        if source == "hashtext":
            software, meaning = "hashtext", f"hashtext({name!r})"
            if name in PARTMAN_NAMES:
                software, meaning = "pg_partman", name.removeprefix("pg_partman ")
            elif name.startswith("pgmq.queue_"):
                software, meaning = "pgmq", f"queue {name.removeprefix('pgmq.queue_')!r}"
            found.append(DerivedKey(None, key, "bigint", software, meaning))
            found.append(DerivedKey(None, key, "pair-prefix", software, meaning))
            continue
        if source == "pg_boss":  # "<table>/<key name>", from pgboss.queue.table_name
            table, _, lock = name.rpartition("/")
            versions = PG_BOSS_TABLE_KEYS.get(lock, "v11+")
            meaning = f"{lock} lock of table {table}"
            found.append(DerivedKey(database, key, "bigint", f"pg-boss {versions}", meaning))
            continue
        software, template = _SOURCES[source]
        found.append(DerivedKey(database, key, "bigint", software, template.format(name=name)))
    return found
