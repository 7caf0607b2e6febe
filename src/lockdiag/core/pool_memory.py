"""What earlier reads showed of pooled server connections, for commands that read over time
(watch, sample, the exporter: one :class:`PoolMemory` per diagnostic session).

A transaction pool lends a server connection to whichever client asks next, so a read taken
while a client borrows the connection that carries a leaked session lock shows a client
attached. An earlier read that showed that connection with no client attached, idle with no
transaction open while it held the lock, proved the leak; the proof stands while the same
backend (pid and start time) holds the same lock in every read since. What it cannot see: a
borrower that unlocked and took the same key again between two reads (it would hold the lock
as its own); reads a second or two apart leave little room for that.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from lockdiag.core.model import Remembered, Snapshot

Backend = tuple[int, datetime | None]  # pid and backend_start: a pid reused is another backend


class PoolMemory:
    """Remembers, read after read, the pooled server connections proven to hold leaked
    session locks, and gives each new snapshot what earlier reads proved."""

    def __init__(self) -> None:
        self._proven: dict[Backend, Remembered] = {}

    def recall(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with what earlier reads proved of its backends (``remembered``), after
        adding what this read proves."""
        now = snapshot.server.now
        alone = {
            pid
            for pid, link in snapshot.pool.items()
            if link.via == "console"
            and link.client is None
            and (session := snapshot.sessions.get(pid)) is not None
            and session.certainly_outside_transaction(now)
        }
        wanted = alone | {pid for pid, _ in self._proven}
        if not wanted:
            self._proven = {}
            return snapshot
        held: dict[int, set[tuple[object, ...]]] = {pid: set() for pid in wanted}
        for row in snapshot.locks:
            if row.pid in held and row.granted and row.locktype == "advisory":
                held[row.pid].add(row.lock_object)
        proven: dict[Backend, Remembered] = {}
        for pid, locks in held.items():
            session = snapshot.sessions.get(pid)
            if session is None or not locks:
                continue
            backend = (pid, session.backend_start)
            before = self._proven.get(backend)
            kept = before.locks & locks if before is not None else frozenset()
            if pid in alone:  # every lock it holds now is a session lock with no client
                seen = before.seen if kept and before is not None else now
                proven[backend] = Remembered(seen, frozenset(locks))
            elif kept and before is not None:
                proven[backend] = Remembered(before.seen, kept)
        self._proven = proven
        remembered = {pid: found for (pid, _), found in proven.items()}
        return dataclasses.replace(snapshot, remembered=remembered)
