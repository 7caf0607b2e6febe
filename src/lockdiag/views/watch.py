"""`lockdiag watch`: the state of the live view and the frame it draws.

Each refresh is one snapshot (:class:`lockdiag.pg.sampling.Feed`) and one Diagnosis. Between
refreshes the view remembers when each lock was first seen, so a granted lock shows how long it
has been *seen* held next to the snapshot's lower bound, and marks what appeared and went. The
terminal loop that draws frames and reads keys is :mod:`lockdiag.cli.screen`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lockdiag.core.analysis import Filters, LockEntry
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, CheckReport
from lockdiag.core.model import Snapshot
from lockdiag.core.observe import Tracker, identity
from lockdiag.registry import Registry
from lockdiag.render import Block, Text, clean, pick
from lockdiag.views.blockers import tree_lines
from lockdiag.views.columns import WATCH_COLUMNS, WatchRow, cells_of, table, watch_line
from lockdiag.views.common import lock_label

if TYPE_CHECKING:
    pass

CHECK = CheckPolicy()  # the findings a refresh shows: check's defaults
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
        diagnosis = Diagnosis(snapshot, self.registry, CHECK.analysis_policy())
        self.report = diagnosis.findings(CHECK)
        self.entries = diagnosis.advisory
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
        rows = [
            WatchRow(
                entry,
                snapshot.server,
                "+" if identity(entry) in state.tracker.appeared else " ",
                state.tracker.observed(entry, now) if state.tracker.refreshes > 1 else None,
            )
            for entry in shown
        ]
        cells = [cells_of(WATCH_COLUMNS, row) for row in rows]
        blocks.append(
            table(
                WATCH_COLUMNS,
                cells,
                important=important,
                empty="no advisory locks",
                left_out=left_out,
                compact=lambda i: watch_line(rows[i]),
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
