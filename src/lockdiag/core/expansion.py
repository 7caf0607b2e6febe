"""A dump's locks in the full read's order, each span of an aggregated read given back as its
locks: what `list` writes without a LockRow or a LockEntry per lock nobody waits for.

A dump reads the aggregated snapshot with each span's keys (``Aggregated(members=True)``):
the analysis sees a span as one entry, whose every field but its key is each of its locks'
(a backend's granted, uncontested advisory locks of one key space, database and mode), and
the view formats those locks from that entry, a run of objids at a time. The runs are merged
with the other entries in the order :mod:`lockdiag.core.sort_key` packs: a span's lock is its
entry's key with its own objid, so where a run stops (at the next entry, or at another span's
next lock) is one bisection of its objids.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from heapq import heappop, heappush
from typing import NamedTuple

from lockdiag.core.analysis import LockEntry
from lockdiag.core.model import Snapshot
from lockdiag.core.sort_key import PLACE, sort_key
from lockdiag.keys import BIGINT_SUBID, to_int8

RUN = 1024  # a span's locks given at a time: a run's output is made whole before it is written
_LAST = 1 << 256  # after every key


class Run(NamedTuple):
    """Some of a span's locks, consecutive in the dump: the span's entry (every field but the
    key is each lock's) and their objids, ascending."""

    entry: LockEntry
    objids: list[int]

    def numbers(self) -> list[int]:
        """Each lock's key as a number: a bigint key whole (``classid << 32 | objid`` as an
        int8), a pair's second int (its objid as an int4): what a label shows and JSON's
        ``key`` ends with."""
        lock = self.entry.lock
        if lock.objsubid == BIGINT_SUBID:
            base = to_int8(lock.classid or 0, 0)
            return [base + objid for objid in self.objids]
        return [objid - (objid >> 31 << 32) for objid in self.objids]

    def entries(self) -> Iterator[LockEntry]:
        """Each lock as the full read's analysis gives it (for the forms made per lock)."""
        entry = self.entry
        lock, decoded = entry.lock, entry.decoded
        for objid in self.objids:
            one = lock._replace(objid=objid, keys=1, objid_last=None)
            yield entry._replace(
                lock=one, decoded=None if decoded is None else decoded.member(objid)
            )


def has_runs(entries: Sequence[LockEntry], snapshot: Snapshot) -> bool:
    """Whether :func:`in_order` gives any run (a span whose keys were read)."""
    return bool(snapshot.members) and any(e.lock.keys > 1 for e in entries)


def in_order(
    entries: Sequence[LockEntry], snapshot: Snapshot, most: int = RUN
) -> Iterator[LockEntry | Run]:
    """``entries`` (in the analysis's order) with each span whose keys ``snapshot`` holds
    given as runs of at most ``most`` locks, every lock where the full read's analysis puts
    it."""
    if not has_runs(entries, snapshot):
        yield from entries
        return
    rank = {name: n for n, name in enumerate(sorted({r.locktype for r in snapshot.locks}))}
    # the spans' next locks: (key, the span's key with objid 0, its next lock, objids, entry)
    heap: list[tuple[int, int, int, list[int], LockEntry]] = []
    singles: list[LockEntry] = []
    for entry in entries:
        lock = entry.lock
        objids = snapshot.members_of(lock)
        if not objids:
            singles.append(entry)
            continue
        base = sort_key(lock._replace(objid=0), rank)
        heappush(heap, (base + (objids[0] << PLACE), base, 0, objids, entry))

    def before(bound: int) -> Iterator[Run]:
        """The spans' locks whose keys come before ``bound``."""
        while heap and heap[0][0] < bound:
            _, base, at, objids, entry = heappop(heap)
            limit = min(bound, heap[0][0]) if heap else bound
            # a lock comes first while base + (objid << PLACE) < limit
            end = bisect_right(objids, (limit - base - 1) >> PLACE, at)
            for start in range(at, end, most):
                yield Run(entry, objids[start : min(start + most, end)])
            if end < len(objids):
                heappush(heap, (base + (objids[end] << PLACE), base, end, objids, entry))

    for entry in singles:
        if heap:
            yield from before(sort_key(entry.lock, rank))
        yield entry
    yield from before(_LAST)
