"""The terminal side of `lockdiag watch`: keys without Enter, frames redrawn in place.

The frame itself is a view (:mod:`lockdiag.views.watch`); this loop gives it the screen's
height, reads keys and refreshes the feed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
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

from lockdiag.core.observe import collect_now_and_then
from lockdiag.errors import InputError, ServerError
from lockdiag.pg.sampling import Feed
from lockdiag.render import plain, rich_renderables
from lockdiag.views.watch import State, frame


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


def read_key(stream: TextIO, timeout: float, resized: int) -> str | None:
    """One key, "" when the terminal was resized, None when ``timeout`` passed first."""
    keys = stream.fileno()
    ready, _, _ = select.select([keys, resized], [], [], max(0.0, timeout))
    if resized in ready:
        with contextlib.suppress(BlockingIOError):
            os.read(resized, 64)
        return ""
    return os.read(keys, 1).decode(errors="replace") if keys in ready else None


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
    columns = (TextColumn("sampling"), BarColumn(), TextColumn("{task.completed:.0f} samples"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("sample", total=max(1, int(duration / interval)))

        def advance(done: int, expected: int) -> None:
            bar.update(task, completed=done, total=expected)

        yield advance


def run(
    state: State, source: Feed, interval: float, once: bool, stream: TextIO | None = None
) -> None:
    """Draw frames until q: a refresh every ``interval``, a redraw at every key."""
    stream = stream or sys.stdout
    try:
        if once:
            state.take(source.next())
            stream.write(plain(frame(state)))
            return
        if not (stream.isatty() and sys.stdin.isatty()):
            raise InputError(
                "watch needs a terminal; use --once for a single frame, or lockdiag list"
            )
        console = Console(file=stream)
        live = Live(console=console, screen=True, auto_refresh=False)
        with keyboard(sys.stdin), resizes() as resized, live:
            next_refresh, refreshes = 0.0, 0
            while True:
                if not state.paused and time.monotonic() >= next_refresh:
                    next_refresh, refreshes = time.monotonic() + interval, refreshes + 1
                    collect_now_and_then(refreshes)
                    try:
                        state.take(source.next())
                    except ServerError as error:  # bad input (a broken recording) still stops
                        state.failed(str(error).splitlines()[0])
                shown = frame(state, console.height)  # never more rows than the screen
                live.update(Group(*rich_renderables(shown, console)), refresh=True)
                wait = interval if state.paused else max(0.05, next_refresh - time.monotonic())
                pressed = read_key(sys.stdin, wait, resized)
                if pressed and not state.key(pressed):
                    return
    finally:
        source.close()
