"""A Diagnosis: everything one snapshot says, analysed once, for every command.

``Diagnosis(snapshot, registry, policy)`` analyses every lock of the snapshot once; the wait-for
graph is built from those entries the first time it is asked for; findings, who-holds and the
listing are read from them. Every note (privileges, standby, what could not be read) is
carried here, so no view can drop one. Nothing here knows about screens or formats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import NamedTuple

from lockdiag.core.analysis import (
    DEFAULT_POLICY,
    Decoded,
    Filters,
    LockEntry,
    Policy,
    Seen,
    analyse,
    decode,
    privilege_notes,
)
from lockdiag.core.catalogue import snapshot_catalogue
from lockdiag.core.findings import CheckPolicy, CheckReport, check, locks_in
from lockdiag.core.graph import Blockers, Root, blockers
from lockdiag.core.incident import Incident, incident
from lockdiag.core.model import LockRow, Snapshot, Space, space_of
from lockdiag.keys import BIGINT_SUBID, INT4_MAX, PAIR_SUBID, AdvisoryTag, LockTriple, to_int4
from lockdiag.registry import Namespace, Registry

NO_FILTERS = Filters()


def _no_roots() -> list[Root]:
    return []


# the objids of the uncontested locks of each space, in the whole lock table (see narrow)
Census = Mapping[Space, list[int]]


class Span(NamedTuple):
    """The uncontested locks of one space of a backend, in the whole lock table: the
    namespace naming the space, how many, and the smallest and largest resource."""

    namespace: Namespace
    locks: int
    first: int
    last: int


class Narrowed(NamedTuple):
    """What :func:`narrow` keeps: the snapshot of the chosen locks, the size of the whole
    lock table and its census."""

    snapshot: Snapshot
    total: int
    census: Census


@dataclass(frozen=True)
class ListReport:
    snapshot: Snapshot
    entries: list[LockEntry]
    notes: list[str]
    total: int  # entries before filters (of the whole lock table, when narrowed)
    narrowed: bool = False  # only a part of a larger lock table was analysed
    # when narrowed: the uncontested locks of the whole lock table in each space a namespace
    # names, so that a view folding them counts them all, not only the rows analysed
    spans: Mapping[Space, Span] | None = None
    # the root blockers, worst first (the incident's order), asked only by a view that ranks
    roots: Callable[[], list[Root]] = _no_roots


@dataclass(frozen=True)
class WhoHolds:
    key: LockTriple | AdvisoryTag
    decoded: Decoded | None  # None for an extension's tag: no name is ever given to one
    holders: list[LockEntry]
    waiters: list[LockEntry]  # in queue order (by wait start)
    notes: list[str]
    # the snapshot's incident under the default thresholds, computed only when asked for
    incident: Callable[[], Incident] | None = field(default=None, compare=False, repr=False)

    @property
    def held(self) -> bool:
        return bool(self.holders)

    @property
    def label(self) -> str:
        """The key's name (a namespace's, a software's, or unregistered), or the tag's
        numbers."""
        if self.decoded is not None:
            return self.decoded.label
        assert isinstance(self.key, AdvisoryTag)  # a key is always decoded (who_holds)
        return self.key.label


class Diagnosis:
    """One snapshot, analysed once. ``total`` and ``census``: the size and the census of the
    lock table the snapshot was narrowed from (see :func:`narrow`), when it was. ``seen``:
    when looks up to this snapshot saw its locks held (commands that read over time)."""

    def __init__(
        self,
        snapshot: Snapshot,
        registry: Registry,
        policy: Policy = DEFAULT_POLICY,
        total: int | None = None,
        census: Census | None = None,
        seen: Seen | None = None,
    ) -> None:
        self.snapshot, self.registry, self.policy = snapshot, registry, policy
        self.entries = analyse(snapshot, registry, policy, advisory_only=False, seen=seen)
        self.total, self.census = total, census
        self._incidents: dict[CheckPolicy, Incident] = {}

    @cached_property
    def advisory(self) -> list[LockEntry]:
        if all(map(_ADVISORY, map(_LOCKTYPE, self.snapshot.locks))):  # told in C
            return self.entries  # a read of advisory locks (the usual case)
        return [e for e in self.entries if e.lock.locktype == "advisory"]

    @cached_property
    def graph(self) -> Blockers:
        return blockers(self.snapshot, self.entries)

    @cached_property
    def notes(self) -> list[str]:
        return [*privilege_notes(self.snapshot, self.entries), *self.snapshot.notes]

    def findings(self, policy: CheckPolicy) -> CheckReport:
        return self.incident(policy).report

    def incident(self, policy: CheckPolicy) -> Incident:
        """The findings under ``policy`` ranked into causes and symptoms: computed once per
        policy, and the one answer every view gives to "what comes first"."""
        found = self._incidents.get(policy)
        if found is None:
            report = check(self.snapshot, self.entries, self.graph, self.notes, policy)
            found = self._incidents[policy] = incident(report)
        return found

    def listing(self, filters: Filters = NO_FILTERS, all_types: bool = False) -> ListReport:
        entries = self.entries if all_types else self.advisory
        selected = [e for e in entries if filters.accept(e)] if filters != NO_FILTERS else entries
        roots = self._roots
        if self.total is None:
            return ListReport(self.snapshot, selected, self.notes, locks_in(entries), roots=roots)
        spans = self._spans() if self.census is not None and filters == NO_FILTERS else None
        return ListReport(
            self.snapshot,
            selected,
            self.notes,
            self.total,
            narrowed=True,
            roots=roots,
            spans=spans,
        )

    def _spans(self) -> dict[Space, Span]:
        """The census of the whole lock table, for the spaces a namespace names (every key of
        such a space is the namespace's: no well-known key is decoded alone there), with the
        analysed locks it leaves out: uncontested ones on an object somebody waits for."""
        assert self.census is not None
        spans = {
            space: span
            for space, objids in self.census.items()
            if (span := _span(self.registry, space, objids)) is not None
        }
        waited = {e.lock.lock_object for e in self.advisory if not e.lock.granted}
        for e in self.advisory if waited else ():
            lock, resource = e.lock, e.decoded.resource if e.decoded else None
            if not lock.granted or e.blocks or resource is None or lock.lock_object not in waited:
                continue
            space = (lock.pid, lock.database, lock.mode, lock.objsubid, lock.classid)
            span = spans.get(space)
            if span is not None:
                spans[space] = span._replace(
                    locks=span.locks + 1,
                    first=min(span.first, resource),
                    last=max(span.last, resource),
                )
        return spans

    def _roots(self) -> list[Root]:
        """The root blockers in the incident's order (under `check`'s default thresholds, as
        `blockers` and `watch` rank them)."""
        causes = self.incident(CheckPolicy()).causes
        return [cause.root for cause in causes if cause.root is not None]

    def who_holds(self, key: LockTriple | AdvisoryTag) -> WhoHolds:
        """The holders and waiters of one key, or of an extension's tag (by its numbers,
        never named)."""
        decoded: Decoded | None = None
        if isinstance(key, AdvisoryTag):
            entries = [e for e in self.advisory if e.lock.advisory_tag == key]
        else:
            entries = [e for e in self.advisory if e.decoded and e.decoded.triple == key]
            decoded = entries[0].decoded if entries else None
            if decoded is None:
                known = snapshot_catalogue(self.snapshot, self.registry.candidates)
                decoded = decode(self.registry, known, key, None)
        notes = list(self.notes)
        if any(e.pool for e in entries):
            notes.append(
                "application_name of a pooled server connection is the last client's, and a "
                "client that sends none inherits the previous one's: it may not name who took "
                "the lock"
            )
        databases = {e.database for e in entries}
        if len(databases) > 1:
            notes.append(
                "advisory locks are per database: this key is taken in "
                + ", ".join(sorted(str(d) for d in databases))
                + " (different locks that do not conflict)"
            )
        holders = [e for e in entries if e.lock.granted]
        waiters = [e for e in entries if not e.lock.granted]
        return WhoHolds(key, decoded, holders, waiters, notes, self._default_incident)

    def _default_incident(self) -> Incident:
        return self.incident(CheckPolicy())


def _span(registry: Registry, space: Space, objids: list[int]) -> Span | None:
    """The span of a census space, when a namespace names it: the resources of its smallest
    and largest keys, decoded as every key is."""
    _, _, _, objsubid, classid = space
    if objsubid not in (BIGINT_SUBID, PAIR_SUBID) or classid is None:
        return None
    if registry.decode(LockTriple.of_row(classid, 0, objsubid)) is None:
        return None  # unregistered, or well-known software's: every key is decoded alone
    low, high = min(objids), max(objids)
    if objsubid == PAIR_SUBID and low <= INT4_MAX < high:  # a pair's objid is a signed int4
        low, high = min(objids, key=to_int4), max(objids, key=to_int4)
    first = registry.decode(LockTriple.of_row(classid, low, objsubid))
    last = registry.decode(LockTriple.of_row(classid, high, objsubid))
    assert first is not None and last is not None  # a namespace names its space's every key
    return Span(first[0], len(objids), first[1], last[1])


_ADVISORY, _LOCKTYPE = "advisory".__eq__, attrgetter("locktype")


def _census(
    locks: Iterable[LockRow], waited: set[tuple[object, ...]], objects: set[int | None]
) -> dict[Space, list[int]]:
    """The objids of the granted advisory locks nobody waits for, by backend, database, mode
    and key space: one pass over the raw rows, a tuple and a dict lookup per lock (``objects``:
    the objids of the ``waited`` lock objects, which tell most rows apart by themselves)."""
    found: defaultdict[Space, list[int]] = defaultdict(list)
    for row in locks:
        objid = row.objid
        if not row.granted or row.locktype != "advisory" or objid is None:
            continue
        if objid not in objects or row.lock_object not in waited:
            found[space_of(row)].append(objid)
    return dict(found)


def narrow(
    snapshot: Snapshot, rows: int, policy: Policy = DEFAULT_POLICY, all_types: bool = False
) -> Narrowed | None:
    """The locks worth ``rows`` rows when there are far more, the full count and the census
    of the uncontested advisory locks: waiters and the holders they wait for, then locks of
    sessions idle longer than ``policy.session_age`` (certain session locks), then the rest
    in pg_locks order. Chosen from raw rows, without analysing every lock; None when the lock
    table is small enough already."""
    locks = snapshot.locks if all_types else [r for r in snapshot.locks if r.locktype == "advisory"]
    if len(locks) <= rows:
        return None
    waited = {r.lock_object for r in locks if not r.granted}
    now = snapshot.server.now
    idle = {
        pid
        for pid, s in snapshot.sessions.items()
        if s.certainly_outside_transaction(now)
        and s.state_change is not None
        and (now - s.state_change).total_seconds() >= policy.session_age
    }
    objects = {r.objid for r in locks if not r.granted}  # most rows are told apart by it alone
    first = [r for r in locks if not r.granted or (r.objid in objects and r.lock_object in waited)]
    chosen = {id(r) for r in first}
    second = [r for r in locks if r.pid in idle and id(r) not in chosen][
        : max(0, rows - len(first))
    ]
    chosen.update(id(r) for r in second)
    rest = [r for r in locks[: rows * 2] if id(r) not in chosen][: max(0, rows - len(chosen))]
    kept = replace(snapshot, locks=[*first, *second, *rest])
    return Narrowed(kept, len(locks), _census(locks, waited, objects))
