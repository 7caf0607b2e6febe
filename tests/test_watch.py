"""`watch` in a real pseudo-terminal and `sample` against sessions that lock on a schedule."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pexpect
import psycopg
import pytest
from click.testing import CliRunner
from terminal import TERMINAL_ENV, screen_of

from lockdiag.cli import cli
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import Snapshot
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import Analysis, diagnose, take_snapshot
from lockdiag.registry import Registry, parse_registry
from lockdiag.render import plain
from lockdiag.views.blockers import tree_lines
from lockdiag.views.watch import CHECK, State, frame

from conftest import Sessions, ctrl_c_reaches_child

REGISTRY = '[namespaces.tenant_summary]\nid = 4102\nexpect = "xact"\n'
REFRESH = re.compile(rb"refresh #(\d+)")
# rich sizes its screen from COLUMNS/LINES before the terminal's own size: keep the pty's


def lockdiag_sessions(cluster: Cluster) -> int:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockdiag'"
        ).fetchone()
    return int(row[0]) if row else 0


def wait_until_gone(cluster: Cluster) -> None:
    deadline = time.monotonic() + 10
    while lockdiag_sessions(cluster) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lockdiag_sessions(cluster) == 0, "lockdiag left a session behind"


def refresh_number(child: pexpect.spawn) -> int:
    child.expect(REFRESH)
    return int(child.match.group(1))


def spawn_watch(
    cluster: Cluster, directory: Path, interval: str = "300ms", screen: tuple[int, int] = (40, 170)
) -> pexpect.spawn:
    """`lockdiag watch` on a real pseudo-terminal of ``screen`` (rows, columns), in
    ``directory``."""
    (directory / "lockdiag.toml").write_text(REGISTRY)
    command = ["-m", "lockdiag", "watch", "--interval", interval, "--dsn", cluster.dsn()]
    return pexpect.spawn(
        sys.executable, command, cwd=str(directory), dimensions=screen, timeout=30,
        env=TERMINAL_ENV,
    )  # fmt: skip


def pause_and_quit(child: pexpect.spawn) -> None:
    """p pauses (the frame is redrawn at once), q quits with status 0."""
    child.send("p")
    child.expect_exact("paused")
    child.send("q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.parametrize("screen", [(40, 170), (24, 80)], ids=["170x40", "80x24"])
def test_watch_renders_refreshes_reconnects_and_quits(
    cluster: Cluster, sessions: Sessions, tmp_path: Path, screen: tuple[int, int]
) -> None:
    """The banner that says the connection is lost fits every width."""
    sessions.open("billing-worker").run("SELECT pg_advisory_lock(4102, 73)")
    child = spawn_watch(cluster, tmp_path, screen=screen)
    try:
        child.expect_exact("tenant_summary 73")
        first = refresh_number(child)
        assert refresh_number(child) > first  # it refreshes
        child.expect(rb"seen \d+")  # observed hold, next to the lower bound
        cluster.restart()  # the server goes away and comes back
        child.expect(rb"connection lost \S+ ago .{1,4} showing the frame of \d\d:\d\d:\d\d")
        before = refresh_number(child)
        deadline = time.monotonic() + 20
        latest = before
        while latest <= before and time.monotonic() < deadline:
            latest = refresh_number(child)
        assert latest > before  # reconnected: refreshes go on
        child.send("q")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    wait_until_gone(cluster)


def test_watch_keys_narrow_and_pause(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    sessions.open("a").run("SELECT pg_advisory_lock(4102, 1), pg_advisory_lock(9, 9)")
    child = spawn_watch(cluster, tmp_path)
    try:
        child.expect_exact("unregistered pair (9, 9)")
        child.send("n")
        child.expect_exact("namespace: ")
        child.send("tenant_summary\r")
        child.expect_exact("only namespace tenant_summary")
        pause_and_quit(child)
    finally:
        child.close()


def test_narrowing_keeps_only_what_was_asked_for(cluster: Cluster, sessions: Sessions) -> None:
    """The frame after `n tenant_summary` and `i PID`: only those locks (and findings) remain."""
    first = sessions.open("a")
    first.run("SELECT pg_advisory_lock(4102, 1), pg_advisory_lock(9, 9)")
    second = sessions.open("b")
    second.run("SELECT pg_advisory_lock(4102, 2)")
    registry, _ = parse_registry("[namespaces.tenant_summary]\nid = 4102\n")
    assert registry is not None
    state = State(registry)
    state.take(watched(take_snapshot(cluster.dsn(), 5, "all"), registry))
    everything = plain(frame(state))
    assert "unregistered pair (9, 9)" in everything and "tenant_summary 2" in everything
    for key in "ntenant_summary\r":
        state.key(key)
    narrowed = plain(frame(state))
    assert "tenant_summary 1" in narrowed and "tenant_summary 2" in narrowed
    assert "(9, 9)" not in narrowed
    for key in f"i{second.pid}\r":
        state.key(key)
    only = plain(frame(state))
    assert "tenant_summary 2" in only and "tenant_summary 1" not in only
    state.key("n")
    for key in "nosuch\r":
        state.key(key)
    assert state.message is not None and "unknown namespace 'nosuch'" in state.message
    for key in "ntenant_sumary\r":
        state.key(key)
    assert state.message is not None and "did you mean tenant_summary?" in state.message
    assert "did you mean tenant_summary?" in plain(frame(state))  # it stays on screen...
    state.key("x")
    assert state.message is None  # ...until the next key


def test_watch_keeps_its_footer_on_a_small_busy_screen(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """More findings, chains and locks than a 24-line screen holds: the header and the footer
    (keys, errors) stay on it, and long lines are cut rather than wrapped."""
    holder = sessions.open("holder-with-a-rather-long-application-name-" + "x" * 40)
    holder.run("SELECT count(pg_advisory_lock(4102, g)) FROM generate_series(1, 300) g")
    for number in range(12):
        waiter = sessions.open(f"waiter-{number}")
        waiter.start(f"SELECT pg_advisory_lock(4102, {number + 1})")
        sessions.waiting(waiter)
    child = spawn_watch(cluster, tmp_path, interval="60s", screen=(24, 100))
    try:
        child.expect_exact("refresh #1")
        child.expect_exact("more row(s) not shown")
        child.expect_exact("q quit")  # the footer is drawn below the table: the frame fits
        pause_and_quit(child)
    finally:
        child.close()


def test_watch_without_a_terminal(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    sessions.open("w").run("SELECT pg_advisory_lock(4102, 2)")
    refused = CliRunner().invoke(cli, ["watch", "--dsn", cluster.dsn()])
    assert refused.exit_code == 2
    assert "watch needs a terminal" in refused.stderr
    recording = tmp_path / "incident.jsonl"
    for _ in range(2):
        once = CliRunner().invoke(
            cli, ["watch", "--once", "--record", str(recording), "--dsn", cluster.dsn()]
        )
        assert once.exit_code == 0, once.stderr
        assert "unregistered pair (4102, 2)" in once.stdout
    lines = recording.read_text().splitlines()
    assert len(lines) == 2 and all(
        json.loads(line)["format"] == "lockdiag-snapshot" for line in lines
    )
    replayed = CliRunner().invoke(cli, ["watch", "--once", "--from", str(recording)])
    assert replayed.exit_code == 0 and "unregistered pair (4102, 2)" in replayed.stdout
    child = pexpect.spawn(
        sys.executable,
        ["-m", "lockdiag", "watch", "--from", str(recording), "--interval", "200ms"],
        dimensions=(30, 150), timeout=20, env=TERMINAL_ENV,
    )  # fmt: skip
    child.expect_exact("refresh #2")
    child.send("q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def schedule(cluster: Cluster, stop: threading.Event) -> list[threading.Thread]:
    """Short episodes, a stuck owner with waiters, a broad key, duplicate dispatch."""

    def connect(name: str, autocommit: bool = True) -> psycopg.Connection[object]:
        return psycopg.connect(cluster.dsn(application_name=name), autocommit=autocommit)

    def short_episodes() -> None:
        with connect("flapper") as c:
            while not stop.is_set():
                c.execute("SELECT pg_advisory_lock(7000, 1)")
                time.sleep(0.25)
                c.execute("SELECT pg_advisory_unlock(7000, 1)")
                time.sleep(0.25)

    def dispatcher(number: int) -> None:
        with connect(f"dispatch-{number}") as c:
            time.sleep(0.5 * number)
            while not stop.is_set():
                c.execute("SELECT pg_advisory_lock(5000, 1)")
                time.sleep(0.3)
                c.execute("SELECT pg_advisory_unlock(5000, 1)")
                time.sleep(0.9)

    threads = [threading.Thread(target=short_episodes, daemon=True)]
    threads += [threading.Thread(target=dispatcher, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    return threads


def test_sample_catches_short_episodes_and_patterns(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    owner = sessions.open("stuck", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(4102, 2)")
    for name in ("report-a", "report-b", "report-c"):  # a broad key: many distinct waiters
        waiter = sessions.open(name)
        waiter.start("SELECT pg_advisory_lock(4102, 2)")
        sessions.waiting(waiter)
    stop = threading.Event()
    threads = schedule(cluster, stop)
    try:
        result = CliRunner().invoke(
            cli,
            ["sample", "--duration", "4s", "--interval", "100ms", "--dsn", cluster.dsn(),
             "--format", "json"],
        )  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert result.exit_code == 0, result.stderr
    assert "sampling: " in result.stderr  # progress on stderr
    document = json.loads(result.stdout)
    assert 30 <= document["samples"] <= 41
    # pg_locks is read when pg_stat_activity changed (the flapper makes it change often)
    assert 2 <= document["cost"]["pg_locks_reads"] <= document["samples"]
    keys = {k["key"]: k for k in document["keys"]}
    flapping = keys["unregistered pair (7000, 1)"]
    assert flapping["acquisitions"] >= 4  # episodes of 250 ms caught at 100 ms
    assert flapping["longest_hold_seconds"] < 1.0
    stuck = keys["tenant_summary 2"]
    assert stuck["samples_waited"] == stuck["samples_held"] == document["samples"]
    assert stuck["distinct_waiters"] == 3
    kinds = {(p["kind"], p["key"]) for p in document["patterns"]}
    assert ("idle-holder", "tenant_summary 2") in kinds
    assert ("broad-key", "tenant_summary 2") not in kinds  # a stuck owner, on a lone key
    assert ("duplicate-dispatch", "unregistered pair (5000, 1)") in kinds
    assert ("duplicate-dispatch", "unregistered pair (7000, 1)") not in kinds  # one session
    wait_until_gone(cluster)


def test_sample_prometheus_and_interrupt(
    cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)
    sessions.open("w").run("SELECT pg_advisory_lock(4102, 3)")
    result = CliRunner().invoke(
        cli, ["sample", "--duration", "500ms", "--interval", "100ms", "--dsn", cluster.dsn(),
              "--format", "prometheus"],
    )  # fmt: skip
    assert result.exit_code == 0
    assert 'lockdiag_sample_held_samples{namespace="tenant_summary"}' in result.stdout
    child = pexpect.spawn(
        sys.executable,
        ["-m", "lockdiag", "sample", "--duration", "60s", "--interval", "100ms",
         "--dsn", cluster.dsn()],
        cwd=str(tmp_path), timeout=20, dimensions=(40, 200), env=TERMINAL_ENV,
        preexec_fn=ctrl_c_reaches_child,
    )  # fmt: skip
    child.expect(rb"sampling.*[1-9]\d* samples.*left")  # a bar with the time remaining
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    output = child.before.decode()
    assert child.exitstatus == 130
    assert "tenant_summary 3" in output and "interrupted" in output and "Traceback" not in output
    wait_until_gone(cluster)


def test_bad_durations() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag", "sample", "--interval", "0s", "--dsn", "host=x"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "more than zero" in result.stderr


def test_broad_key_compares_a_key_with_its_busiest_sibling() -> None:
    """The broad-key pattern over many keys of one namespace (it used to compare every key
    with every other: 100k keys took minutes)."""
    from lockdiag.core.observe import KeyStats, Sampler, patterns

    sampler = Sampler(samples=40)
    for number in range(20000):
        sampler.keys[(None, f"jobs {number}")] = KeyStats(f"jobs {number}", None, "jobs", 2)
    broad = KeyStats("jobs broad", None, "jobs", samples_held=40, samples_waited=30)
    broad.waiter_pids.update({1, 2, 3})
    broad.waiters.update({("a", "local"), ("b", "local")})
    sampler.keys[(None, "jobs broad")] = broad
    assert patterns(sampler) == []  # waits of milliseconds: ordinary contention
    broad.long_waiter_pids.update({1, 2, 3})  # each seen waiting a second or more
    assert [(p.kind, p.label) for p in patterns(sampler)] == [("broad-key", "jobs broad")]
    assert "other 20000 key(s)" in patterns(sampler)[0].evidence
    sampler.keys[(None, "jobs 7")].samples_held = 11  # a sibling busier than a quarter of it
    assert patterns(sampler) == []


def test_frame_keeps_every_root_the_namespace_cause_and_says_a_stale_frame_age(
    cluster: Cluster, sessions: Sessions
) -> None:
    """Four root blockers: each root's heading is in the frame (once at most three were);
    narrowed to the namespace, the causes stay; a failed refresh dims the frame and says
    how old it is."""
    for number in range(1, 5):
        sessions.open(f"holder-{number}").run(f"SELECT pg_advisory_lock(4102, {number})")
        waiter = sessions.open(f"waiter-{number}")
        waiter.start(f"SELECT pg_advisory_lock(4102, {number})")
        sessions.waiting(waiter)
    registry, _ = parse_registry(REGISTRY)
    assert registry is not None
    state = State(registry)
    state.take(watched(take_snapshot(cluster.dsn(), 5, "all"), registry))
    lines = plain(frame(state, 24)).splitlines()
    assert sum(line.startswith("root blocker ") for line in lines) == 4, lines
    assert not state.stale and not any(line.startswith("stale:") for line in lines)
    state.namespace = "tenant_summary"
    narrowed = plain(frame(state, 24)).splitlines()
    assert sum(line.startswith("root blocker ") for line in narrowed) == 4, narrowed
    causes = [line for line in narrowed if line.startswith(("CRITICAL", "WARNING"))]
    assert causes and all("tenant_summary" in line for line in causes), narrowed
    state.failed("connection refused")
    assert state.stale
    stale = plain(frame(state, 24))
    assert re.search(r"stale: frame of \d\d:\d\d:\d\d, \S+ old", stale), stale


def test_narrowing_to_a_namespace_keeps_its_root_cause() -> None:
    """The bundled incident, narrowed to tenant_summary: pid 4163's cause (named by
    tenant_summary 73, which others wait for) stays first, in check's words."""
    from lockdiag.core.snapshot_file import load

    examples = Path(__file__).resolve().parent.parent / "examples"
    registry, _ = parse_registry((examples / "lockdiag.toml").read_text())
    assert registry is not None
    state = State(registry)
    state.take(watched(load(examples / "incident.json"), registry))
    everything = plain(frame(state)).splitlines()
    assert everything[1].startswith("CRITICAL session-lock: tenant_summary 73 (+1 more)  pid 4163")
    state.namespace = "tenant_summary"
    narrowed = plain(frame(state)).splitlines()
    assert narrowed[1].startswith("CRITICAL session-lock: tenant_summary 73 (+1 more)  pid 4163")
    assert any("tenant_summary 74" in line and "pid 9932" in line for line in narrowed)
    assert not any("unregistered pair (-5, 7)  pid 4164" in line for line in narrowed)
    assert "root blocker 1: tenant_summary 73" in "\n".join(narrowed)


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INCIDENT, BUNDLED_REGISTRY = EXAMPLES / "incident.json", EXAMPLES / "lockdiag.toml"
SIZES = [(24, 80), (40, 120), (50, 200)]


