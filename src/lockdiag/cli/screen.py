"""The terminal side of `lockdiag watch`: keys without Enter, frames redrawn in place.

The frame itself is a view (:mod:`lockdiag.views.watch`); this loop gives it the screen's
height, reads keys and asks a background thread for each refresh, so that it answers keys at
once whatever the server does.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from typing import TextIO

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.styled import Styled

from lockdiag import plugins
from lockdiag.core.pacing import collect_now_and_then
from lockdiag.errors import InputError, ServerError
from lockdiag.evidence import Reading
from lockdiag.evidence.paced import Feed
from lockdiag.render import plain, rich_renderables
from lockdiag.views.watch import State, frame

FIRST_FRAME_WAIT = 1.0  # seconds the first frame waits for the first snapshot
# a refresh that did not read (the backends unchanged), and the clocks of a pause or of a read
# under way, redraw only a frame that costs less than this share of the interval to build (at
# 100k locks a frame takes most of a second); the view's work counts in the reads' duty cycle
REDRAW_SHARE = 0.05
LATE = 1.0  # seconds a refresh may take before the frame says it is late


@contextlib.contextmanager
def keyboard(stream: TextIO) -> Iterator[None]:
    """Keys without Enter and without echo, restored however the view ends."""
    descriptor = stream.fileno()
    saved = termios.tcgetattr(descriptor)
    try:
        tty.setcbreak(descriptor)
        yield
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def resizes() -> Iterator[int]:
    """A descriptor that becomes readable when the terminal is resized (SIGWINCH), so the
    frame is redrawn for the new size at once, not at the next refresh."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)

    def wake(signum: int, frame: object) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, b"r")

    previous = signal.signal(signal.SIGWINCH, wake)
    try:
        yield read_end
    finally:
        signal.signal(signal.SIGWINCH, previous)
        os.close(read_end)
        os.close(write_end)


def read_key(stream: TextIO, timeout: float, resized: int, woken: int | None = None) -> str | None:
    """One key, "" when the terminal was resized, None when ``timeout`` passed first or
    ``woken`` became readable."""
    keys = stream.fileno()
    watched = [keys, resized] if woken is None else [keys, resized, woken]
    ready, _, _ = select.select(watched, [], [], max(0.0, timeout))
    if keys in ready:
        return os.read(keys, 1).decode(errors="replace")
    if resized in ready:
        with contextlib.suppress(BlockingIOError):
            os.read(resized, 64)
        return ""
    return None


