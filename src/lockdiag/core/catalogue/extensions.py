"""Server extensions: pg_repack (a key per table it repacks), pg_partman (its maintenance
calls), mimeo (a refresh per destination table), pg_fact_loader (its loads) and
pg_auto_failover's monitor (advisory tags of its own, objsubid 10 and 11)."""

from __future__ import annotations

import re
from functools import cache

from lockdiag.core.catalogue.entry import (
    Family,
    Hashed,
    Hold,
    Known,
    Program,
    Signs,
    Software,
    Space,
)
from lockdiag.keys import LockTriple, from_bigint

# pg_repack's pg_try_advisory_lock(REPACK_LOCK_PREFIX, table OID - 2^31) (pg_repack
# bin/pg_repack.c)
REPACK_LOCK_PREFIX = 16185446

# pg_partman's constant lock names, hashed on the server with hashtext (read in 4.7.2's
# install script and run: tests/test_known_programs.py; 5.x read upstream): the meaning each
# lock gets, its routine. 5.0 renamed undo_partition_native's, 5.1 gave run_maintenance_proc a
# name of its own; partition_data_proc and undo_partition_proc lock a pair (hashtext(name),
# hashtext(parent_table))
PARTMAN_LOCKS = {
    "pg_partman run_maintenance": "run_maintenance",
    "pg_partman run_maintenance procedure": "run_maintenance procedure",
    "pg_partman drop_partition_time": "drop_partition_time",
    "pg_partman drop_partition_id": "drop_partition_id",
    "pg_partman run_analyze": "run_analyze",
    "pg_partman reapply_constraints": "reapply_constraints",
    "pg_partman undo_partition_native": "undo_partition_native",
    "pg_partman undo_partition": "undo_partition",
    "pg_partman partition_data_proc": "partition_data_proc",
    "pg_partman undo_partition_proc": "undo_partition_proc",
}
PARTMAN_NAMES = tuple(PARTMAN_LOCKS)
PARTMAN_WORKER = "pg_partman dynamic background worker"  # its application_name
# mimeo's refresh functions lock (hashtext('mimeo advisory lock'), hashtext(dest_table))
MIMEO_LOCK = "mimeo advisory lock"
# pg_fact_loader's try_load(): pg_try_advisory_xact_lock(c_lock_cutoff_refresh), 99995
FACT_LOADER_KEY = 99995


def _partman(call: str, functions: tuple[str, ...], *locks: str, note: str = "") -> Hold:
    """One call's hold; its query pattern finds the call in its holder's query (the SQL line
    and the advice speak of the call its holder runs)."""
    keys = tuple(PARTMAN_LOCKS[f"pg_partman {lock}"] for lock in locks)
    name = call.removesuffix("()")
    return Hold(call, functions, "skips", keys, note, query=re.compile(rf"\b{name}\s*\(", re.I))


