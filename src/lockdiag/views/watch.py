"""`lockdiag watch`: the state of the live view and the frame it draws.

Each refresh that reads is one snapshot and its one Diagnosis (a reading of
:mod:`lockdiag.evidence.paced`, analysed under :data:`CHECK`'s thresholds and dated by the looks
of the reads before). Between refreshes the view remembers when each lock was first seen, so a
granted lock shows how long it has been *seen* held next to the snapshot's lower bound, and
marks what appeared and went. The
terminal loop that draws frames and reads keys is :mod:`lockdiag.cli.screen`'s.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from lockdiag.core.analysis import Filters, Flag, LockEntry
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy, CheckReport, Finding
from lockdiag.core.graph import Blockers, Root
from lockdiag.core.incident import Cause, Incident
from lockdiag.core.model import Snapshot
from lockdiag.core.observe import Tracker, identity
from lockdiag.durations import format_duration
from lockdiag.registry import Registry
from lockdiag.render import (
    DETAIL,
    STEP,
    VERDICT,
    Block,
    More,
    Text,
    clean,
    fit_screen,
    pick,
)
from lockdiag.views.blockers import (
    TreeRow,
    chain_lines,
    fit_chains,
    ordered_roots,
    root_heading,
)
from lockdiag.views.check import Style, cause_heading, finding_heading
from lockdiag.views.columns import (
    WATCH_COLUMNS,
    ListRow,
    WatchRow,
    cells_of,
    table,
    watch_line,
)
from lockdiag.views.common import lock_label
from lockdiag.views.listing import URGENT, by_urgency, fold

if TYPE_CHECKING:
    pass

CHECK = CheckPolicy()  # the findings a refresh shows: check's defaults
HELP = "q quit · p pause · n namespace · i pid · c clear"
CAUSES = "causes"  # the frame's group of cause lines (render.More)
MORE_CAUSES = "… {n} more cause(s) not shown (lockdiag check lists every one)"
MORE_ROWS = "n namespace or i pid narrows the table"  # watch's own keys, not list's options


@dataclass
class State:
    """What the view shows and what the user asked for."""

    registry: Registry
    tracker: Tracker = field(default_factory=Tracker)
    snapshot: Snapshot | None = None
    incident: Incident | None = None  # causes, findings and wait graph of the last snapshot
    entries: list[LockEntry] = field(default_factory=list)  # its advisory locks
    paused: bool = False
    namespace: str | None = None
    pid: int | None = None
    prompt: str | None = None  # "namespace" or "pid" while the user types
    typed: str = ""
    message: str | None = None  # about the last key: stays until the next one
    lost: str | None = None  # why the last refresh failed; None while refreshes succeed
    lost_at: float | None = None  # time.monotonic() of the first failure in a row
    paused_at: float | None = None
    late_since: float | None = None  # time.monotonic() a refresh was asked, while it is overdue
    cost: float = 0.0
    source: str = ""
    refreshes: int = 0
    taken_at: float | None = None  # time.monotonic() the last snapshot was taken in
    read_every: float | None = None  # seconds between reads of the lock table, achieved
    repeated: int = 0  # refreshes since the last read that found the backends unchanged

    @property
    def report(self) -> CheckReport | None:
        return self.incident.report if self.incident is not None else None

    @property
    def stale(self) -> bool:
        """Whether the frame may no longer be true: the last refresh failed or is late."""
        return self.snapshot is not None and (self.lost is not None or self.late_since is not None)

    def age(self) -> str:
        """``frame of 14:03:07, 42s old``."""
        if self.snapshot is None:
            return "no frame yet"
        old = time.monotonic() - (self.taken_at or time.monotonic())
        return f"frame of {self.snapshot.server.now:%H:%M:%S}, {format_duration(old)} old"

    def take(self, diagnosis: Diagnosis, read_every: float | None = None) -> None:
        """A refresh that read the lock table, analysed once (under CHECK's thresholds: its
        --session-age and max_hold judge the longer of the state bound and the time seen
        held); ``read_every``: the reads' achieved interval."""
        snapshot = self.snapshot = diagnosis.snapshot
        # one analysis a refresh, not one per redraw: check() analyses every lock type and
        # builds the wait graph; the advisory rows of the same analysis fill the table
        self.incident = diagnosis.incident(CHECK)
        self.taken_at = time.monotonic()
        self.entries = diagnosis.advisory
        self.tracker.update(self.entries, snapshot.server.now)
        self.cost = snapshot.query_seconds
        self.source = snapshot.source
        self.refreshes += 1
        self.lost, self.lost_at = None, None
        self.read_every, self.repeated = read_every, 0

    def unchanged(self, read_every: float | None = None) -> None:
        """A refresh that found the backends as they were at the last read: its frame holds
        (the lock table is read again when they change, or that read grows old)."""
        self.refreshes += 1
        self.lost, self.lost_at = None, None
        self.read_every, self.repeated = read_every, self.repeated + 1

    def failed(self, reason: str) -> None:
        """A refresh failed: the frame stays, under a banner that says since when."""
        self.lost = reason
        self.lost_at = self.lost_at or time.monotonic()

    def shows(self, entry: LockEntry | None, pid: int | None) -> bool:
        """Whether a finding belongs to what the user narrowed the view to."""
        if self.pid is not None and pid != self.pid:
            return False
        if self.namespace is not None:
            namespace = entry.decoded.namespace if entry and entry.decoded else None
            return namespace is not None and namespace.name == self.namespace
        return True

    def shows_cause(self, cause: Cause, graph: Blockers) -> bool:
        """Whether a cause belongs to what the user narrowed the view to: the pid is it or in
        its chain; a lock of the namespace is the one others wait for, or its findings'."""
        outside = cause.root is None or not graph.holds_up(cause.root.pid, self.pid or 0)
        if self.pid is not None and self.pid != cause.pid and outside:
            return False
        if self.namespace is None:
            return True
        entries = [c.entry for c in cause.contended] + [cause.entry]
        entries += [f.entry for f in cause.findings]
        return any(self._in_namespace(e) for e in entries)

    def _in_namespace(self, entry: LockEntry | None) -> bool:
        namespace = entry.decoded.namespace if entry and entry.decoded else None
        return namespace is not None and namespace.name == self.namespace

    def chains_shown(self, graph: Blockers) -> Callable[[Root], bool]:
        """Whether a wait chain belongs to what the user narrowed the view to: the pid is in
        it, or a lock of the namespace is held or awaited in it (the sessions of the
        namespace found once, each chain asked about them as a set)."""
        pid, namespace = self.pid, self.namespace
        named = {
            p
            for p, node in (graph.nodes.items() if namespace is not None else ())
            if any(self._in_namespace(e) for e in [*node.holds, node.waits])
        }
        among = graph.selection(named)

        def shown(root: Root) -> bool:
            if pid is not None and pid != root.pid and not graph.holds_up(root.pid, pid):
                return False
            if namespace is None:
                return True
            return root.pid in named or graph.count_behind(root.pid, among) > 0

        return shown

    def filters(self) -> Filters:
        namespace = self.registry.namespaces.get(self.namespace) if self.namespace else None
        return Filters(namespace=namespace, pids=frozenset({self.pid} if self.pid else ()))

    def key(self, pressed: str) -> bool:
        """Handle one key; False means quit."""
        self.message = None
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
            self.paused_at = time.monotonic() if self.paused else None
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
                close = difflib.get_close_matches(text, list(self.registry.namespaces), 1)
                hint = f"; did you mean {close[0]}?" if close else "; n then Enter shows all"
                self.message = f"unknown namespace {text!r}{hint}"
            else:
                self.namespace = text or None
        elif self.prompt == "pid":
            if text and not text.isdigit():
                self.message = f"not a pid: {text!r} (digits only)"
            else:
                self.pid = int(text) if text else None
        self.prompt, self.typed = None, ""