@contextlib.contextmanager
def progress_reporter(duration: float, interval: float) -> Iterator[Callable[[int, int], None]]:
    """How `sample` reports its progress on stderr: a bar with the time elapsed and remaining
    on a terminal, a line every tenth of the way otherwise (logs stay readable)."""
    if not sys.stderr.isatty():

        def lines(done: int, expected: int) -> None:
            if done % max(1, expected // 10) == 0:
                click.echo(f"sampling: {done}/{expected}", err=True)

        yield lines
        return
    columns = (
        TextColumn("sampling"),
        BarColumn(),
        TextColumn("{task.completed:.0f} samples"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("sample", total=max(1, int(duration / interval)))

        def advance(done: int, expected: int) -> None:
            bar.update(task, completed=done, total=expected)

        yield advance


class Unchanged:
    """A refresh that found the backends as they were at the last read: that frame holds."""


UNCHANGED = Unchanged()


class Refresher:
    """Readings taken off the UI thread, so the key loop never waits for the server: the
    feed's loop in a thread, a tick each time :meth:`ask` asks, handed back by :meth:`result`;
    ``wake`` becomes readable when one is ready. Each read is bounded by the session's
    deadline."""

    def __init__(self, source: Feed) -> None:
        self.source = source
        self.asked = threading.Event()
        self.stopping = False
        self.lock = threading.Lock()
        self.ready: list[Reading | Unchanged | BaseException] = []
        self.busy_since: float | None = None  # time.monotonic() of the refresh under way
        self.wake, self._signal = os.pipe()
        os.set_blocking(self.wake, False)
        os.set_blocking(self._signal, False)
        self.thread = threading.Thread(target=self._run, daemon=True, name="watch refresh")
        self.thread.start()

    def ask(self) -> None:
        """Take a snapshot now, unless one is under way."""
        with self.lock:
            if self.busy_since is None:
                self.busy_since = time.monotonic()
                self.asked.set()

    def result(self) -> Reading | Unchanged | BaseException | None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake, 64)
        with self.lock:
            return self.ready.pop(0) if self.ready else None

    def _run(self) -> None:
        try:  # the UI sets the pace: a tick when asked
            self.source.run(self._hand, self._asked, interval=0.0)
        except BaseException as error:  # a bug: handed to the UI thread, which raises it
            self._hand_over(error)

    def _asked(self, _: float) -> bool:
        self.asked.wait()
        self.asked.clear()
        return not self.stopping

    def _hand(self, reading: Reading | None, _: float) -> None:
        """A tick's outcome, for the UI thread: a reading, UNCHANGED, or its error (which the
        UI thread decides on: a server's error is a banner, bad input stops)."""
        if reading is None:
            self._hand_over(UNCHANGED)
        else:
            self._hand_over(reading.error if reading.error is not None else reading)

    def _hand_over(self, taken: Reading | Unchanged | BaseException) -> None:
        with self.lock:
            self.ready.append(taken)
            self.busy_since = None
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._signal, b"r")

    def stop(self) -> None:
        """The snapshot under way gives up at once; the feed is closed once it has."""
        self.stopping = True
        self.asked.set()
        self.source.interrupt()
        self.thread.join(0.5)
        if not self.thread.is_alive():  # else it is stuck connecting: the process exits anyway
            self.source.close()
            os.close(self.wake)
            os.close(self._signal)


def run(
    state: State, source: Feed, interval: float, once: bool, stream: TextIO | None = None
) -> None:
    """Draw frames until q: a refresh every ``interval``, a redraw at every key. Snapshots
    are taken off this thread: q answers at once whatever the server does."""
    stream = stream or sys.stdout
    if once:
        try:
            taken = source.tick()  # the first refresh reads
            assert taken is not None
            state.take(taken.diagnosed())
            stream.write(plain(frame(state, keys=False)))  # printed once: no keys to offer
        finally:
            source.close()
        return
    if not (stream.isatty() and sys.stdin.isatty()):
        source.close()
        raise InputError("watch needs a terminal; use --once for a single frame, or lockdiag list")
    told: list[str] = []
    notices: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if source.reads_server:  # a server's notices (a recording imports no driver)
        from lockdiag.pg.session import notices_to

        notices = notices_to(told.append)
    refresher = Refresher(source)
    try:
        with notices, plugins.problems_to(told.append):
            _loop(state, refresher, interval, stream, told)
    finally:
        refresher.stop()
        for message in told:
            click.echo(f"lockdiag: warning: {message}", err=True)


def _take(state: State, refresher: Refresher, cheap: bool) -> bool:
    """Hand the refresh that is ready, if any, to the view: whether to redraw (a refresh that
    did not read redraws only a ``cheap`` frame)."""
    taken = refresher.result()
    if isinstance(taken, ServerError):
        state.failed(str(taken).splitlines()[0])
        return True
    if isinstance(taken, BaseException):  # bad input (a broken recording) stops
        raise taken
    if taken is None or state.paused:
        return False
    pacer = refresher.source.pacer
    if isinstance(taken, Unchanged):
        state.unchanged(pacer.interval)
        return cheap
    began = time.monotonic()
    state.take(taken.diagnosed(), pacer.interval)
    pacer.spent(time.monotonic() - began)  # the view's work counts in the duty cycle
    return True


def _loop(
    state: State, refresher: Refresher, interval: float, stream: TextIO, told: list[str]
) -> None:
    console = Console(file=stream)
    live = Live(console=console, screen=True, auto_refresh=False)
    with keyboard(sys.stdin), resizes() as resized, live:
        next_refresh, refreshes, shown_notices = 0.0, 0, 0
        first = time.monotonic() + FIRST_FRAME_WAIT
        changed = True  # what is on screen is out of date
        drawing = 0.0  # seconds the last frame took to build
        while True:
            now = time.monotonic()
            if not state.paused and now >= next_refresh and refresher.busy_since is None:
                next_refresh, refreshes = now + interval, refreshes + 1
                collect_now_and_then(refreshes)
                refresher.ask()
            cheap = drawing <= REDRAW_SHARE * interval
            changed = _take(state, refresher, cheap) or changed
            if len(told) > shown_notices:
                shown_notices, changed = len(told), True
                state.message = told[-1]  # shown until the next key, printed again at exit
            busy = refresher.busy_since
            late = busy if busy is not None and time.monotonic() - busy > LATE else None
            changed = changed or late != state.late_since
            state.late_since = late
            # the first frame waits a moment for the first snapshot (keys are read meanwhile)
            if changed and (state.refreshes or state.lost or time.monotonic() >= first):
                began = time.monotonic()
                shown = frame(state, console.height, console.width)  # rows and wraps to fit it
                drawing = time.monotonic() - began
                refresher.source.pacer.spent(drawing)
                drawn = Group(*rich_renderables(shown, console))
                # a frame that may no longer be true is dimmed (it says its age)
                live.update(Styled(drawn, "dim") if state.stale else drawn, refresh=True)
                changed = False
            if busy is not None:  # the wait ends with its snapshot; redrawn each second meanwhile
                wait = 1.0
            elif state.paused:
                wait = interval
            else:
                wait = max(0.05, next_refresh - time.monotonic())
            pressed = read_key(sys.stdin, wait, resized, refresher.wake)
            if pressed is None:  # a snapshot is ready, or time passed: clocks on screen move
                changed = changed or ((busy is not None or state.paused) and cheap)
            elif pressed == "":  # resized
                changed = True
            elif not state.key(pressed):
                return
            else:
                changed = True
