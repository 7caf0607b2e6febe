"""A fold on a narrowed lock table tells the truth: `lockdiag list` on a terminal analyses only
a screenful of a large lock table, yet a session holding 500 locks of one namespace shows as
``500 x NAMESPACE 10000..10499`` (its count and span in the whole lock table, not in the rows
that survived narrowing), and the count line's "shown here" is the locks behind the rows on
screen. On a real server, in a real pseudo-terminal of 80x24 drawn by pyte.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lockdiag.core.analysis import DEFAULT_POLICY
from lockdiag.core.diagnosis import Diagnosis, narrow
from lockdiag.core.model import LockRow
from lockdiag.core.snapshot_file import load
from lockdiag.demo.cluster import Cluster
from lockdiag.registry import load_registry
from lockdiag.render import render
from lockdiag.views.listing import list_output

from helpers.servers import Sessions
from helpers.terminal import Terminal, screen_of

NAMESPACE, ID = "invoice_pdf_export", 4242
TRUTH = f"500 x {NAMESPACE} 10000..10499"
REGISTRY = f"""
[namespaces.{NAMESPACE}]
id = {ID}
form = "pair"
description = "Render one invoice's PDF"

[namespaces.tenant_summary]
id = 4102
form = "pair"
description = "Rebuild one tenant's summary"
"""
FOLD = re.compile(r"(\d+) x [a-z_]+ -?\d+\.\.-?\d+")
SHOWN = re.compile(r"; (\d+) shown here")
LOCK_ROW = re.compile(r"\s(held|WAITING)\s+\d+\s")  # a table row: status, then pid
ONE_LINE_ROW = re.compile(r"\d+\s+(held|WAITING)\s")  # a screen too narrow: pid first


@pytest.fixture
def contended(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> Path:
    """A worker holding 500 locks of one namespace, a holder and its waiter; the registry."""
    sessions.open("pdf-worker").run(
        f"SELECT count(pg_advisory_lock({ID}, n)) FROM generate_series(10000, 10499) n"
    )
    sessions.open("holder").run("SELECT pg_advisory_lock(4102, 7)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 7)")
    sessions.waiting(waiter)
    registry = tmp_path / "lockdiag.toml"
    registry.write_text(REGISTRY)
    return registry


def represented(lines: list[str]) -> int:
    """The locks behind the lock rows of a table: a fold's count, else one."""
    rows = [line for line in lines if LOCK_ROW.search(line) or ONE_LINE_ROW.match(line)]
    return sum(int(m.group(1)) if (m := FOLD.search(line)) else 1 for line in rows)


def test_a_fold_on_a_narrowed_terminal_counts_the_whole_lock_table(
    cluster: Cluster, contended: Path
) -> None:
    screen = screen_of(["list", "--dsn", cluster.dsn(), "--registry", str(contended)], (24, 80))
    text = "\n".join(screen)
    assert TRUTH in text, text
    assert len(FOLD.findall(text)) == 1, text  # folded rows are not also shown unfolded
    (count,) = [line for line in screen if "lock(s)" in line]
    assert count.startswith("502 lock(s), 1 waiting; "), text
    shown = SHOWN.search(count)
    assert shown is not None, text
    assert int(shown.group(1)) == represented(screen) == 502, text
    assert " of 502" not in count, text  # one count line, not two counts


def table(report_listing: object) -> str:
    terminal = Terminal()
    render(list_output(report_listing), "table", terminal)  # type: ignore[arg-type]
    return re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())


def test_a_narrowed_snapshot_folds_like_the_whole_one(
    cluster: Cluster, contended: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "snapshot.json"
    subprocess.run(
        [sys.executable, "-m", "lockdiag", "snapshot", "-o", str(saved), "--dsn", cluster.dsn(),
         "--registry", str(contended)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    snapshot, registry = load(saved), load_registry(str(contended))
    whole = table(Diagnosis(snapshot, registry, DEFAULT_POLICY).listing())
    narrowed = narrow(snapshot, 16, DEFAULT_POLICY)
    assert narrowed is not None
    assert len(narrowed.snapshot.locks) < 502
    diagnosis = Diagnosis(
        narrowed.snapshot, registry, DEFAULT_POLICY, narrowed.total, narrowed.census
    )
    part = table(diagnosis.listing())
    assert [m.group(0) for m in FOLD.finditer(whole)] == [TRUTH], whole
    assert [m.group(0) for m in FOLD.finditer(part)] == [TRUTH], part
    shown = SHOWN.search(part)
    assert shown is not None and int(shown.group(1)) == represented(part.splitlines()), part


def test_a_fold_spans_negative_resources_in_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair's resource is a signed int4: a session holding -250..249, narrowed, folds as
    the whole snapshot does (pg_locks shows -250 as objid 4294967046)."""
    root = Path(__file__).resolve().parent.parent
    incident = load(root / "examples" / "incident.json")
    registry = load_registry(str(root / "examples" / "lockdiag.toml"))
    pid = max(incident.sessions)
    (database, *_) = incident.server.databases
    rows = [
        LockRow("advisory", database, None, None, None, None, None, 4102, n & 0xFFFFFFFF, 2,
                "9/1", pid, "ExclusiveLock", True)
        for n in range(-250, 250)
    ]  # fmt: skip
    snapshot = replace(incident, locks=[*incident.locks, *rows])
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("LINES", "24")
    whole = table(Diagnosis(snapshot, registry, DEFAULT_POLICY).listing())
    narrowed = narrow(snapshot, 16, DEFAULT_POLICY)
    assert narrowed is not None
    diagnosis = Diagnosis(
        narrowed.snapshot, registry, DEFAULT_POLICY, narrowed.total, narrowed.census
    )
    part = table(diagnosis.listing())
    truth = "500 x tenant_summary -250..249"
    assert truth in whole and truth in part, part
    shown = SHOWN.search(part)
    assert shown is not None and int(shown.group(1)) == represented(part.splitlines()), part
