"""The report: each lock the log names, named (advisory keys through the registry, then the
catalogue; relations by name where a server told them, else by OID), ranked by the wait it
caused, with totals per namespace. The one module here that reads ``lockdiag.core`` (analysis,
catalogue) and the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from lockdiag.core.analysis import Decoded, decode
from lockdiag.core.catalogue import Catalogue, build_catalogue
from lockdiag.keys import TAG_NAMESPACE, AdvisoryTag, LockTriple
from lockdiag.logs.events import ReadCounts
from lockdiag.logs.messages import Identity, LockTag
from lockdiag.logs.tally import Cancellation, Deadlock, KeyTally, Tally, TimelineEvent, key_of
from lockdiag.registry import Registry


@dataclass(frozen=True)
class Names:
    """What a server can add (``--dsn``): database names by OID, relation names by
    (database OID, relation OID)."""

    databases: dict[int, str] = field(default_factory=dict)
    relations: dict[tuple[int, int], str] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyReport:
    tally: KeyTally
    label: str
    namespace: str
    database: str | None
    decoded: Decoded | None


@dataclass(frozen=True)
class NamespaceTotal:
    namespace: str
    keys: int
    waits: int
    longest_ms: float
    total_ms: float
    deadlocks: int


@dataclass(frozen=True)
class LogReport:
    keys: list[KeyReport]  # most total wait first
    namespaces: list[NamespaceTotal]
    deadlocks: list[Deadlock]
    deadlock_count: int
    cancellations: list[Cancellation]
    cancellation_count: int
    unnamed_lock_timeouts: int
    reads: list[ReadCounts]
    first: datetime | None
    last: datetime | None
    timeline_key: LockTriple | AdvisoryTag | None
    timeline: list[TimelineEvent]
    labels: dict[tuple[object, ...], str]  # every tag's label, for deadlocks and timeouts
    timeline_left_out: int = 0  # events past KEPT_TIMELINE
    waits_closed_early: int = 0  # closed while open: more than OPEN_WAITS (or OPEN_HOLDERS)
    database_names_left_out: int = 0  # lock entries whose database's name was past DATABASE_NAMES

    def label(self, tag: LockTag | None) -> str:
        if tag is None:
            return "(lock not logged)"
        return self.labels.get(key_of(tag), tag.text)


class Namer:
    """Names lock tags: advisory keys through the registry, then the catalogue; relations by
    name where known, else by OID."""

    def __init__(self, registry: Registry, database_names: dict[int, str], names: Names) -> None:
        self.registry = registry
        self.databases = {**database_names, **names.databases}
        self.relations = names.relations
        self.catalogue: Catalogue = build_catalogue(registry.candidates, self.databases.values())

    def database(self, tag: LockTag) -> str | None:
        return self.databases.get(tag.database) if tag.database is not None else None

    def name(self, tag: LockTag) -> tuple[str, str, Decoded | None]:
        """(label, namespace, decoded) of one tag."""
        if tag.advisory is not None:
            decoded = decode(self.registry, self.catalogue, tag.advisory, self.database(tag))
            if decoded.namespace is not None:
                namespace = decoded.namespace.name
            elif decoded.known is not None:
                namespace = decoded.known.software
            else:
                namespace = "unregistered"
            return decoded.label, namespace, decoded
        if tag.tag is not None:  # an extension's: its numbers, never a name
            return tag.tag.label, TAG_NAMESPACE, None
        if tag.relation is not None and tag.database is not None:
            relation = self.relations.get((tag.database, tag.relation)) or self.relations.get(
                (0, tag.relation)
            )
            where = f"relation {relation}" if relation else f"relation oid {tag.relation}"
            if tag.kind != "relation":
                head = tag.text.split(" of relation ")[0]
                return f"{head} of {where}", tag.kind, None
            return where, "relation", None
        return tag.text, tag.kind, None


def report(tally: Tally, registry: Registry, names: Names = Names()) -> LogReport:
    """The report of what ``tally`` read. It finishes the tally (the waits still open are
    closed as "no end logged") and names the holders its episodes met before their sessions
    were known, in place: the tally is read to its end once, then reported."""
    tally.finish()
    namer = Namer(registry, tally.database_names, names)
    labels: dict[tuple[object, ...], str] = {}
    keys: list[KeyReport] = []
    unknown = Identity(None, None, None)
    for key, one in tally.keys.items():
        for episode in one.episodes:  # a holder named by a line it wrote after the wait
            for pid, who in episode.holders.items():
                if who == unknown and pid in tally.identities:
                    episode.holders[pid] = tally.identities[pid]
        label, namespace, decoded = namer.name(one.tag)
        labels[key] = label
        keys.append(KeyReport(one, label, namespace, namer.database(one.tag), decoded))
    for kind, one in tally.folded.items():
        label = f"{one.folded} other {kind} lock(s), the least waited, counted together"
        keys.append(KeyReport(one, label, kind, None, None))
    for deadlock in tally.deadlocks:
        for step in deadlock.cycle:
            labels.setdefault(key_of(step.tag), namer.name(step.tag)[0])
    keys.sort(key=lambda k: (-k.tally.total_ms, -k.tally.waits, -k.tally.deadlocks, k.label))
    totals: dict[str, list[float]] = {}
    for named in keys:
        row = totals.setdefault(named.namespace, [0, 0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += named.tally.waits
        row[2] = max(row[2], named.tally.longest_ms)
        row[3] += named.tally.total_ms
        row[4] += named.tally.deadlocks
    namespaces = sorted(
        (
            NamespaceTotal(name, int(r[0]), int(r[1]), r[2], r[3], int(r[4]))
            for name, r in totals.items()
        ),
        key=lambda n: (-n.total_ms, -n.waits, n.namespace),
    )
    return LogReport(
        keys=keys,
        namespaces=namespaces,
        deadlocks=tally.deadlocks,
        deadlock_count=tally.deadlock_count,
        cancellations=tally.cancellations,
        cancellation_count=tally.cancellation_count,
        unnamed_lock_timeouts=tally.unnamed_lock_timeouts,
        reads=tally.reads,
        first=tally.first,
        last=tally.last,
        timeline_key=tally.timeline_key,
        timeline=sorted(tally.timeline, key=lambda e: e.time or datetime.min),
        labels=labels,
        timeline_left_out=tally.timeline_left_out,
        waits_closed_early=tally.closed_early,
        database_names_left_out=tally.database_names_left_out,
    )


def relation_oids(tally: Tally) -> set[tuple[int, int]]:
    """(database OID, relation OID) of every relation the log names, for ``--dsn``."""
    found = {
        (one.tag.database, one.tag.relation)
        for one in tally.keys.values()
        if one.tag.database is not None and one.tag.relation is not None
    }
    return {(d, r) for d, r in found if d is not None and r is not None}
