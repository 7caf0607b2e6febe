"""What a person sees, in a real pseudo-terminal of 80x24, 120x40 and 200x50: for `list`,
`who-holds` and `watch` on the bundled incident, every row on screen shows its PID, its status
and the whole name of its lock, and nothing has scrolled off the top; `check` shows every
finding's heading between its verdict at the top and again at the bottom.

The terminal is emulated by pyte from the bytes the program wrote, as a terminal would draw
them (cursor moves, the alternate screen, cut lines).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import BUNDLED_REGISTRY as REGISTRY
from helpers.paths import INCIDENT
from helpers.terminal import screen_of

SIZES = [(24, 80), (40, 120), (50, 200)]


def locks(command: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag", command, "--from", str(INCIDENT), "--registry",
         str(REGISTRY), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found: list[dict[str, Any]] = json.loads(result.stdout)["locks"]
    return found


def label(lock: dict[str, Any]) -> str:
    if lock["namespace"]:
        return f"{lock['namespace']} {lock['resource']}"
    if lock["known"]:
        return f"{lock['known']['software']}: {lock['known']['meaning']}"
    return f"unregistered {lock['form']} ({', '.join(map(str, lock['key']))})"


def rows_are_whole(screen: list[str], expected: list[dict[str, Any]]) -> int:
    """Every screen line that shows a lock's pid shows one of that pid's locks whole, with
    its status. Returns how many lock rows were on screen."""
    by_pid: dict[str, list[dict[str, Any]]] = {}
    for lock in expected:
        by_pid.setdefault(str(lock["pid"]), []).append(lock)
    shown = 0
    for line in screen:
        words = line.replace("+", " ").split()
        pids = [w for w in words if w in by_pid]
        if not pids or line.lstrip().startswith(("├", "└", "pid ", "root", "WARNING", "CRITICAL")):
            continue  # not a lock row (chains and findings name pids too)
        if re.search(r"\bpid \d", line):
            continue  # a wrapped finding's line ("held by pid 8569 ...")
        mine = by_pid[pids[0]]
        assert any(label(lock) in line for lock in mine), f"lock name cut: {line!r}"
        assert "held" in line or "WAITING" in line, f"no status: {line!r}"
        shown += 1
    return shown


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_list_keeps_pid_status_and_name_on_screen(size: tuple[int, int]) -> None:
    args = ["list", "--from", str(INCIDENT), "--registry", str(REGISTRY)]
    screen = screen_of(args, size)
    shown = rows_are_whole(screen, locks("list"))
    assert shown >= min(11, size[0] // 3), "\n".join(screen)
    # nothing scrolled off: the most urgent row (a root blocker) is at the top, and the
    # summary is still on screen
    first = next(line for line in screen if line.strip())
    assert "4163" in first or first.startswith("LOCK"), "\n".join(screen)
    assert any("11 lock(s), 3 waiting" in line for line in screen), "\n".join(screen)


@pytest.mark.parametrize("size", [(24, 60), (24, 80)], ids=lambda s: f"{s[1]}x{s[0]}")
def test_a_narrow_list_says_whom_the_root_blocks_before_its_flags(size: tuple[int, int]) -> None:
    """At 60 and 80 columns each lock is one line: the verdict (name, whom it blocks, its
    state) comes first and whole, its flags after, folded to the first and a count (they cut
    `blocks ...` off the root blocker's line: `[max-hold,expect-xact,long-session-lock…`)."""
    screen = screen_of(["list", "--from", str(INCIDENT), "--registry", str(REGISTRY)], size)
    root = next(line for line in screen if line.startswith("4163 ") and "tenant_summary 73" in line)
    assert "tenant_summary 73  blocks 9933,13302" in root, "\n".join(screen)
    if size[1] >= 80:  # the worst flag first (its count may meet the edge)
        assert "blocks 9933,13302 · idle · [max-hold" in root, root
    assert not any("[max-hold,expect-xact" in line for line in screen), "\n".join(screen)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_who_holds_keeps_its_verdict_and_pids_on_screen(size: tuple[int, int]) -> None:
    args = ["who-holds", "tenant_summary", "73", "--from", str(INCIDENT), "--registry",
            str(REGISTRY)]  # fmt: skip
    screen = screen_of(args, size)
    text = "\n".join(screen)
    assert screen[0].startswith("tenant_summary 73 (4102, 73, 2) is held by pid 4163"), text
    for pid in ("4163", "9933", "13302"):
        assert any(line.split()[:2].count(pid) or line.startswith(pid) for line in screen), (
            f"pid {pid} not on screen:\n{text}"
        )
    assert "Waiters" in text and "Holders" in text


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_watch_shows_whole_rows_and_its_footer(size: tuple[int, int], tmp_path: Path) -> None:
    recording = tmp_path / "incident.jsonl"
    recording.write_text(json.dumps(json.loads(INCIDENT.read_text())) + "\n")
    args = ["watch", "--from", str(recording), "--registry", str(REGISTRY), "--interval", "60s"]
    screen = screen_of(args, size, keys="q")
    text = "\n".join(screen)
    assert any(line.startswith("lockdiag watch") for line in screen[:2]), text
    assert any("q quit" in line for line in screen), text  # the footer, whole
    assert rows_are_whole(screen, locks("list")) >= 1, text
    # the incident's 5 causes (2 critical, 3 warnings): every critical one is on screen
    # before any warning, and those left out are counted (at 80x24 it showed 1, said nothing)
    headings = [line for line in screen if line.startswith(("CRITICAL ", "WARNING "))]
    critical = [line for line in headings if line.startswith("CRITICAL ")]
    assert len(critical) == 2 and headings.index(critical[-1]) == 1, text
    said = re.search(r"… (\d+) more cause\(s\) not shown", text)
    assert len(headings) + (int(said.group(1)) if said else 0) == 5, text


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_check_keeps_every_finding_and_its_verdict_on_screen(size: tuple[int, int]) -> None:
    args = ["check", "--from", str(INCIDENT), "--registry", str(REGISTRY)]
    plain = subprocess.run(
        [sys.executable, "-m", "lockdiag", *args, "--format", "plain"],
        check=False, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    verdict, headings = plain[0], [line for line in plain[1:] if line[:1].isupper()]
    # one heading per cause, as many as the verdict counts, the worst root first by the lock
    # others wait for
    assert verdict == "CRITICAL: 2 critical, 3 warning cause(s); 3 session(s) waiting", plain
    assert len(headings) == 5, plain
    assert headings[0].startswith("CRITICAL session-lock: tenant_summary 73 (+1 more)  pid 4163")
    screen = screen_of(args, size, codes=(2,))
    text = "\n".join(screen)
    lines = [line for line in screen if line.strip()]
    assert lines[0] == verdict and lines[-1] == verdict, text  # nothing scrolled off
    joined = " ".join(line.strip() for line in screen)  # a long heading wraps, whole
    for heading in headings:
        assert heading in joined, f"{heading!r} not on screen:\n{text}"
    if size[0] >= 50:  # a tall screen shows them in full
        assert "shown in part or by heading only" not in text, text


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_blockers_names_the_worst_root_first_and_keeps_it_on_screen(
    size: tuple[int, int],
) -> None:
    """The first line is the cause: the same worst root as check's first heading, and
    nothing scrolls off (every root's heading, the holder of root blocker 1 whole)."""
    source = ["--from", str(INCIDENT), "--registry", str(REGISTRY)]
    check = subprocess.run(
        [sys.executable, "-m", "lockdiag", "check", *source, "--format", "plain"],
        check=False, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    first_cause = check[1]
    assert "tenant_summary 73" in first_cause and "pid 4163" in first_cause, check
    screen = screen_of(["blockers", *source], size)
    text = "\n".join(screen)
    lines = [line for line in screen if line.strip()]
    assert lines[0].startswith("root blocker 1: tenant_summary 73"), text
    assert "pid 4163" in " ".join(lines[:2]), text  # a long heading wraps, whole
    joined = " ".join(line.strip() for line in screen)
    assert "root blocker 2: tenant_summary 74" in joined, text
    assert "pid 4163 billing-worker" in text, text
    assert all(len(line) <= size[1] for line in screen)
    # wrapped lines keep the tree's indent: a line after a child's starts with the bars
    for index, line in enumerate(screen[:-1]):
        if line.startswith("├─ ") and not screen[index + 1].startswith(("├─", "└─", "root")):
            assert screen[index + 1].startswith("│  "), text


def test_blockers_markdown_is_a_pipe_table() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag", "blockers", "--from", str(INCIDENT), "--registry",
         str(REGISTRY), "--format", "markdown"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rows = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert rows, result.stdout
    assert "```" not in result.stdout
    assert [c.strip() for c in rows[0].split("|")[1:-1]][:3] == ["root", "position", "pid"]
