"""Server extensions: pg_repack (a key per table it repacks) and pg_partman (its maintenance
calls)."""

from __future__ import annotations

import re
from functools import cache

from lockdiag.core.catalogue.entry import Call, Family, Known, Program, Software
from lockdiag.keys import LockTriple

# pg_repack's pg_try_advisory_lock(REPACK_LOCK_PREFIX, table OID - 2^31) (pg_repack
# bin/pg_repack.c)
REPACK_LOCK_PREFIX = 16185446

# pg_partman's constant lock names (4.x, 5.x), hashed on the server with hashtext; the two
# procedures lock a pair (hashtext(name), hashtext(parent_table)) (pg_partman sources; 5.0
# renamed undo_partition_native to undo_partition, 5.1 gave run_maintenance_proc a name of
# its own)
PARTMAN_NAMES = (
    "pg_partman run_maintenance",
    "pg_partman run_maintenance procedure",
    "pg_partman drop_partition_time",
    "pg_partman drop_partition_id",
    "pg_partman run_analyze",
    "pg_partman reapply_constraints",
    "pg_partman undo_partition_native",
    "pg_partman undo_partition",
    "pg_partman partition_data_proc",
    "pg_partman undo_partition_proc",
)


def _partman(routine: str, function: str, *keys: str) -> Call:
    name = routine.removesuffix("()")
    return Call(routine, function, keys, re.compile(rf"\b{name}\s*\(", re.IGNORECASE))


# who takes which key, with which function (pg_partman 4.7.2's sql/functions and
# sql/procedures; 5.x the same, but for the names above): every call is a try, never a wait,
# and the procedures' session locks are released only on their normal path
PARTMAN_CALLS = (
    _partman("run_maintenance()", "pg_try_advisory_xact_lock", "run_maintenance"),
    _partman(
        "run_maintenance_proc()",
        "pg_try_advisory_lock",
        "run_maintenance",
        "run_maintenance procedure",
    ),
    _partman("run_analyze()", "pg_try_advisory_lock", "run_analyze"),
    _partman("reapply_constraints_proc()", "pg_try_advisory_lock", "reapply_constraints"),
    _partman("partition_data_proc()", "pg_try_advisory_xact_lock", "partition_data_proc"),
    _partman("undo_partition_proc()", "pg_try_advisory_xact_lock", "undo_partition_proc"),
    _partman(
        "undo_partition()", "pg_try_advisory_xact_lock", "undo_partition_native", "undo_partition"
    ),
    _partman("drop_partition_time()", "pg_try_advisory_xact_lock", "drop_partition_time"),
    _partman("drop_partition_id()", "pg_try_advisory_xact_lock", "drop_partition_id"),
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
        ),
        Program(
            "pg_partman",
            Software(
                "extension",
                "pg_try_advisory_xact_lock",
                "held by one maintenance call, in the session that calls it (the procedures "
                "take session locks and release them when the call succeeds)",
                in_server=True,
                calls=PARTMAN_CALLS,
            ),
        ),
    )
)
