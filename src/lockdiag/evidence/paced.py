"""Reads over time: one loop for `watch`, `sample` and the exporter's samplers.

Each tick is a cheap probe of the backends (pg_stat_activity only: no lock-manager lock); the
lock table is read, and the read analysed, only when a :class:`~lockdiag.core.pacing.Pacer`
says so: the backends changed since the last read, or that read is stale, and within a duty
cycle. One cost accounting: the read and its analysis count in the duty cycle (the reading's
seconds), never connecting nor the probe (a slow first connection barred reads for seconds,
and brief holds went unseen). One failure reset: a failed probe or read closes the session
(the next tick reconnects), forgets the pacer's last read (the next probe reads, whatever the
duty cycle) and the looks (what went on while nothing could look is unknown); what could not
be read is handed on, never retried in a tight loop. A lock taken or released without a
statement boundary (inside a running function) is seen at the next stale read.

:class:`PacedReader` is that loop on a server, :class:`Replay` a recording played in its
place (`watch --from`); :func:`sample` is `sample`'s use of it. The statistics themselves are
pure (:mod:`lockdiag.core.observe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from lockdiag.core import snapshot_file
from lockdiag.core.leaders import contention
from lockdiag.core.model import Aggregated, Scope
from lockdiag.core.observe import Sampler
from lockdiag.core.pacing import Pacer, collect_now_and_then
from lockdiag.errors import LockdiagError, ServerError
from lockdiag.evidence.reader import Reader
from lockdiag.evidence.reading import Analysis, Reading, diagnose
from lockdiag.evidence.target import Target
from lockdiag.registry import Registry

# the share of the wall time the reads (and their analysis) may take, and how many intervals
# a read stays good for when the backends do not change
WATCH_DUTY = 0.1
SAMPLE_DUTY = 0.2
STALE_INTERVALS = 10

# what a tick hands on: a reading (its error in it), or None when the backends were as they
# were at the last read (which still holds); and when the tick began (time.monotonic())
Each = Callable[[Reading | None, float], None]
# waits for the next tick, given the seconds left of the interval: False to stop
Wait = Callable[[float], bool]


class Feed:
    """Readings over time, a tick at a time: a server's (:class:`PacedReader`) or a
    recording's (:class:`Replay`). :meth:`run` is the one loop: a tick, its outcome handed on,
    a wait; until ``wait`` says stop or ``ends`` (time.monotonic()) passes, each tick bounded
    by the time left."""

    pacer: Pacer
    reads_server: bool  # else a recording: no driver, no server's notices

    def tick(self, ends: float | None = None) -> Reading | None:
        raise NotImplementedError

    def run(self, each: Each, wait: Wait, interval: float, ends: float | None = None) -> None:
        pause = 0.0
        while ends is None or time.monotonic() < ends:
            if ends is not None:
                pause = min(pause, max(0.0, ends - time.monotonic()))
            if not wait(pause) or (ends is not None and time.monotonic() >= ends):
                return
            began = time.monotonic()
            each(self.tick(ends), began)
            pause = max(0.0, interval - (time.monotonic() - began))

    def interrupt(self) -> None:
        """From another thread: the read under way, if any, gives up now."""

    def close(self) -> None:
        """Nothing kept open any more."""


class PacedReader(Feed):
    """A target read over time on one :class:`Reader`: a probe every tick, a read of ``scope``
    analysed as ``analysis`` asks when ``pacer`` says it is due (see the module). ``record``:
    a file each read's snapshot is appended to (`watch --record`)."""

    reads_server = True

    def __init__(
        self,
        reader: Reader,
        scope: Scope,
        pacer: Pacer,
        analysis: Analysis,
        record: Path | None = None,
    ) -> None:
        self.reader, self.scope, self.pacer, self.analysis = reader, scope, pacer, analysis
        self.record = record

    def tick(self, ends: float | None = None) -> Reading | None:
        """One probe, and a read when due: the reading (a failure's error in it), or None
        when the backends are as they were at the last read."""
        probed = time.monotonic()
        try:
            activity = self.reader.probe(_left(ends))
        except LockdiagError as error:
            self._failed()
            return Reading.failed(self.reader.target.label, error, time.monotonic() - probed)
        if not self.pacer.due(probed, activity):
            return None
        collect_now_and_then(self.pacer.reads)
        began = time.monotonic()  # the probe (and connecting) is not a read
        reading = self.reader.read(self.scope, self.analysis, _left(ends))
        if reading.snapshot is None:  # failed: the error is in the reading
            self._failed()
            return reading
        self.pacer.read(began, reading.seconds, activity)
        if self.record is not None:
            snapshot_file.append_line(self.record, snapshot_file.record_line(reading.snapshot))
        return reading

    def _failed(self) -> None:
        """The one failure reset (see the module)."""
        self.reader.close()
        self.pacer.forget()
        if self.analysis.looks is not None:
            self.analysis.looks.forget()

    def interrupt(self) -> None:
        self.reader.interrupt()

    def close(self) -> None:
        self.reader.close()


