"""Scrapes: one snapshot per target at a time, each waited for until a deadline, once.

Each configured target has one :class:`~lockdiag.evidence.Reader` for scrapes (its read-only
diagnostic session), and its readings are taken in threads of their own (at most one per
target), so the targets are read concurrently.
Concurrent scrapes of a target wait for the snapshot under way and share it, so a stalled
target piles up neither threads nor sessions; a scrape less than --min-read-interval after a
target's last read gets that read (no client sets the pace of the reads of pg_locks). The
deadline of a scrape is --timeout plus the session's margin, or less when the scraper asks
(Prometheus's scrape timeout). A target that misses it (a scrape gave up waiting, or its
attempt failed only after --timeout: a frozen server, a silent network path) is *stalled*: it
is reported down at once, and later scrapes never wait for it again; each starts a new attempt
in the background when none is under way, until one answers with a snapshot. A snapshot that
fails because the kept connection was lost (a restarted server: :class:`ConnectionLost`) is
taken again at once on a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from lockdiag.core.findings import CheckPolicy
from lockdiag.core.incident import Incident
from lockdiag.core.model import Aggregated
from lockdiag.errors import LockdiagError
from lockdiag.evidence import Analysis, Looking, Reader, Reading, Target
from lockdiag.pg.session import ConnectionLost
from lockdiag.pg.timeout import DEFAULT_TIMEOUT
from lockdiag.views.check import check_metrics
from lockdiag.views.metrics import Metric, labelled, merged

MIN_READ_INTERVAL = 1.0  # seconds: scrapes closer than this to a target's read share it


@dataclass(eq=False)
class Scrape:
    """One snapshot of a target under way (or done), shared by the scrapes that wait for it."""

    started: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    report: Incident | None = None
    error: str | None = None
    seconds: float = 0.0
    finished: float = 0.0
    abandoned: bool = False  # a scrape gave up waiting for it


@dataclass
class TargetState:
    """One configured target, and what its scrapes said last."""

    target: Target
    scrape: threading.Lock = field(default_factory=threading.Lock)  # guards what follows
    report: Incident | None = None  # of the last scrape
    taken_at: float = 0.0  # time.monotonic() when that scrape's snapshot was taken
    seconds: float = 0.0  # how long it took
    error: str | None = None  # of the last scrape, or None
    down_since: float | None = None  # time.time() of the first failed scrape after a good one
    stalled: bool = False  # its last attempt missed its deadline: scrapes do not wait for it
    running: Scrape | None = None  # the snapshot under way: at most one at a time
    last: Scrape | None = None  # the last one done

    @property
    def name(self) -> str:
        """The target's label (never a password): /probe?target=NAME and the series' label."""
        return self.target.label


class Scraper:
    """The targets' snapshots for scrapes, and the series a scrape answers with."""

    def __init__(
        self,
        targets: list[Target],
        policy: CheckPolicy,
        looks: Mapping[str, Looking] | None = None,
        min_read_interval: float = MIN_READ_INTERVAL,
    ) -> None:
        self.targets = {target.label: TargetState(target) for target in targets}
        self.policy = policy
        # a scrape this soon after a target's last read is answered with it: every read
        # copies the whole lock table under the lock manager's locks, and scrapes come as
        # fast as anyone sends them (one client: 622 reads in 5s)
        self.min_read_interval = min_read_interval
        # when earlier looks (the samplers' reads, earlier scrapes) saw each lock held
        self.looks = looks
        # of a scrape: the session's own deadline for one statement (--timeout's, the same
        # for every target)
        timeouts = [target.timeout for target in targets] or [DEFAULT_TIMEOUT]
        self.deadline = max(timeout.deadline for timeout in timeouts)
        # the evidence every command reads: the registry's names, the poolers' consoles
        self.readers = {target.label: Reader(target) for target in targets}
        self.closing = threading.Event()

    def scrape(self, state: TargetState, asked: float) -> Scrape:
        """The snapshot of ``state``'s target that a scrape asked at ``asked`` waits for: the
        one under way if there is one (concurrent scrapes share it, and a stalled one is never
        joined by a second), else one done since ``asked`` or begun less than
        ``min_read_interval`` before it, else a new one in its own thread."""
        with state.scrape:
            if state.running is not None:
                return state.running
            last = state.last
            if last is not None and (
                last.finished >= asked or last.started > asked - self.min_read_interval
            ):
                return last
            run = state.running = Scrape(time.monotonic())
        thread = threading.Thread(
            target=self._take, args=(state, run), daemon=True, name=f"scrape {state.name}"
        )
        try:
            thread.start()
        except RuntimeError as error:  # no thread to be had: down, and never left "running"
            run.error = f"cannot start a scrape: {error}"
            self._finish(state, run)
        return run

    def _take(self, state: TargetState, run: Scrape) -> None:
        reader = self.readers[state.name]
        looks = self.looks.get(state.name) if self.looks is not None else None
        analysis = Analysis(self.policy.analysis_policy(), looks)
        try:
            # the retry on a fresh connection shares the scrape's budget
            with state.target.timeout.budget():
                reading = self._read(reader, analysis, run.started + self.deadline)
            run.report = reading.diagnosed().incident(self.policy)
        except LockdiagError as error:
            run.error = str(error).splitlines()[0]
        except Exception as error:  # a bug: reported, and the target is never left "running"
            run.error = f"internal error: {error!r}"
            raise
        finally:
            self._finish(state, run)
            if self.closing.is_set():
                reader.close()

    def _finish(self, state: TargetState, run: Scrape) -> None:
        run.finished = time.monotonic()
        run.seconds = run.finished - run.started
        with state.scrape:
            state.running, state.last = None, run
            state.report, state.error = run.report, run.error
            state.taken_at, state.seconds = run.finished, run.seconds
            state.down_since = _down_since(state.down_since, run.report is not None)
            # no answer in time: given up on, or failed only after the whole budget (a
            # connection that timed out, a statement that never came back)
            late = run.abandoned or run.seconds >= state.target.timeout.seconds
            state.stalled = run.report is None and late
        run.done.set()

    @staticmethod
    def _read(reader: Reader, analysis: Analysis, deadline: float) -> Reading:
        """One reading; once more at once on a fresh connection if the kept one was lost
        (the server restarted, the connection was terminated) and the deadline allows."""
        reading = reader.read(Aggregated(), analysis)
        if not isinstance(reading.error, ConnectionLost) or time.monotonic() >= deadline:
            return reading
        reader.close()
        return reader.read(Aggregated(), analysis)

    def metrics(self, names: list[str], within: float | None = None) -> list[Metric]:
        """Every series of these targets, each labelled ``target``. Waits for each target until
        the deadline at most (``within`` seconds, if sooner): one not done by then is down, and
        the answer goes without it. A stalled target is not waited for at all."""
        asked = time.monotonic()
        wait = self.deadline if within is None else min(self.deadline, max(0.0, within))
        deadline = asked + wait
        runs = [(self.targets[name], self.scrape(self.targets[name], asked)) for name in names]
        up = Metric("lockdiag_up", "Whether the target's last scrape read its server (1) or not.")
        took = Metric("lockdiag_scrape_duration_seconds", "How long the target's scrape took.")
        down = Metric(
            "lockdiag_down_seconds",
            "How long the target has been down, since its first failed scrape (0 while up).",
        )
        groups: list[list[Metric]] = [[up, took, down]]
        for state, run in runs:
            with state.scrape:
                waits = not state.stalled
            done = run.done.wait(max(0.0, deadline - time.monotonic()) if waits else 0.0)
            if done or not self._give_up(state, run, wait):
                report, seconds = run.report, run.seconds
            else:
                report, seconds = None, time.monotonic() - run.started
            with state.scrape:
                since = state.down_since
            up.add(1 if report is not None else 0, target=state.name)
            took.add(seconds, target=state.name)
            unreachable = time.time() - since if report is None and since is not None else 0.0
            down.add(max(0.0, unreachable), target=state.name)
            if report is not None:
                groups.append(labelled(check_metrics(report), "target", state.name))
        return merged(groups)

    @staticmethod
    def _give_up(state: TargetState, run: Scrape, wait: float) -> bool:
        """A scrape stops waiting for ``run``: the target is down and stalled until an attempt
        answers. False if ``run`` ended meanwhile (what it said stands)."""
        with state.scrape:
            if state.running is not run:
                return False
            if not state.stalled:
                state.error = f"timed out after {wait:g}s"
            run.abandoned = state.stalled = True
            state.report, state.seconds = None, time.monotonic() - run.started
            state.down_since = _down_since(state.down_since, False)
        return True

    def close(self) -> None:
        """Close the sessions; one still under way is closed by its own thread when it ends
        (never from here, while it is in use)."""
        self.closing.set()
        for state in self.targets.values():
            with state.scrape:
                busy = state.running is not None
            if not busy:
                self.readers[state.name].close()


def _down_since(since: float | None, up: bool) -> float | None:
    """When a target went down: kept while it stays down, cleared when it is up again."""
    return None if up else since or time.time()
