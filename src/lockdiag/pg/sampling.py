"""Snapshots over time, on one diagnostic session: `sample`'s polling loop and `watch`'s feed.

A lost connection is reopened at the next tick; what could not be read is reported, never
retried in a tight loop. The statistics themselves are pure (:mod:`lockdiag.core.observe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.leaders import contention
from lockdiag.core.model import Aggregated, Snapshot
from lockdiag.core.observe import Sampler
from lockdiag.core.pacing import Pacer, collect_now_and_then
from lockdiag.errors import LockdiagError, ServerError
from lockdiag.pg.fleet import Target, open_session

# Incremental reading, as the exporter's sampler does (core.pacing.Pacer): each interval a
# probe of pg_stat_activity (no lock-manager lock); the lock table is read only when the
# backends changed since the last read, or that read is STALE_INTERVALS intervals old, and
# within a duty cycle: reads (the query, its rows, their analysis) take at most this share of
# the wall time, whatever the lock count. A lock taken or released without a statement boundary
# (inside a running function) is seen at the next stale read.
WATCH_DUTY = 0.1
SAMPLE_DUTY = 0.2
STALE_INTERVALS = 10


def sample(
    server: Target,
    duration: float,
    interval: float,
    progress: Callable[[int, int, str | None], None],
    sampler: Sampler,
) -> Pacer:
    """Sample one connection into ``sampler`` every ``interval``: a probe of the backends,
    and a read of the lock table when it is due (:class:`Pacer`); a probe that finds the
    backends unchanged repeats the last read (:meth:`Sampler.again`). Each statement is
    bounded by the time left (a server that stops answering ends it on time, give or take
    the deadline's margin). Interrupted, the sampler keeps what was sampled so far. Returns
    the pacer: the reads, their cost and their achieved interval."""
    expected = max(1, int(duration / interval))
    ends = time.monotonic() + duration
    pacer = Pacer(SAMPLE_DUTY, STALE_INTERVALS * interval)
    read_at, server_time = 0.0, datetime.min  # the last read: time.monotonic(), server's now
    # statistics over time: no names from well-known software's tables at each sample
    with open_session(server, enrich=False) as session:
        try:
            while (left := ends - time.monotonic()) > 0:
                tick = time.monotonic()
                error = None
                try:
                    activity = session.activity(within=left)
                    if pacer.due(tick, activity):
                        collect_now_and_then(pacer.reads)
                        began = time.monotonic()  # the probe (and connecting) is not a read
                        snapshot = session.snapshot(
                            Aggregated(all_types=False), within=ends - time.monotonic()
                        )
                        seen = sampler.looks.look(snapshot)
                        diagnosis = Diagnosis(snapshot, server.registry, seen=seen)
                        read_at, server_time = tick, snapshot.server.now
                        sampler.add(diagnosis.advisory, server_time, snapshot.query_seconds)
                        sampler.standing.add(contention(snapshot, diagnosis.advisory))
                        pacer.read(began, time.monotonic() - began, activity)
                    else:
                        sampler.again(server_time + timedelta(seconds=tick - read_at))
                except ServerError as failure:
                    error = str(failure)
                    session.close()
                    pacer.forget()
                progress(sampler.samples, expected, error)
                done = time.monotonic()
                time.sleep(max(0.0, min(interval - (done - tick), ends - done)))
        finally:
            sampler.settle()
    return pacer


class Feed:
    """Snapshots from a server (one session, reopened after a failure) or a recording.

    From a server it reads incrementally (see WATCH_DUTY): :meth:`next` gives None when the
    backends are as they were at the last read, which then still holds."""

    def __init__(
        self, server: Target, replay: Path | None, record: Path | None, interval: float = 2.0
    ) -> None:
        self.record = record
        self.recorded: list[str] = []
        self.replaying = replay is not None
        # a recording needs no server, nor the driver: no session is opened for it
        self.session = None if self.replaying else open_session(server)
        if replay is not None:
            self.recorded = snapshot_file.read_recording(replay)
        # a snapshot file (`snapshot -o`) replays as one frame: its document, over many lines
        self.whole_document = len(self.recorded) == 1 and "\n" in self.recorded[0].strip()
        self.position = 0
        self.replay_name = str(replay)
        self.pacer = Pacer(WATCH_DUTY, STALE_INTERVALS * interval)

    def next(self) -> Snapshot | None:
        if self.session is None:
            line = self.recorded[min(self.position, len(self.recorded) - 1)]
            self.position += 1
            if self.whole_document:  # its errors name the file's line themselves
                return snapshot_file.loads(line, self.replay_name)
            return snapshot_file.loads(line, f"{self.replay_name}:{self.position}")
        tick = time.monotonic()
        try:
            activity = self.session.activity()
            if not self.pacer.due(tick, activity):
                return None
            began = time.monotonic()  # the probe (and connecting) is not a read
            taken = self.session.snapshot(Aggregated())
        except LockdiagError:
            self.close()
            self.pacer.forget()
            raise
        self.pacer.read(began, time.monotonic() - began, activity)
        if self.record is not None:
            snapshot_file.append_line(self.record, snapshot_file.record_line(taken))
        return taken

    def interrupt(self) -> None:
        """From another thread: the snapshot under way, if any, gives up now."""
        if self.session is not None:
            self.session.interrupt()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
