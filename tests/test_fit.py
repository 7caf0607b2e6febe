"""Every screen fits what it wraps: the messy incident of issue 35 with long application names,
seen in a real pseudo-terminal at 80x24 and 120x40.

One module-scoped fixture builds it with real sessions and saves one snapshot (and a one-frame
recording for `watch`):

- a leaked session lock: a worker whose application_name is 57 characters long holds
  ``invoice_pdf_export 9000``, four sessions with long names wait for it;
- a lock-queue outage on a table: a reader idle in transaction, a deploy's ALTER TABLE waiting
  behind it, 15 application queries queued behind the ALTER: 16 sessions wait on a table lock;
- an advisory chain: A holds k1; B holds k2 and waits for k1; C waits for k2;
- a holder idle in transaction with a transaction lock one session waits for;
- a worker holding 3,000 uncontested session locks.

Four root blockers in all. Nothing scrolls off: the first line is the view's verdict (or its
header), every root blocker (or a count of those not shown) is on screen, the rows at 80
columns keep pid, status, the lock's name and the flag that matters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster

from helpers.cli import output
from helpers.servers import Sessions
from helpers.terminal import screen_once, shown

SIZES = [(24, 80), (40, 120)]
SIZE_IDS = [f"{columns}x{rows}" for rows, columns in SIZES]
PDF_ID, SUMMARY_ID, REPORT_ID = 4200, 4102, 4300
LEAKER = "billing-period-close-worker-eu-west-1-pod-7f9c6d5b8-x2k4q"
QUEUED = 15  # application queries behind the ALTER: 16 waiters on the table
BULK = 3000
REGISTRY_TEXT = f"""\
[namespaces.invoice_pdf_export]
id = {PDF_ID}
form = "pair"
description = "Render one invoice's PDF"
expect = "xact"

[namespaces.tenant_summary]
id = {SUMMARY_ID}
form = "pair"
description = "Rebuild one tenant's summary"
expect = "xact"

[namespaces.report_cache]
id = {REPORT_ID}
form = "pair"
description = "Refresh one cached report"
expect = "any"
"""


@dataclass
class Scene:
    snapshot: Path
    registry: Path
    recording: Path
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def source(self) -> tuple[str, ...]:
        return ("--from", str(self.snapshot), "--registry", str(self.registry))

    @property
    def roots(self) -> list[int]:
        return [self.pids[name] for name in ROOTS]


ROOTS = ("reader", "leaker", "cache-a", "summary")  # by sessions held up: 16, 4, 2, 1


def long_name(role: str, number: int) -> str:
    return f"{role}-eu-west-1-pod-5c8d7b9f6-{number:05d}"


@pytest.fixture(scope="module")
def scene(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    scratch = tmp_path_factory.mktemp("fit")
    registry = scratch / "lockdiag.toml"
    registry.write_text(REGISTRY_TEXT)
    sessions = Sessions(cluster)
    pids: dict[str, int] = {}
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS fit_orders")
            admin.execute("CREATE TABLE fit_orders (id int PRIMARY KEY)")
        leaker = sessions.open(LEAKER)
        leaker.run(f"SELECT pg_advisory_lock({PDF_ID}, 9000)")
        pids["leaker"] = leaker.pid
        for number in range(1, 5):
            waiter = sessions.open(long_name("invoice-pdf-renderer", number))
            waiter.start(f"SELECT pg_advisory_lock({PDF_ID}, 9000)")
            sessions.waiting(waiter)
        reader = sessions.open(long_name("month-end-report-reader", 1), autocommit=False)
        reader.run("SELECT count(*) FROM fit_orders")  # ACCESS SHARE, idle in transaction
        pids["reader"] = reader.pid
        deploy = sessions.open(long_name("schema-migration-deploy", 1))
        deploy.start("ALTER TABLE fit_orders ADD COLUMN note text")
        sessions.waiting(deploy)
        for number in range(1, QUEUED + 1):
            app = sessions.open(long_name("checkout-api", number))
            app.start("SELECT count(*) FROM fit_orders")
            sessions.waiting(app)
        cache = [sessions.open(long_name(f"report-cache-refresh-{n}", 1)) for n in "abc"]
        cache[0].run(f"SELECT pg_advisory_lock({REPORT_ID}, 1)")
        cache[1].run(f"SELECT pg_advisory_lock({REPORT_ID}, 2)")
        cache[1].start(f"SELECT pg_advisory_lock({REPORT_ID}, 1)")
        sessions.waiting(cache[1])
        cache[2].start(f"SELECT pg_advisory_lock({REPORT_ID}, 2)")
        sessions.waiting(cache[2])
        pids["cache-a"] = cache[0].pid
        summary = sessions.open(long_name("tenant-summary-rebuild", 1), autocommit=False)
        summary.run(f"SELECT pg_advisory_xact_lock({SUMMARY_ID}, 73)")
        pids["summary"] = summary.pid
        retry = sessions.open(long_name("tenant-summary-retry", 1))
        retry.start(f"SELECT pg_advisory_xact_lock({SUMMARY_ID}, 73)")
        sessions.waiting(retry)
        bulk = sessions.open(long_name("invoice-pdf-prewarm", 1))
        bulk.run(f"SELECT count(pg_advisory_lock({PDF_ID}, n)) FROM generate_series(20000, "
                 f"{20000 + BULK - 1}) n")  # fmt: skip
        pids["bulk"] = bulk.pid
        snapshot = scratch / "incident.json"
        output("snapshot", "-o", str(snapshot), "--dsn", cluster.dsn())
        recording = scratch / "incident.jsonl"
        recording.write_text(json.dumps(json.loads(snapshot.read_text())) + "\n")
        yield Scene(snapshot, registry, recording, pids)
    finally:
        sessions.close()


def joined(screen: tuple[str, ...]) -> str:
    """The screen's text with wrapped lines joined back."""
    return " ".join(line.strip() for line in screen)