def watched(snapshot: Snapshot, registry: Registry) -> Diagnosis:
    """A refresh's diagnosis, as watch's reads analyse one (check's thresholds)."""
    return diagnose(snapshot, registry, Analysis(CHECK.analysis_policy()))


def bundled_snapshot(renumbered: bool = False) -> Snapshot:
    """The bundled incident; ``renumbered``: the second root's tenant_summary 74 is 72, so
    its locks sort before the worst root's tenant_summary 73 in pg_locks' (the key's) order."""
    from lockdiag.core.snapshot_file import load

    snapshot = load(INCIDENT)
    if renumbered:
        snapshot.locks[:] = [
            lock._replace(objid=72) if (lock.classid, lock.objid) == (4102, 74) else lock
            for lock in snapshot.locks
        ]
    return snapshot


def bundled_state(renumbered: bool = False) -> State:
    registry, _ = parse_registry(BUNDLED_REGISTRY.read_text())
    assert registry is not None
    state = State(registry)
    state.take(watched(bundled_snapshot(renumbered), registry))
    return state


def chain_lines(lines: list[str]) -> list[str]:
    """The frame's chains: from the first root's heading to the lock table's header."""
    start = next(i for i, line in enumerate(lines) if line.startswith("root blocker 1:"))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("LOCK "))
    return lines[start:end]