_SESSION = (
    "a session lock, unlocked only when the call ends well: a call that fails or is "
    "cancelled leaves its session holding it, idle, and every later call does nothing"
)
_FIRST_COMMIT = (
    "a transaction lock on the pair (name, parent table), released by the procedure's "
    "first COMMIT: its later batches run without it, and a second call then runs too"
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
                "held by one maintenance call, in the session that calls it (the procedures "
                "take session locks and release them when the call succeeds)",
                in_server=True,
            ),
            # every call tries once and, refused, returns with a NOTICE
            holds=(
                _partman("run_maintenance()", ("pg_try_advisory_xact_lock",), "run_maintenance"),
                _partman(
                    "run_maintenance_proc()",
                    ("pg_try_advisory_lock",),
                    "run_maintenance",
                    "run_maintenance procedure",
                    note=f"4.x, the function's name ('run_maintenance procedure' from 5.1); "
                    f"{_SESSION}",
                ),
                _partman("run_analyze()", ("pg_try_advisory_lock",), "run_analyze", note=_SESSION),
                _partman(
                    "reapply_constraints_proc()",
                    ("pg_try_advisory_lock",),
                    "reapply_constraints",
                    note=_SESSION,
                ),
                _partman(
                    "partition_data_proc()",
                    ("pg_try_advisory_xact_lock",),
                    "partition_data_proc",
                    note=_FIRST_COMMIT,
                ),
                _partman(
                    "undo_partition_proc()",
                    ("pg_try_advisory_xact_lock",),
                    "undo_partition_proc",
                    note=_FIRST_COMMIT,
                ),
                _partman(
                    "undo_partition()",
                    ("pg_try_advisory_xact_lock",),
                    "undo_partition",
                    "undo_partition_native",
                    note="5.x ('undo_partition_native' in 4.x)",
                ),
                _partman(
                    "drop_partition_time()", ("pg_try_advisory_xact_lock",), "drop_partition_time"
                ),
                _partman(
                    "drop_partition_id()", ("pg_try_advisory_xact_lock",), "drop_partition_id"
                ),
            ),
            # its background worker calls run_maintenance() (4.7's backend_type is garbage)
            sessions={PARTMAN_WORKER: "background worker (runs run_maintenance())"},
            # tried whether or not the extension is here: it may live in another database of
            # the cluster, and hashtext() gives the same number in every database
            hashed=tuple(Hashed(name, meaning) for name, meaning in PARTMAN_LOCKS.items()),
            extension="pg_partman",
        ),
        # mimeo 1.5.1 concurrent_lock_check(), called first by every refresh function (run:
        # tests/test_known_programs.py)
        Program(
            "mimeo",
            Software(
                "extension",
                "pg_try_advisory_xact_lock",
                "held by the transaction of one refresh of a destination table (the pair's "
                "second number is hashtext of the table's name) while mimeo's dblink "
                "connection reads the source",
                "check the refresh (its caller's job; the dblink backend on the source server "
                "runs on after its caller ends, until its query does)",
            ),
            holds=(
                Hold(
                    "refresh_*()",
                    ("pg_try_advisory_xact_lock",),
                    "skips",
                    ("refresh of a destination table",),
                    "with p_lock_wait => 0 a second refresh waits in pg_advisory_xact_lock "
                    "instead; p_lock_wait > 0 returns at once too (1.5.1's retry loop never "
                    "runs)",
                ),
            ),
            hashed=(Hashed(MIMEO_LOCK, "refresh of a destination table", ("pair-prefix",)),),
            extension="mimeo",
        ),
        # pg_fact_loader 1.7 try_load() (run: tests/test_known_programs.py): a number others
        # may pick too, named only with its tables or sessions
        Program(
            "pg_fact_loader",
            Software(
                "extension",
                "pg_try_advisory_xact_lock",
                "held for a whole load, by its caller or its background worker (backend_type "
                "pg_fact_loader); it guards only a refresh of the queue dependencies: loads "
                "of other fact tables run beside it",
                "check the load (fact_loader.fact_tables); a background worker that is "
                "terminated ends only once its load does: cancel it to stop it now",
            ),
            guesses={from_bigint(FACT_LOADER_KEY): "load lock (c_lock_cutoff_refresh)"},
            signs=Signs(
                ("fact_tables", "queue_tables", "fact_table_deps"),
                (),
                re.compile(r"\bfact_loader\.(?:worker|try_load|load|daily_scheduled_load)\b"),
            ),
            holds=(
                Hold(
                    "try_load()",
                    ("pg_try_advisory_xact_lock",),
                    "skips",
                    note="a second load of the same job skips its row (FOR UPDATE SKIP "
                    "LOCKED); one of another job runs without the key",
                ),
            ),
            extension="pg_fact_loader",
        ),
        # pg_auto_failover 2.0's monitor (metadata.c LockFormation, LockNodeGroup): transaction
        # locks its C code takes with objsubid 10 (classid 0, objid the formation name's
        # hashtext) and 11 (classid the formation's hash, objid the group); Citus uses 10 too,
        # so they are named only where the extension is installed in the lock's database
        Program(
            "pg_auto_failover",
            Software(
                "extension",
                "pg_advisory_xact_lock",  # LockAcquire in C: no SQL function takes these tags
                "held by one transaction of the monitor's functions (a node's report, a "
                "formation's or group's change), shared or exclusive; the others wait",
            ),
            extension="pgautofailover",
            tags={10: "formation lock", 11: "node group {objid} lock"},
        ),
    )
)
