"""The :class:`Reader` of one target: probe, snapshot, diagnosis, a :class:`Reading`.

:func:`open_session` is the only place a diagnostic session is opened (an architecture test
says so): a Reader opens its target's, and every command that talks to a server inspected
goes through one, one-off (:func:`read_all`, each target concurrently) or over time
(:mod:`lockdiag.evidence.paced`). A conversation that is no read of the lock table (terminate's
signal, pooltest's count of the test key's holders, `log`'s names, `decode`'s hashtext) is
held on the session the Reader opened (:attr:`Reader.session`).

The driver is imported when a session is opened: a snapshot file is read without it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lockdiag.core.model import Scope, Snapshot
from lockdiag.core.pacing import Activity
from lockdiag.errors import LockdiagError
from lockdiag.evidence.overlap import import_now, importing
from lockdiag.evidence.reading import ANALYSIS_MODULES, WHOLE, Analysis, Reading, diagnose
from lockdiag.evidence.target import Target, label
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Poolers, Registry

if TYPE_CHECKING:
    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.pg.session import DiagnosticSession

MAX_PARALLEL = 32  # targets read at a time


def open_session(
    target: Target, *, enrich: bool = True, read_poolers: bool = True
) -> DiagnosticSession:
    """The diagnostic session of ``target``, its snapshots completed with every evidence the
    target has, but what the caller skips on purpose: names from well-known software's tables
    (``enrich``), the pooler consoles and addresses (``read_poolers``)."""
    from lockdiag.pg.session import DiagnosticSession

    return DiagnosticSession(
        target.dsn,
        target.timeout,
        target.registry,
        target.poolers if read_poolers else None,
        enrich=enrich,
    )


class Reader:
    """One target's reads, on its diagnostic session (opened on first use, reopened after a
    failure): a cheap probe of the backends (:meth:`probe`), and a read of the lock table
    analysed once (:meth:`read`). ``enrich`` and ``read_poolers``: see :func:`open_session`."""

    def __init__(self, target: Target, *, enrich: bool = True, read_poolers: bool = True) -> None:
        self.target = target
        self.session = open_session(target, enrich=enrich, read_poolers=read_poolers)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def probe(self, within: float | None = None) -> Activity:
        """What the backends are doing (pg_stat_activity alone: no lock-manager lock);
        ``within``: seconds it may take at most (each statement has the session's deadline
        anyway)."""
        return self.session.activity(within)

    def snapshot(self, scope: Scope, within: float | None = None) -> Snapshot:
        """A snapshot, not analysed (terminate's look after a cancel); errors raised."""
        return self.session.snapshot(scope, within)

    def read(
        self, scope: Scope, analysis: Analysis = WHOLE, within: float | None = None
    ) -> Reading:
        """One snapshot of ``scope`` and its diagnosis, as ``analysis`` asks; the error that
        kept them is in the reading, whole. The analysis's modules and those ``analysis``
        names are imported while the server works (:mod:`.overlap`)."""
        started = time.monotonic()
        try:
            with importing((*ANALYSIS_MODULES, *analysis.imports)) as overlap:
                taken = self.session.snapshot(scope, within, meanwhile=overlap)
        except LockdiagError as error:
            return Reading.failed(self.target.label, error, time.monotonic() - started)
        diagnosis = diagnose(taken, self.target.registry, analysis)
        return Reading(self.target.label, taken, diagnosis, None, time.monotonic() - started)

    def diagnose(self, snapshot: Snapshot) -> Diagnosis:
        """The diagnosis of a snapshot this reader took (pooltest's look at the direct
        server), with the target's registry."""
        return diagnose(snapshot, self.target.registry)

    def interrupt(self) -> None:
        """From another thread: the statement under way, if any, gives up now."""
        self.session.interrupt()

    def close(self) -> None:
        """The session's connection closed (a next read opens a new one)."""
        self.session.close()


def read_once(target: Target, scope: Scope, analysis: Analysis = WHOLE) -> Reading:
    """Connect, read once, disconnect."""
    with Reader(target) as reader:
        return reader.read(scope, analysis)


def read_all(targets: list[Target], scope: Scope, analysis: Analysis = WHOLE) -> list[Reading]:
    """One reading per target, concurrently (no thread for a single one): twenty targets take
    about as long as the slowest, and a failing one does not stop the others."""
    if len(targets) == 1:
        return [read_once(targets[0], scope, analysis)]
    from concurrent.futures import ThreadPoolExecutor  # with logging: only a fleet needs them

    import_now((*ANALYSIS_MODULES, *analysis.imports))  # the readers' threads import nothing
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        return list(pool.map(lambda target: read_once(target, scope, analysis), targets))


def take_snapshot(
    dsn: str | None,
    timeout: Timeout | float,
    scope: Scope,
    registry: Registry | None = None,
    poolers: Poolers | None = None,
) -> Snapshot:
    """Connect, capture one snapshot and complete it, disconnect (the documented Python API:
    ``timeout`` in seconds too; with no registry, no names are computed on the server, with
    no poolers, no console is read)."""
    limit, names, consoles = Timeout.of(timeout), registry or Registry(), poolers or Poolers()
    target = Target(label(dsn), dsn, limit, names, consoles)
    reader = Reader(target, enrich=registry is not None, read_poolers=poolers is not None)
    with reader:
        return reader.snapshot(scope)
