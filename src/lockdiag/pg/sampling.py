"""Snapshots over time, on one diagnostic session: `sample`'s polling loop and `watch`'s feed.

A lost connection is reopened at the next tick; what could not be read is reported, never
retried in a tight loop. The statistics themselves are pure (:mod:`lockdiag.core.observe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import Snapshot
from lockdiag.core.observe import Sampler, collect_now_and_then
from lockdiag.errors import LockdiagError, ServerError
from lockdiag.pg.fleet import Target, open_session


def sample(
    server: Target,
    duration: float,
    interval: float,
    progress: Callable[[int, int, str | None], None],
    sampler: Sampler,
) -> None:
    """Poll one connection into ``sampler``: one snapshot query per sample, each bounded by
    the time left (a server that stops answering ends it on time, give or take the deadline's
    margin). Interrupted, the sampler keeps what was sampled so far."""
    expected = max(1, int(duration / interval))
    ends = time.monotonic() + duration
    # statistics over time: no names from well-known software's tables at each sample
    with open_session(server, enrich=False) as session:
        while (left := ends - time.monotonic()) > 0:
            tick = time.monotonic()
            error = None
            collect_now_and_then(sampler.samples)
            try:
                snapshot = session.snapshot("advisory", within=left)
            except ServerError as failure:
                error = str(failure)
                session.close()
            else:
                diagnosis = Diagnosis(snapshot, server.registry)
                sampler.add(diagnosis.advisory, snapshot.server.now, snapshot.query_seconds)
            progress(sampler.samples, expected, error)
            now = time.monotonic()
            time.sleep(max(0.0, min(interval - (now - tick), ends - now)))


class Feed:
    """Snapshots from a server (one session, reopened after a failure) or a recording."""

    def __init__(self, server: Target, replay: Path | None, record: Path | None) -> None:
        self.session = open_session(server)
        self.record = record
        self.recorded: list[str] = []
        if replay is not None:
            self.recorded = snapshot_file.read_recording(replay)
        self.replaying = replay is not None
        # a snapshot file (`snapshot -o`) replays as one frame: its document, over many lines
        self.whole_document = len(self.recorded) == 1 and "\n" in self.recorded[0].strip()
        self.position = 0
        self.replay_name = str(replay)

    def next(self) -> Snapshot:
        if self.replaying:
            line = self.recorded[min(self.position, len(self.recorded) - 1)]
            self.position += 1
            if self.whole_document:  # its errors name the file's line themselves
                return snapshot_file.loads(line, self.replay_name)
            return snapshot_file.loads(line, f"{self.replay_name}:{self.position}")
        try:
            taken = self.session.snapshot("all")
        except LockdiagError:
            self.close()
            raise
        if self.record is not None:
            snapshot_file.append_line(self.record, snapshot_file.record_line(taken))
        return taken

    def interrupt(self) -> None:
        """From another thread: the snapshot under way, if any, gives up now."""
        self.session.interrupt()

    def close(self) -> None:
        self.session.close()
