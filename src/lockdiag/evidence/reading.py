"""A :class:`Reading`: one read of a target (or of a snapshot file), its snapshot analysed once.

:func:`diagnose` is the only place a :class:`~lockdiag.core.diagnosis.Diagnosis` is built (an
architecture test says so): every command, `watch`, `sample` and the exporter get theirs from
it, as an :class:`Analysis` asks. No server is read here, and no driver imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lockdiag.core.model import Snapshot
from lockdiag.core.policy import DEFAULT_POLICY, Policy
from lockdiag.errors import LockdiagError
from lockdiag.registry import Registry

if TYPE_CHECKING:  # the analysis is imported when a snapshot is analysed (see .overlap)
    from lockdiag.core.analysis import Seen
    from lockdiag.core.diagnosis import Diagnosis

# what a read needs once its rows are in (the catalogue, first: the snapshot's keys are named
# with it, lockdiag.core.ahead) and what diagnose imports: a one-off read has them imported
# while the server works
ANALYSIS_MODULES = (
    "lockdiag.core.catalogue",
    "lockdiag.core.decoding",
    "lockdiag.pg.enrichment",
    "lockdiag.core.diagnosis",
)


class Looking(Protocol):
    """What earlier reads of a target saw held (:class:`lockdiag.core.observe.Looks`)."""

    def look(self, snapshot: Snapshot) -> Seen: ...

    def forget(self) -> None: ...


@dataclass(frozen=True)
class Analysis:
    """How a reading's snapshot is analysed: under ``policy``'s thresholds; dated by ``looks``
    (what earlier reads of the same target saw held: the commands that read over time, each
    read a look); for a screenful, the ``rows`` locks most worth showing only (0: every lock),
    of every lock type or advisory ones (``all_types``); ``imports``: the modules the answer
    needs besides (its views), imported while the server works."""

    policy: Policy = DEFAULT_POLICY
    looks: Looking | None = None
    rows: int = 0
    all_types: bool = False
    imports: tuple[str, ...] = ()


WHOLE = Analysis()  # every lock, default thresholds, no earlier looks


def diagnose(snapshot: Snapshot, registry: Registry, analysis: Analysis = WHOLE) -> Diagnosis:
    """The one Diagnosis of ``snapshot``, as ``analysis`` asks."""
    from lockdiag.core.diagnosis import Diagnosis, narrow

    policy = analysis.policy
    seen = analysis.looks.look(snapshot) if analysis.looks is not None else None
    rows, all_types = analysis.rows, analysis.all_types
    if rows and any(lock.keys > 1 for lock in snapshot.locks):
        # an aggregated read: a span is one row, its fold, and the count is of every lock
        counted = [r for r in snapshot.locks if all_types or r.locktype == "advisory"]
        return Diagnosis(snapshot, registry, policy, total=sum(r.keys for r in counted), seen=seen)
    narrowed = narrow(snapshot, rows, policy, all_types) if rows else None
    if narrowed is None:
        return Diagnosis(snapshot, registry, policy, seen=seen)
    return Diagnosis(narrowed.snapshot, registry, policy, narrowed.total, narrowed.census, seen)


@dataclass(frozen=True)
class Reading:
    """One read of a target (or of a snapshot file): its snapshot and that snapshot's one
    diagnosis, or the error that kept them (whole: its hint too); and how long the read and
    its analysis took."""

    label: str  # the target's (never a password), or the file's path
    snapshot: Snapshot | None
    diagnosis: Diagnosis | None
    error: LockdiagError | None
    seconds: float

    @classmethod
    def failed(cls, label: str, error: LockdiagError, seconds: float) -> Reading:
        return cls(label, None, None, error, seconds)

    @property
    def reason(self) -> str | None:
        """The error in one line, for a report of many targets."""
        return str(self.error).splitlines()[0] if self.error is not None else None

    def diagnosed(self) -> Diagnosis:
        """The diagnosis; the error that kept it, raised whole, when there is none."""
        if self.error is not None:
            raise self.error
        assert self.diagnosis is not None  # a reading without an error was analysed
        return self.diagnosis
