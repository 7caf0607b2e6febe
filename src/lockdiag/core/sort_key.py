"""The order of a lock table, as one int per lock: the analysis's sort key.

The order is the tuple (database, lock type's rank, objsubid, classid, objid or relation,
waiter, wait start, pid, mode): by database and lock, holders (by pid, then mode) before
waiters (by wait start, then pid). With the mode every granted lock has a key of its own (one
backend holds a lock in a mode once: pg_locks has one row per lock, backend and mode), so the
order does not depend on pg_locks' order, and a dump that expands its spans
(core.expansion) merges them into the same order. Packed into one int, building and
comparing a hundred thousand keys costs half what tuples do (an analysis 19 % slower with
tuples, measured). Letting the server sort instead (ORDER BY in the snapshot query) was
measured too, at 100k advisory locks on PostgreSQL 15: the statement took 0.40 to 0.51 s
instead of 0.07 s (an external merge, 8 MB on disk, before the first row is sent), where this
key for every lock and Python's sort take 0.09 s (docs/benchmark.md, part L).

From the top bit down:
  the place:  database oid << DATABASE_BIT | type rank << TYPE_BIT | objsubid << SUBID_BIT
              | classid << CLASSID_BIT | objid (an advisory key), or the relation's oid
  the rest (:func:`rest`, PLACE bits): for a holder, pid << MODE_BITS | the mode's rank;
              for a waiter, 1 << 96 | wait start in microseconds << 32 | pid
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from lockdiag.core.model import LockRow

# objsubid is a lock tag's 16-bit field4 (an extension's tag may use any value); a lock type's
# rank fits in 8 bits (PostgreSQL has a dozen types)
DATABASE_BIT, TYPE_BIT, SUBID_BIT, CLASSID_BIT = 88, 80, 64, 32
PLACE = 97  # bits of the sort key below the place: a waiter's bit, its wait start, the pid
_EPOCH, _MICROSECOND = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(microseconds=1)
_NO_START = (1 << 64) - 1  # a waiter with no wait start: last in its queue
# a holder's modes, weakest first (PostgreSQL's table-level modes, then a predicate lock's);
# a mode not listed ranks after them
MODE_BITS = 4
MODE_RANK = {
    mode: n
    for n, mode in enumerate(
        (
            "AccessShareLock",
            "RowShareLock",
            "RowExclusiveLock",
            "ShareUpdateExclusiveLock",
            "ShareLock",
            "ShareRowExclusiveLock",
            "ExclusiveLock",
            "AccessExclusiveLock",
            "SIReadLock",
        )
    )
}
OTHER_MODE = (1 << MODE_BITS) - 1


def sort_key(row: LockRow, rank: dict[str, int]) -> int:
    """A lock's key; ``rank``: each lock type's place in the sorted names of the types."""
    classid, objid = row.classid, row.objid
    if row.locktype == "advisory" and classid is not None and objid is not None:
        place = (row.objsubid or 0) << SUBID_BIT | classid << CLASSID_BIT | objid
    else:
        place = row.relation or 0
    place |= (row.database or 0) << DATABASE_BIT | rank[row.locktype] << TYPE_BIT
    return place << PLACE | rest(row)


def rest(row: LockRow) -> int:
    """The sort key below the place: holders (by pid, then mode) before waiters (by wait
    start in microseconds, then pid)."""
    if row.granted:
        return holder_rest(row.pid, row.mode)
    start = row.waitstart
    waited = (start - _EPOCH) // _MICROSECOND if start is not None else _NO_START
    return 1 << 96 | waited << 32 | (row.pid or 0)


def holder_rest(pid: int | None, mode: str) -> int:
    """:func:`rest` of a granted lock."""
    return (pid or 0) << MODE_BITS | MODE_RANK.get(mode, OTHER_MODE)