def frame(
    state: State, screen: int | None = None, columns: int = 0, keys: bool = True
) -> list[Block]:
    """A banner when the connection is lost, findings first (causes before symptoms), then
    root blockers, then holders and waiters in the incident's order. ``screen``: the height of
    the screen it is for; findings and chains then take a quarter of it each, and no more lock
    rows are built than it has (the table says how many it left out). None: everything, as
    text. ``columns``: its width, which chain lines wrap at (under the tree's indent, as in
    `blockers`); 0: unwrapped. ``keys``: the footer of the keys a live screen takes (not for
    `watch --once`, which takes none)."""
    snapshot = state.snapshot
    blocks: list[Block] = []
    if state.lost is not None:
        since = format_duration(time.monotonic() - (state.lost_at or time.monotonic()))
        shown_at = f"{snapshot.server.now:%H:%M:%S}" if snapshot else "none yet"
        lost = f"connection lost {since} ago — showing the frame of {shown_at}; retrying: "
        blocks.append(Text([lost + clean(state.lost)], "critical", VERDICT))
    if state.late_since is not None:
        waited = format_duration(time.monotonic() - state.late_since)
        blocks.append(
            Text([f"refresh late: no answer from the server for {waited}"], "warning", VERDICT)
        )
    if state.stale:  # the screen draws it dimmed: what follows may no longer be true
        why = "failed" if state.lost is not None else "is late"
        blocks.append(Text([f"stale: {state.age()} (the last refresh {why})"], "note", VERDICT))
    if state.paused:
        status = f"paused {format_duration(time.monotonic() - (state.paused_at or 0.0))}"
    else:
        status = f"refresh #{state.refreshes}"
        if state.repeated and state.taken_at is not None:  # the backends unchanged since
            status += f" (read {format_duration(time.monotonic() - state.taken_at)} ago)"
    narrowed = [f"namespace {state.namespace}"] if state.namespace else []
    narrowed += [f"pid {state.pid}"] if state.pid else []
    header = f"lockdiag watch · {clean(state.source) or 'connecting'} · {status}"
    if narrowed:
        header += " · only " + ", ".join(narrowed)
    blocks.append(Text([header], "verdict", VERDICT))
    more: dict[str, More] = {}
    if snapshot is not None and state.incident is not None:
        found, more[CAUSES] = _findings_and_chains(state, screen, columns)
        blocks += found
        blocks += _lock_table(state, snapshot, screen)
    if keys:  # a live screen: the keys it takes, a read's cost and how often one is made
        footer = HELP if state.prompt is None else f"{state.prompt}: {clean(state.typed)}_"
        footer += f" · {state.cost * 1000:.1f} ms"
        footer += f", every {format_duration(state.read_every)}" if state.read_every else ""
        blocks.append(Text([footer], "note", VERDICT))
    if state.message:
        blocks.append(Text([clean(state.message)], "warning", VERDICT))
    # what does not fit gives way: warnings and details, then lock rows, then the critical
    # causes' lines; the causes left out are counted as the rows are
    if screen and columns:
        return fit_screen(blocks, columns, screen, cut=None, more=more)
    if CAUSES in more and more[CAUSES].before:  # capped by the view itself
        return [*blocks, Text([more[CAUSES].template.format(n=more[CAUSES].before)], "note")]
    return blocks