@pytest.mark.parametrize("height", [56, 40, 24])
def test_frame_wraps_long_chain_rows_under_the_tree_and_fits_the_room(height: int) -> None:
    """At 80 columns a tree row longer than the screen wraps under the tree's indent, as in
    `blockers`, instead of losing its end; the chains (headings and wrapped lines counted)
    take no more than their quarter of the screen, every root's heading stays, and the rest
    of a chain is counted."""
    state = bundled_state()
    assert state.incident is not None
    graph = state.incident.report.graph
    long_rows = [
        line for root in graph.roots for line in tree_lines(root.tree, graph) if len(line) > 80
    ]
    assert long_rows, "the bundled incident has a tree row longer than 80 columns"
    chains = chain_lines(plain(frame(state, height, 80)).splitlines())
    assert all(len(line) <= 80 for line in chains), chains
    assert len(chains) <= max(3, height // 4), chains
    assert sum(line.startswith("root blocker ") for line in chains) == len(graph.roots), chains
    sizes = [len(tree_lines(root.tree, graph)) for root in graph.roots]
    counted = []
    for segment, size in zip(per_root(chains), sizes, strict=True):
        shown = sum(starts_a_row(line) for line in segment)
        more = [int(line.split()[1]) for line in segment if line.startswith("… ")]
        counted += more
        # every session shown or counted; too little room: the heading names the holder
        assert shown + sum(more) == size or (shown == 0 and more == [size - 1]), segment
    if height == 56:  # room for every chain in full: each long row whole, wrapped
        assert not counted, chains
        index = next(i for i, line in enumerate(chains) if line.startswith("├─ pid 9933"))
        assert chains[index].endswith("waits 7m28s for tenant_summary 73"), chains
        assert chains[index + 1] == "│     (ExclusiveLock)", chains  # under the tree's bar
        joined = " ".join(line.lstrip("│└├─ ") for line in chains)
        for row in long_rows:
            assert row.lstrip("│└├─ ") in joined, (row, chains)
    else:
        assert counted, chains  # cut to the room: the rest is counted


def test_frame_without_a_width_keeps_chain_rows_whole_on_one_line() -> None:
    """--once (no screen): every chain row on one line, as before."""
    state = bundled_state()
    assert state.incident is not None
    graph = state.incident.report.graph
    lines = plain(frame(state)).splitlines()
    for root in graph.roots:
        for row in tree_lines(root.tree, graph):
            assert row in lines, row


def per_root(chains: list[str]) -> list[list[str]]:
    """The chain lines after each root's heading (and its wrapped lines)."""
    segments: list[list[str]] = []
    for line in chains:
        if line.startswith("root blocker "):
            segments.append([])
        elif not line.startswith("  "):  # not the heading's wrapped line
            segments[-1].append(line)
    return segments


def starts_a_row(line: str) -> bool:
    """A tree row's first line: the holder's, or a waiter's under the tree's bars."""
    return line.startswith("pid ") or line.lstrip("│ ").startswith(("├─ ", "└─ "))


def first_lock_row(lines: list[str]) -> str:
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("LOCK "))
    return lines[header + 1]