def test_scene_is_in_the_snapshot(scene: Scene) -> None:
    """Not a view under test: the four roots, the 16 table waiters, the 3,000 locks."""
    document = json.loads(output("blockers", *scene.source, "--format", "json"))
    roots = [(r["pid"], r["total"]) for r in document["roots"]]
    assert sorted(roots, key=lambda r: -r[1]) == list(
        zip(scene.roots, [16, 4, 2, 1], strict=True)
    ), roots
    saved = json.loads(scene.snapshot.read_text())
    waits = [s["wait_event"] for s in saved["sessions"] if s["wait_event_type"] == "Lock"]
    assert waits.count("relation") == 16 and waits.count("advisory") == 7, waits
    every = json.loads(output("list", "--all", *scene.source, "--format", "json"))["locks"]
    assert sum(1 for lock in every if lock["pid"] == scene.pids["bulk"]) == BULK


LOW = ("--session-age", "50ms,100ms", "--wait-age", "50ms,100ms", "--idle-age", "50ms,100ms")


def watch_screen(scene: Scene, size: tuple[int, int]) -> tuple[str, ...]:
    args = ("watch", "--from", str(scene.recording), "--registry", str(scene.registry),
            "--interval", "60s")  # fmt: skip
    return screen_once(args, size, "q")


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_check_keeps_its_verdict_and_every_root(scene: Scene, size: tuple[int, int]) -> None:
    screen = screen_once(("check", *LOW, *scene.source), size)
    text, lines = shown(screen), [line for line in screen if line.strip()]
    assert lines[0].startswith("CRITICAL: ") and lines[-1] == lines[0], text
    for pid in scene.roots:
        assert f"pid {pid}" in joined(screen), f"root {pid} not on screen:\n{text}"


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_who_holds_keeps_its_verdict_next_step_and_a_count(
    scene: Scene, size: tuple[int, int]
) -> None:
    screen = screen_once(("who-holds", "invoice_pdf_export", "9000", *scene.source), size)
    text, all_text = shown(screen), joined(screen)
    assert screen[0].startswith("invoice_pdf_export 9000 (4200, 9000, 2) is held by pid"), text
    assert LEAKER in all_text and "next: " in all_text, text
    waiters = [line for line in screen if re.match(r"^\d+\s+\d+\s+invoice-pdf-renderer", line)]
    more = re.search(r"(\d+) more row\(s\) not shown", all_text)
    assert len(waiters) + (int(more.group(1)) if more else 0) == 4, text


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_blockers_keeps_every_root_on_screen(scene: Scene, size: tuple[int, int]) -> None:
    screen = screen_once(("blockers", *scene.source), size)
    text, all_text = shown(screen), joined(screen)
    assert screen[0].startswith("root blocker 1: relation public.fit_orders"), text
    for rank, pid in enumerate(scene.roots, start=1):
        assert re.search(rf"root blocker {rank}: .*?pid {pid}\b", all_text), text
    assert "first: cancel its wait first: lockdiag terminate" in all_text, text
    assert all(len(line) <= size[1] for line in screen), text


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_list_rows_keep_pid_status_lock_and_flag(scene: Scene, size: tuple[int, int]) -> None:
    """Every root blocker of an advisory lock has its row, whose pid, status, lock name and
    flag are whole; the legend explains only flags on screen; and the table-lock outage that
    the list of advisory locks leaves out is counted, with where to see it."""
    screen = screen_once(("list", *scene.source), size)
    text, all_text = shown(screen), joined(screen)
    rows = {line.split()[0]: line for line in screen if re.match(r"^\s*\d+\s+held\s", line)}
    # a lock a line (too narrow for the table): the name whole, then whom it blocks and its
    # state, then its flags folded (the first and how many more), cut at the edge if need be
    flagged = {"leaker": ("invoice_pdf_export 9000  blocks ", "[expect-xact"),
               "summary": ("tenant_summary 73  blocks ", "[stuck-owner"),
               "bulk": (f"{BULK} x invoice_pdf_export 20000..22999  ", "[expect-xact")}  # fmt: skip
    for name, (verdict, flag) in flagged.items():
        row = rows.get(str(scene.pids[name]), "")
        assert verdict in row, f"{name}:\n{text}"
        assert flag in row or row.endswith("…"), f"{name}:\n{text}"
    assert str(scene.pids["cache-a"]) in rows, text
    assert "16 session(s) wait for other lock types (relation 16)" in all_text, text
    assert "lockdiag list --all" in all_text and "lockdiag blockers" in all_text, text
    explained = [line.split(":")[0] for line in screen if re.match(r"^[a-z-]+: ", line)]
    for flag in explained:
        assert any(f"[{flag}" in row or f",{flag}" in row for row in rows.values()), text
    assert screen[0].split()[0] == str(scene.pids["leaker"]) or screen[0].startswith("LOCK")
    every = screen_once(("list", "--all", *scene.source), size)  # lists them: says nothing
    assert "wait for other lock types" not in joined(every), shown(every)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_watch_folds_wraps_its_findings_and_names_its_keys(
    scene: Scene, size: tuple[int, int]
) -> None:
    screen = watch_screen(scene, size)
    text, all_text = shown(screen), joined(screen)
    assert screen[0].startswith("lockdiag watch"), text
    assert "q quit · p pause · n namespace · i pid · c clear" in all_text, text
    assert "--format" not in all_text, text  # watch has no --format
    # the worst cause's line is whole: its count of sessions held up is on screen
    assert re.search(r"invoice_pdf_export 9000 .*? · blocks 4 session\(s\)", all_text), text
    for rank in range(1, 5):
        assert f"root blocker {rank}:" in all_text, text
    pid = scene.pids["bulk"]  # its rows: a table's (status, pid) or one line's (pid, status)
    bulk = [line for line in screen if re.search(rf"held\s+{pid}\s|^\s*\+?{pid}\s+held", line)]
    assert len(bulk) <= 1, text
    if size[0] >= 40:  # room for the folded row: it counts the worker's 3,000 locks
        assert bulk and f"{BULK} x invoice_pdf_export 20000..22999" in bulk[0], text
