"""Server extensions: pg_repack (a key per table it repacks) and pg_partman (its maintenance
calls)."""

from __future__ import annotations

from functools import cache

from lockdiag.core.catalogue.entry import Family, Hashed, Known, Program, Software, Space
from lockdiag.keys import LockTriple

# pg_repack's pg_try_advisory_lock(REPACK_LOCK_PREFIX, table OID - 2^31) (pg_repack
# bin/pg_repack.c)
REPACK_LOCK_PREFIX = 16185446

# pg_partman's constant lock names (4.x, 5.x), hashed on the server with hashtext; the two
# procedures lock a pair (hashtext(name), hashtext(parent_table)) (pg_partman sources)
PARTMAN_NAMES = (
    "pg_partman run_maintenance",
    "pg_partman drop_partition_time",
    "pg_partman drop_partition_id",
    "pg_partman run_analyze",
    "pg_partman reapply_constraints",
    "pg_partman undo_partition_native",
    "pg_partman partition_data_proc",
    "pg_partman undo_partition_proc",
)


def repack_table_oid(triple: LockTriple) -> int:
    """pg_repack locks ``(16185446, CAST(-2147483648 + oid AS integer))``: objid is the table's
    OID plus 2^31, modulo 2^32."""
    return (triple.objid - 2**31) % 2**32


@cache  # one Known per key: findings count locks by the identity of their Known
def repack_known(triple: LockTriple, table: str | None = None) -> Known:
    oid = repack_table_oid(triple)
    where = table if table is not None else f"with OID {oid} (in the lock's database)"
    return Known("pg_repack", f"repack of table {where}", "exact")


EXTENSIONS = Family(
    (
        Program(
            "pg_repack",
            Software(
                "extension",
                "pg_try_advisory_lock",
                "held by pg_repack's main connection for the whole repack of one table, while "
                "its second connection stays idle in transaction on purpose (ACCESS SHARE on "
                "the table) until older transactions end",
                "check the repack (the pg_repack process, its output: 'Waiting for N "
                "transactions to finish' names the oldest pid) before acting; a pg_repack "
                "killed mid-run leaves its trigger repack_trigger and its table "
                "repack.log_<oid> behind (drop them, or DROP EXTENSION pg_repack CASCADE and "
                "create it again)",
            ),
            # its second connection, idle in transaction on purpose for the whole repack,
            # holds no key of it
            sessions={"pg_repack": "repack (its second connection)"},
            spaces=(Space("pair", range(REPACK_LOCK_PREFIX, REPACK_LOCK_PREFIX + 1), "repacks"),),
            extension="pg_repack",
        ),
        Program(
            "pg_partman",
            Software(
                "extension",
                "pg_try_advisory_xact_lock",
                "held by one maintenance call (some calls take session locks)",
            ),
            # tried whether or not the extension is here: it may live in another database of
            # the cluster, and hashtext() gives the same number in every database
            hashed=tuple(Hashed(name, name.removeprefix("pg_partman ")) for name in PARTMAN_NAMES),
            extension="pg_partman",
        ),
    )
)