@pytest.mark.parametrize("renumbered", [False, True], ids=["recorded", "renumbered"])
def test_lock_table_follows_the_incident_like_list(renumbered: bool, monkeypatch: Any) -> None:
    """The first lock row under the chains is the worst root's contended lock (pid 4163,
    tenant_summary 73), as `list` shows first on a terminal, even when another root's lock
    sorts first by its key; then the rest of that chain, then the next root's."""
    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.registry import load_registry
    from lockdiag.render import render
    from lockdiag.views.listing import list_output

    lines = plain(frame(bundled_state(renumbered), 50, 200)).splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("LOCK "))
    rows = [line.split() for line in lines[header + 1 : header + 6]]
    second = "72" if renumbered else "74"
    expected = [("73", "held", "4163"), ("73", "WAITING", "9933"), ("73", "WAITING", "13302"),
                (second, "held", "9932"), (second, "WAITING", "9935")]  # fmt: skip
    assert [(row[0], *row[1:4]) for row in rows] == [("tenant_summary", *e) for e in expected]
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setenv("LINES", "40")
    diagnosis = Diagnosis(bundled_snapshot(renumbered), load_registry(str(BUNDLED_REGISTRY)))
    terminal = Terminal()
    render(list_output(diagnosis.listing()), "table", terminal)
    text = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    listed = [line for line in text.splitlines() if line.strip()]
    assert listed[0].startswith("LOCK")
    first = listed[2].split()  # after the header and its rule
    assert first[:2] == rows[0][:2] and "4163" in first, (listed[2], rows[0])


