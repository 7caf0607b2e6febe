"""lockdiag on a real terminal: a pty of a chosen size, and the screen pyte draws from the
bytes the command wrote. One harness for every test of what a person sees."""

from __future__ import annotations

import functools
import io
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pexpect
import pyte

from helpers.cli import CLEAN_ENV, ctrl_c_reaches_child

# rich sizes its screen from COLUMNS/LINES before the terminal's own size: the pty decides
TERMINAL_ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


class Terminal(io.StringIO):
    """A stream that says it is a terminal: what ``render`` draws for a person, kept as text."""

    def isatty(self) -> bool:
        return True


def spawn(
    *args: str, size: tuple[int, int], cwd: Path | None = None, timeout: float = 30
) -> pexpect.spawn:
    """``lockdiag ARGS`` started on a pseudo-terminal of ``size`` (rows, columns), in ``cwd``,
    for a test that reads and types as it goes; ``timeout``: each expect's."""
    return pexpect.spawn(
        sys.executable, ["-m", "lockdiag", *args], cwd=None if cwd is None else str(cwd),
        dimensions=size, timeout=timeout, env=TERMINAL_ENV,
    )  # fmt: skip


def screen_of(
    args: Sequence[str],
    size: tuple[int, int],
    keys: str = "",
    codes: tuple[int, ...] = (0, 1),
    env: Mapping[str, str] = TERMINAL_ENV,
) -> list[str]:
    """The screen after ``lockdiag ARGS`` ran in a pty of ``size`` (rows, columns). With
    ``keys``, they are typed once the whole frame is drawn (its "q quit" footer); a frame
    that never draws one is typed into anyway, and fails on what it shows."""
    rows, columns = size
    child = pexpect.spawn(
        sys.executable, ["-m", "lockdiag", *args], dimensions=size, timeout=30,
        env={**env, "TERM": "xterm-256color"}, preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip
    screen = pyte.Screen(columns, rows)
    stream = pyte.ByteStream(screen)
    if keys:
        drawn = child.expect(["q quit", pexpect.TIMEOUT])
        stream.feed(child.before + (child.after if drawn == 0 else b""))
        child.send(keys)
    child.expect(pexpect.EOF)
    stream.feed(child.before)
    child.close()
    lines = [line.rstrip() for line in screen.display]
    assert child.exitstatus in codes, f"exit {child.exitstatus}:\n" + "\n".join(lines)
    return lines


@functools.cache
def screen_once(args: tuple[str, ...], size: tuple[int, int], keys: str = "") -> tuple[str, ...]:
    """``screen_of`` a command on a snapshot file, run once for each (args, size, keys) in the
    whole run (the file does not change): exit 0, 1 or 2 (check's WARNING and CRITICAL), none
    of the developer's settings."""
    return tuple(screen_of(args, size, keys, codes=(0, 1, 2), env=CLEAN_ENV))


def shown(screen: Sequence[str]) -> str:
    """A screen's lines as one text, for a failure's message."""
    return "\n".join(screen)