class Replay(Feed):
    """A recording (`watch --record`) read frame by frame in place of a server, each frame
    analysed as ``analysis`` asks; a snapshot file (`snapshot -o`) replays as one frame, its
    last frame again at every tick after the end. Needs no server, nor the driver."""

    reads_server = False

    def __init__(
        self, path: Path, registry: Registry, analysis: Analysis, interval: float = 2.0
    ) -> None:
        self.registry, self.analysis = registry, analysis
        self.recorded = snapshot_file.read_recording(path)
        # a snapshot file (`snapshot -o`) replays as one frame: its document, over many lines
        self.whole_document = len(self.recorded) == 1 and "\n" in self.recorded[0].strip()
        self.position = 0
        self.name = str(path)
        self.pacer = Pacer(WATCH_DUTY, STALE_INTERVALS * interval)  # no read: no interval

    def tick(self, ends: float | None = None) -> Reading:
        began = time.monotonic()
        line = self.recorded[min(self.position, len(self.recorded) - 1)]
        self.position += 1
        # a whole document's errors name the file's line themselves
        where = self.name if self.whole_document else f"{self.name}:{self.position}"
        try:
            taken = snapshot_file.loads(line, where)
        except LockdiagError as error:
            return Reading.failed(self.name, error, time.monotonic() - began)
        diagnosis = diagnose(taken, self.registry, self.analysis)
        return Reading(self.name, taken, diagnosis, None, time.monotonic() - began)


def watching(
    target: Target, analysis: Analysis, interval: float, record: Path | None = None
) -> PacedReader:
    """`watch`'s reads of a server: everything a diagnosis may use (the aggregated read, the
    registry's names from tables, the poolers), within WATCH_DUTY."""
    pacer = Pacer(WATCH_DUTY, STALE_INTERVALS * interval)
    return PacedReader(Reader(target), Aggregated(), pacer, analysis, record)


def sample(
    target: Target,
    duration: float,
    interval: float,
    progress: Callable[[int, int, str | None], None],
    sampler: Sampler,
) -> Pacer:
    """Sample one connection into ``sampler`` every ``interval`` for ``duration``: a read when
    due, else the last read again (:meth:`Sampler.again`). Each statement is bounded by the
    time left (a server that stops answering ends it on time, give or take the deadline's
    margin). Interrupted, the sampler keeps what was sampled so far. Returns the pacer: the
    reads, their cost and their achieved interval."""
    expected = max(1, int(duration / interval))
    ends = time.monotonic() + duration
    pacer = Pacer(SAMPLE_DUTY, STALE_INTERVALS * interval)
    # statistics over time: no names from well-known software's tables at each sample
    paced = PacedReader(
        Reader(target, enrich=False),
        Aggregated(all_types=False),
        pacer,
        Analysis(looks=sampler.looks),
    )
    last: list[tuple[float, datetime]] = [(0.0, datetime.min)]  # a read's tick, server's now

    def each(reading: Reading | None, tick: float) -> None:
        error = None
        if reading is None:
            read_at, server_time = last[0]
            sampler.again(server_time + timedelta(seconds=tick - read_at))
        elif reading.error is not None:
            if not isinstance(reading.error, ServerError):
                raise reading.error  # bad input (an invalid DSN) stops
            error = str(reading.error)
        else:
            snapshot, advisory = reading.snapshot, reading.diagnosed().advisory
            assert snapshot is not None
            last[0] = (tick, snapshot.server.now)
            sampler.add(advisory, snapshot.server.now, snapshot.query_seconds)
            sampler.standing.add(contention(snapshot, advisory))
        progress(sampler.samples, expected, error)

    try:
        paced.run(each, _sleep, interval, ends)
    finally:
        paced.close()
        sampler.settle()
    return pacer


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


def _left(ends: float | None) -> float | None:
    return None if ends is None else ends - time.monotonic()