def test_lock_table_keeps_chains_and_flagged_locks_first_when_capped() -> None:
    """A table cut to a few rows keeps the locks in a chain and the flagged ones."""
    state = bundled_state()
    lines = plain(frame(state, 6, 200)).splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("LOCK "))
    rows = lines[header + 1 : header + 7]
    assert "more row(s) not shown" in "\n".join(lines)
    assert not any("leader 1" in row or "tenant_summary 80" in row for row in rows), rows


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LOCK_ROW = re.compile(r"\b(held|WAITING)\b")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_watch_on_a_terminal_names_the_cause_first_and_wraps_its_chains(
    size: tuple[int, int], tmp_path: Path
) -> None:
    """In a real pty: the first line after the header that names a lock and a pid is pid
    4163's tenant_summary 73, and so is the first row of the lock table under the chains;
    chain lines wrap (none is cut with an ellipsis); the header and footer are on screen."""
    recording = tmp_path / "incident.jsonl"
    recording.write_text(json.dumps(json.loads(INCIDENT.read_text())) + "\n")
    args = ["watch", "--from", str(recording), "--registry", str(BUNDLED_REGISTRY),
            "--interval", "60s"]  # fmt: skip
    screen = screen_of(args, size, keys="q")
    text = "\n".join(screen)
    header = next(i for i, line in enumerate(screen) if line.startswith("lockdiag watch"))
    assert header < 2, text
    assert any(line.startswith("q quit") for line in screen[header:]), text  # the footer
    naming = [line for line in screen[header + 1 :] if re.search(r"\d{3,}", line)]
    assert "pid 4163" in naming[0] and "tenant_summary 73" in naming[0], text
    start = next(i for i, line in enumerate(screen) if line.startswith("root blocker 1:"))
    rows = [i for i, line in enumerate(screen) if i > start and LOCK_ROW.search(line)]
    chains = screen[start : rows[0]]  # and the table's header, when it has one
    assert not any(line.endswith("…") for line in chains), text  # wrapped, not cut
    assert sum(line.startswith("root blocker ") for line in chains) == 2, text
    first = screen[rows[0]]  # the table's first row
    assert "4163" in first.split() and "tenant_summary 73" in first, text
