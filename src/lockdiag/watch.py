"""`lockdiag watch`: a live view that refreshes, like top.

Each refresh is one snapshot on one connection (reopened after a failure). Between refreshes
the view remembers when each lock was first seen, so a granted lock shows how long it has been
*seen* held next to the snapshot's lower bound, and marks what appeared and went.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from lockdiag.analysis import Filters, LockEntry
from lockdiag.durations import format_duration
from lockdiag.errors import InputError, LockdiagError, ServerError
from lockdiag.findings import CheckReport, check
from lockdiag.observe import Tracker, collect_now_and_then, identity
from lockdiag.registry import Registry
from lockdiag.render import Block, Table, Text, clean, pick
from lockdiag.snapshot import Snapshot
from lockdiag.views import age, lock_label, relation
from lockdiag.views_alerts import tree_lines

if TYPE_CHECKING:
    import psycopg

HELP = "q quit · p pause · n namespace · i pid · c clear filters"


@dataclass
class State:
    """What the view shows and what the user asked for."""

    registry: Registry
    tracker: Tracker = field(default_factory=Tracker)
    snapshot: Snapshot | None = None
    report: CheckReport | None = None  # findings and wait graph of the last snapshot
    entries: list[LockEntry] = field(default_factory=list)  # its advisory locks
    paused: bool = False
    namespace: str | None = None
    pid: int | None = None
    prompt: str | None = None  # "namespace" or "pid" while the user types
    typed: str = ""
    error: str | None = None
    cost: float = 0.0
    source: str = ""
    refreshes: int = 0

    def take(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        # one analysis a refresh, not one per redraw: check() analyses every lock type and
        # builds the wait graph; the advisory rows of the same analysis fill the table
        self.report = check(snapshot, self.registry)
        self.entries = [e for e in self.report.entries if e.lock.locktype == "advisory"]
        self.tracker.update(self.entries, snapshot.server.now)
        self.cost = snapshot.query_seconds
        self.source = snapshot.source
        self.refreshes += 1
        self.error = None

    def shows(self, entry: LockEntry | None, pid: int | None) -> bool:
        """Whether a finding belongs to what the user narrowed the view to."""
        if self.pid is not None and pid != self.pid:
            return False
        if self.namespace is not None:
            namespace = entry.decoded.namespace if entry and entry.decoded else None
            return namespace is not None and namespace.name == self.namespace
        return True

    def filters(self) -> Filters:
        namespace = self.registry.namespaces.get(self.namespace) if self.namespace else None
        return Filters(namespace=namespace, pids=frozenset({self.pid} if self.pid else ()))

    def key(self, pressed: str) -> bool:
        """Handle one key; False means quit."""
        if self.prompt is not None:
            if pressed in ("\r", "\n"):
                self._apply_prompt()
            elif pressed == "\x1b":
                self.prompt, self.typed = None, ""
            elif pressed in ("\x7f", "\b"):
                self.typed = self.typed[:-1]
            elif pressed.isprintable():
                self.typed += pressed
            return True
        if pressed in ("q", "Q", "\x03"):
            return False
        if pressed == "p":
            self.paused = not self.paused
        elif pressed == "n":
            self.prompt, self.typed = "namespace", ""
        elif pressed == "i":
            self.prompt, self.typed = "pid", ""
        elif pressed == "c":
            self.namespace, self.pid = None, None
        return True

    def _apply_prompt(self) -> None:
        text = self.typed.strip()
        if self.prompt == "namespace":
            if text and text not in self.registry.namespaces:
                self.error = f"unknown namespace {text!r}"
            else:
                self.namespace = text or None
        elif self.prompt == "pid":
            if text and not text.isdigit():
                self.error = f"not a pid: {text!r}"
            else:
                self.pid = int(text) if text else None
        self.prompt, self.typed = None, ""


def frame(state: State, screen: int | None = None) -> list[Block]:
    """Findings first, then root blockers, then holders and waiters. ``screen``: the height of
    the screen it is for; findings and chains then take a quarter of it each, and no more lock
    rows are built than it has (waiting and flagged ones first; the table says how many it
    left out). None: everything, as text."""
    snapshot = state.snapshot
    status = "paused" if state.paused else f"refresh #{state.refreshes}"
    narrowed = [f"namespace {state.namespace}"] if state.namespace else []
    narrowed += [f"pid {state.pid}"] if state.pid else []
    header = f"lockdiag watch · {clean(state.source) or 'connecting'} · {status}"
    if narrowed:
        header += " · only " + ", ".join(narrowed)
    blocks: list[Block] = [Text([header], "verdict")]
    if snapshot is not None and state.report is not None:
        now = snapshot.server.now
        # findings and chains take at most a quarter of the screen each: the lock table and
        # the footer (keys, errors) must stay on it
        most = max(3, screen // 4) if screen is not None else 8
        findings = [f for f in state.report.findings if state.shows(f.entry, f.pid)]
        lines = [
            f"{f.severity.upper()} {f.kind}: {clean(f.lock)} · {clean(f.evidence)}"
            for f in findings[:most]
        ]
        if len(findings) > most:
            lines.append(f"... {len(findings) - most} more (lockdiag check)")
        blocks.append(Text(lines or ["no findings"], "error" if findings else "plain"))
        graph = state.report.graph
        chains: list[str] = []
        for root in graph.roots[:3]:
            chains += tree_lines(root.tree, graph)
        chains += [f"cycle: {' → '.join(map(str, c))}" for c in graph.cycles]
        if screen is not None and len(chains) > most:
            chains = [*chains[:most], f"... {len(chains) - most} more lines (lockdiag blockers)"]
        if chains:
            blocks.append(Text(chains))
        filters = state.filters()
        shown = [e for e in state.entries if filters.accept(e)]
        important = [bool(e.flags or e.blocks or not e.lock.granted) for e in shown]
        left_out = 0
        if screen is not None and len(shown) > screen:
            chosen = pick(important, screen)
            left_out = len(shown) - len(chosen)
            shown, important = [shown[i] for i in chosen], [important[i] for i in chosen]
        cells = []
        for entry in shown:
            seen = state.tracker.observed(entry, now)
            mark = "+" if identity(entry) in state.tracker.appeared else " "
            session = entry.session
            cells.append(
                [
                    mark,
                    lock_label(entry, snapshot.server),
                    "held" if entry.lock.granted else "WAITING",
                    str(entry.lock.pid),
                    clean(session.application_name) if session else "",
                    clean(session.state) if session else "",
                    entry.lifetime or "",
                    age(entry),
                    f"seen {format_duration(seen)}" if seen and state.tracker.refreshes > 1 else "",
                    relation(entry),
                    ",".join(entry.flags),
                ]
            )
        blocks.append(
            Table(
                [
                    "",
                    "LOCK",
                    "STATUS",
                    "PID",
                    "APPLICATION",
                    "STATE",
                    "LIFETIME",
                    "AGE",
                    "SEEN",
                    "WAITS/BLOCKS",
                    "FLAGS",
                ],
                cells,
                important=important,
                wide={1, 4, 9},
                optional=[6, 5, 4],
                empty="no advisory locks",
                left_out=left_out,
            )
        )
        gone = state.tracker.gone
        if gone:
            labels = ", ".join(
                f"{lock_label(e, snapshot.server)} (pid {e.lock.pid})" for e in gone[:5]
            )
            blocks.append(Text([f"- gone since the last refresh: {labels}"], "note"))
    footer = HELP if state.prompt is None else f"{state.prompt}: {clean(state.typed)}_"
    footer += f" · refresh cost {state.cost * 1000:.1f} ms"
    if state.error:
        footer += f" · {clean(state.error)}"
    blocks.append(Text([footer], "note"))
    return blocks


# -- the live loop -----------------------------------------------------------------------------


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


def read_key(stream: TextIO, timeout: float) -> str | None:
    ready, _, _ = select.select([stream], [], [], max(0.0, timeout))
    return os.read(stream.fileno(), 1).decode(errors="replace") if ready else None


class Feed:
    """Snapshots from a server (one connection, reopened after a failure) or a recording."""

    def __init__(
        self, dsn: str | None, timeout: float, replay: Path | None, record: Path | None
    ) -> None:
        self.dsn, self.timeout, self.record = dsn, timeout, record
        self.connection: psycopg.Connection[Any] | None = None
        self.recorded: list[str] = []
        if replay is not None:
            try:
                self.recorded = [line for line in replay.read_text().splitlines() if line.strip()]
            except OSError as error:
                raise InputError(f"cannot read {replay}: {error.strerror or error}") from None
            if not self.recorded:
                raise InputError(f"{replay} holds no snapshot")
        self.replaying = replay is not None
        self.position = 0
        self.replay_name = str(replay)

    def next(self) -> Snapshot:
        from lockdiag import snapshot

        if self.replaying:
            line = self.recorded[min(self.position, len(self.recorded) - 1)]
            self.position += 1
            return snapshot.loads(line, f"{self.replay_name}:{self.position}")
        from lockdiag.connect import connect, describe, server_errors

        if self.connection is None or self.connection.closed:
            self.connection = connect(self.dsn, self.timeout)
        try:
            with server_errors(self.dsn, self.timeout):
                taken = snapshot.capture(self.connection, describe(self.connection), "all")
        except LockdiagError:
            self.close()
            raise
        if self.record is not None:
            with self.record.open("a", encoding="utf-8") as out:
                out.write(json.dumps(json.loads(snapshot.dumps(taken)), separators=(",", ":")))
                out.write("\n")
        return taken

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def run(
    state: State, source: Feed, interval: float, once: bool, stream: TextIO | None = None
) -> None:
    from lockdiag.render import plain, rich_renderables

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
        from rich.console import Console, Group
        from rich.live import Live

        console = Console(file=stream)
        with keyboard(sys.stdin), Live(console=console, screen=True, auto_refresh=False) as live:
            next_refresh, refreshes = 0.0, 0
            while True:
                if not state.paused and time.monotonic() >= next_refresh:
                    next_refresh, refreshes = time.monotonic() + interval, refreshes + 1
                    collect_now_and_then(refreshes)
                    try:
                        state.take(source.next())
                    except ServerError as error:  # bad input (a broken recording) still stops
                        state.error = f"connection lost, retrying: {str(error).splitlines()[0]}"
                shown = frame(state, console.height)  # never more rows than the screen
                live.update(Group(*rich_renderables(shown, console)), refresh=True)
                wait = interval if state.paused else max(0.05, next_refresh - time.monotonic())
                pressed = read_key(sys.stdin, wait)
                if pressed is not None and not state.key(pressed):
                    return
    finally:
        source.close()
