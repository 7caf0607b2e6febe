"""A Diagnosis: everything one snapshot says, analysed once, for every command.

``Diagnosis(snapshot, registry, policy)`` analyses every lock of the snapshot once; the wait-for
graph is built from those entries the first time it is asked for; findings, who-holds and the
listing are read from them. Every note (privileges, standby, what could not be read) is
carried here, so no view can drop one. Nothing here knows about screens or formats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from lockdiag.core.analysis import (
    DEFAULT_POLICY,
    Decoded,
    Filters,
    LockEntry,
    Policy,
    analyse,
    decode,
    privilege_notes,
)
from lockdiag.core.catalogue import snapshot_catalogue
from lockdiag.core.findings import CheckPolicy, CheckReport, check
from lockdiag.core.graph import Blockers, Root, blockers
from lockdiag.core.incident import Incident, incident
from lockdiag.core.model import Snapshot
from lockdiag.keys import LockTriple
from lockdiag.registry import Registry

NO_FILTERS = Filters()


def _no_roots() -> list[Root]:
    return []


@dataclass(frozen=True)
class ListReport:
    snapshot: Snapshot
    entries: list[LockEntry]
    notes: list[str]
    total: int  # entries before filters (of the whole lock table, when narrowed)
    narrowed: bool = False  # only a part of a larger lock table was analysed
    # the root blockers, worst first (the incident's order), asked only by a view that ranks
    roots: Callable[[], list[Root]] = _no_roots


@dataclass(frozen=True)
class WhoHolds:
    key: LockTriple
    decoded: Decoded
    holders: list[LockEntry]
    waiters: list[LockEntry]  # in queue order (by wait start)
    notes: list[str]
    # the snapshot's incident under the default thresholds, computed only when asked for
    incident: Callable[[], Incident] | None = field(default=None, compare=False, repr=False)

    @property
    def held(self) -> bool:
        return bool(self.holders)


class Diagnosis:
    """One snapshot, analysed once. ``total``: the size of the lock table the snapshot was
    narrowed from (see :func:`narrow`), when it was."""

    def __init__(
        self,
        snapshot: Snapshot,
        registry: Registry,
        policy: Policy = DEFAULT_POLICY,
        total: int | None = None,
    ) -> None:
        self.snapshot, self.registry, self.policy = snapshot, registry, policy
        self.entries = analyse(snapshot, registry, policy, advisory_only=False)
        self.total = total
        self._incidents: dict[CheckPolicy, Incident] = {}

    @cached_property
    def advisory(self) -> list[LockEntry]:
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
            return ListReport(self.snapshot, selected, self.notes, len(entries), roots=roots)
        return ListReport(
            self.snapshot, selected, self.notes, self.total, narrowed=True, roots=roots
        )

    def _roots(self) -> list[Root]:
        return self.graph.roots

    def who_holds(self, key: LockTriple) -> WhoHolds:
        entries = [e for e in self.advisory if e.decoded and e.decoded.triple == key]
        if entries and entries[0].decoded is not None:
            decoded = entries[0].decoded
        else:
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


def narrow(
    snapshot: Snapshot, rows: int, policy: Policy = DEFAULT_POLICY, all_types: bool = False
) -> tuple[Snapshot, int] | None:
    """The locks worth ``rows`` rows when there are far more, and the full count: waiters and
    the holders they wait for, then locks of sessions idle longer than ``policy.session_age``
    (certain session locks), then the rest in pg_locks order. Chosen from raw rows, without
    analysing every lock; None when the lock table is small enough already."""
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
    first = [r for r in locks if not r.granted or (waited and r.lock_object in waited)]
    chosen = {id(r) for r in first}
    second = [r for r in locks if r.pid in idle and id(r) not in chosen][
        : max(0, rows - len(first))
    ]
    chosen.update(id(r) for r in second)
    rest = [r for r in locks[: rows * 2] if id(r) not in chosen][: max(0, rows - len(chosen))]
    return replace(snapshot, locks=[*first, *second, *rest]), len(locks)