def _findings_and_chains(
    state: State, screen: int | None, columns: int
) -> tuple[list[Block], More]:
    """The causes in the incident's order, each by its `check` heading, then every root's
    chain under its heading: on a screen, causes and chain lines take at most a quarter of it
    each (the lock table and the footer must stay on it); every root's heading stays, the rest
    of a chain is counted. The causes are one group for the screen (More): a critical one
    stays longer than the lock rows, a warning gives way before them, and what the screen and
    the cap leave out is counted, with where to see it."""
    incident = state.incident
    assert incident is not None
    most = max(3, screen // 4) if screen is not None else None
    graph = incident.report.graph
    causes = [c for c in incident.alerting if state.shows_cause(c, graph)]
    unattached = [f for f in incident.unattached if state.shows(f.entry, f.pid)]
    lines: list[tuple[str, Style]] = [_cause_line(c) for c in causes]
    lines += [_unattached_line(f) for f in unattached]
    blocks: list[Block] = []
    shown = lines if most is None else lines[:most]
    # the worst cause's line (its impact and next step) and every critical one stay longest;
    # lines wrap, whole
    blocks += [
        Text([text], style, STEP if not n or style == "critical" else DETAIL, CAUSES)
        for n, (text, style) in enumerate(shown)
    ]
    more = More(MORE_CAUSES, before=len(lines) - len(shown))
    if not lines:
        blocks.append(Text(["no findings"]))
    kept = {c.pid for c in causes}
    in_view = state.chains_shown(graph)
    roots = [
        c
        for c in ordered_roots(incident)
        if c.pid in kept or (c.root is not None and in_view(c.root))
    ]
    cycles = [f"cycle: {' → '.join(map(str, c))}" for c in graph.cycles]
    if state.pid is not None or state.namespace is not None:
        cycles = []
    return blocks + _chain_lines(roots, graph, cycles, columns, most), more


def _chain_lines(
    roots: list[Cause], graph: Blockers, cycles: list[str], columns: int, most: int | None
) -> list[Block]:
    """Each root's heading and chain, wrapped and fitted to ``most`` lines as `blockers`
    fits them (:func:`fit_chains`), then the cycles. Every root's heading stays on screen."""
    chains = [
        chain_lines(root_heading(number, cause), cause.root, graph, columns)
        for number, cause in enumerate(roots, start=1)
        if cause.root is not None
    ]
    ends = [line for cycle in cycles for line in TreeRow("", cycle, "  ").wrapped(columns)]
    fitted, _ = fit_chains(chains, None if most is None else most - len(ends))
    out: list[Block] = []
    for heading, shown in fitted:
        out += [Text(heading, rank=VERDICT), Text(shown, rank=STEP)]  # before lock rows
    return [*out, Text(ends, rank=VERDICT)] if ends else out


def _cause_line(cause: Cause) -> tuple[str, Style]:
    heading, style = cause_heading(cause)
    owner = f" · owner done: {cause.owner.level}" if cause.owner else ""
    return f"{heading} · {cause.impact or clean(cause.evidence)}{owner}", style


def _unattached_line(finding: Finding) -> tuple[str, Style]:
    heading, style = finding_heading(finding)
    return f"{heading} · {clean(finding.evidence)}", style


def _seen(state: State, entry: LockEntry, now: datetime) -> float | None:
    """Seconds a lock has been seen: held by the same backend at every look (the bound
    --session-age and max_hold judge), or waiting; None at the first refresh."""
    if state.tracker.refreshes < 2:
        return None
    return entry.seen.seconds if entry.seen is not None else state.tracker.observed(entry, now)


def _lock_table(state: State, snapshot: Snapshot, screen: int | None) -> list[Block]:
    now = snapshot.server.now
    filters = state.filters()
    assert state.incident is not None
    # the incident's order, as `list` shows it: each root (worst first) with its chain, then
    # other waits, then flagged locks, then the rest; the many locks of one session folded
    roots = [cause.root for cause in ordered_roots(state.incident) if cause.root is not None]
    accepted = [ListRow(None, e, snapshot.server) for e in state.entries if filters.accept(e)]
    ordered = by_urgency(accepted, {None: roots})
    folds = fold(ordered)
    shown = [row.entry for index, row in enumerate(ordered) if folds.get(index) != ""]
    folded = [folds.get(index) for index, _ in enumerate(ordered) if folds.get(index) != ""]
    important = [URGENT if e.blocks or not e.lock.granted or e.flags else 0 for e in shown]
    left_out = 0
    if screen is not None and len(shown) > screen:
        chosen = pick(important, screen)
        left_out = len(shown) - len(chosen)
        shown, important = [shown[i] for i in chosen], [important[i] for i in chosen]
        folded = [folded[i] for i in chosen]
    rows = [
        WatchRow(
            entry,
            snapshot.server,
            "+" if identity(entry) in state.tracker.appeared else " ",
            _seen(state, entry, now),
            label or "",
        )
        for entry, label in zip(shown, folded, strict=True)
    ]
    cells = [cells_of(WATCH_COLUMNS, row) for row in rows]
    blocks: list[Block] = [
        table(
            WATCH_COLUMNS,
            cells,
            important=important,
            empty="no advisory locks" if not state.entries else "no lock matches (c clears)",
            left_out=left_out,
            compact=lambda i: watch_line(rows[i]),
            legend={flag.value: flag.meaning for flag in Flag},
            more=MORE_ROWS,
        )
    ]
    gone = state.tracker.gone
    if gone:
        labels = ", ".join(f"{lock_label(e, snapshot.server)} (pid {e.lock.pid})" for e in gone[:5])
        blocks.append(Text([f"- gone since the last refresh: {labels}"], "note"))
    return blocks
