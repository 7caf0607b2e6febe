"""A messy incident on a real server, seen through every view at 80x24, 120x40 and 200x50.

One module-scoped fixture builds it with real concurrent sessions and saves one snapshot with
`lockdiag snapshot`; every test then reads that file, so what follows is deterministic:

- a leaked session lock: billing-worker holds ``invoice_pdf_export 2041`` (nobody waits; it
  sorts first) and ``invoice_pdf_export 9000``, which four sessions wait for: the worst root;
- a holder idle in transaction with a transaction-level lock one session waits for;
- a three-level advisory chain: A holds k1; B holds k2 and waits for k1; C waits for k2;
- a table lock at the root of a chain that ends in an advisory wait (D: LOCK TABLE; E holds
  an xact advisory lock and waits on SELECT; F waits for E's advisory lock);
- a worker with 500 uncontested session locks ``invoice_pdf_export 10000..10499``;
- idle sessions, about 27 in all.

The first line of each view that names a cause, a root or a lock names billing-worker's pid and
its contended key (not the uncontested key that sorts first); JSON says the same; folds count
real locks; nothing scrolls off the top.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster

from helpers.browser import browse
from helpers.cli import output
from helpers.servers import Sessions
from helpers.terminal import screen_once, shown

SIZES = [(24, 80), (40, 120), (50, 200)]
SIZE_IDS = [f"{columns}x{rows}" for rows, columns in SIZES]

PDF_ID, SUMMARY_ID, REPORT_ID, LEDGER_ID = 4200, 4102, 4300, 4400
CONTENDED = "invoice_pdf_export 9000"  # four sessions wait for it
UNCONTESTED = "invoice_pdf_export 2041"  # billing-worker's other lock: it sorts first
FOLD = "500 x invoice_pdf_export 10000..10499"
# check's defaults (nothing is old yet: warnings only), and thresholds under every age in the
# snapshot (every holder and wait is critical)
THRESHOLDS = [(), ("--session-age", "50ms,100ms", "--wait-age", "50ms,100ms",
                   "--idle-age", "50ms,100ms")]  # fmt: skip
THRESHOLD_IDS = ["defaults", "low-thresholds"]
NAMESPACES = ("invoice_pdf_export", "tenant_summary", "report_cache", "ledger_sync", "leader")
REGISTRY_TEXT = f"""\
[namespaces.invoice_pdf_export]
id = {PDF_ID}
form = "pair"
description = "Render one invoice's PDF"
owner = "billing"
expect = "xact"           # a certain session lock here is a finding

[namespaces.tenant_summary]
id = {SUMMARY_ID}
form = "pair"
description = "Rebuild one tenant's summary"
owner = "reporting"
expect = "xact"

[namespaces.report_cache]
id = {REPORT_ID}
form = "pair"
description = "Refresh one cached report"
owner = "reporting"
expect = "any"

[namespaces.ledger_sync]
id = {LEDGER_ID}
form = "pair"
description = "Sync one ledger account"
owner = "finance"
expect = "any"

[namespaces.leader]
id = 1
form = "pair"
description = "Scheduler leader election"
owner = "platform"
expect = "session"
"""


# -- the scenario --------------------------------------------------------------------------------


@dataclass
class Incident:
    """The saved snapshot, its registry, and who is who in it."""

    snapshot: Path
    registry: Path
    recording: Path
    billing: int
    pdf_waiters: list[int]
    stuck: int
    stuck_waiter: int
    chain: tuple[int, int, int]
    table: tuple[int, int, int]
    bulk: int
    total: int
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def source(self) -> list[str]:
        return ["--from", str(self.snapshot), "--registry", str(self.registry)]


@pytest.fixture(scope="module")
def incident(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Incident]:
    scratch = tmp_path_factory.mktemp("messy")
    registry = scratch / "lockdiag.toml"
    registry.write_text(REGISTRY_TEXT)
    opened = Sessions(cluster)
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE TABLE IF NOT EXISTS messy_t (id int PRIMARY KEY)")
        # the leaked session lock: two keys, the one that sorts first uncontested
        billing = opened.open("billing-worker")
        billing.run(f"SELECT pg_advisory_lock({PDF_ID}, 2041)")
        billing.run(f"SELECT pg_advisory_lock({PDF_ID}, 9000)")
        pdf_waiters = [opened.open(f"pdf-render-{n}") for n in range(1, 5)]
        for waiter in pdf_waiters:
            waiter.start(f"SELECT pg_advisory_lock({PDF_ID}, 9000)")
        opened.waiting(*pdf_waiters, timeout=15)
        # a holder idle in transaction, one waiter
        stuck = opened.open("summary-worker", autocommit=False)
        stuck.run(f"SELECT pg_advisory_xact_lock({SUMMARY_ID}, 73)")
        stuck_waiter = opened.open("summary-retry")
        stuck_waiter.start(f"SELECT pg_advisory_xact_lock({SUMMARY_ID}, 73)")
        opened.waiting(stuck_waiter, timeout=15)
        # three levels: A holds k1; B holds k2 and waits for k1; C waits for k2
        chain_a, chain_b, chain_c = (opened.open(f"cache-{n}") for n in "abc")
        chain_a.run(f"SELECT pg_advisory_lock({REPORT_ID}, 1)")
        chain_b.run(f"SELECT pg_advisory_lock({REPORT_ID}, 2)")
        chain_b.start(f"SELECT pg_advisory_lock({REPORT_ID}, 1)")
        opened.waiting(chain_b, timeout=15)
        chain_c.start(f"SELECT pg_advisory_lock({REPORT_ID}, 2)")
        opened.waiting(chain_c, timeout=15)
        # a table lock at the root of a chain that ends in an advisory wait
        table_d = opened.open("schema-migrate", autocommit=False)
        table_d.run("LOCK TABLE messy_t IN ACCESS EXCLUSIVE MODE")
        table_e = opened.open("ledger-report", autocommit=False)
        table_e.run(f"SELECT pg_advisory_xact_lock({LEDGER_ID}, 5)")
        table_e.start("SELECT * FROM messy_t")
        opened.waiting(table_e, timeout=15)
        table_f = opened.open("ledger-sync")
        table_f.start(f"SELECT pg_advisory_lock({LEDGER_ID}, 5)")
        opened.waiting(table_f, timeout=15)
        # 500 uncontested session locks in one statement
        bulk = opened.open("pdf-prewarm")
        bulk.run(f"SELECT pg_advisory_lock({PDF_ID}, n) FROM generate_series(10000, 10499) n")
        # idle sessions, about 27 in all
        for n in range(1, 14):
            opened.open(f"web-{n}")
        everyone = [*pdf_waiters, stuck_waiter, chain_b, chain_c, table_e, table_f]
        opened.waiting(*everyone, timeout=15)
        snapshot = scratch / "incident.json"
        output("snapshot", "-o", str(snapshot), "--dsn", cluster.dsn())
        recording = scratch / "incident.jsonl"
        recording.write_text(json.dumps(json.loads(snapshot.read_text())) + "\n")
        yield Incident(
            snapshot=snapshot,
            registry=registry,
            recording=recording,
            billing=billing.pid,
            pdf_waiters=[w.pid for w in pdf_waiters],
            stuck=stuck.pid,
            stuck_waiter=stuck_waiter.pid,
            chain=(chain_a.pid, chain_b.pid, chain_c.pid),
            table=(table_d.pid, table_e.pid, table_f.pid),
            bulk=bulk.pid,
            total=len(opened.workers),
            pids={s.name: s.pid for s in opened.workers},
        )
    finally:
        opened.close()


# -- a real terminal -----------------------------------------------------------------------------


def nonblank(screen: tuple[str, ...]) -> list[str]:
    return [line for line in screen if line.strip()]


def names_a_lock(line: str, incident: Incident) -> bool:
    """The line names a cause, a root or a lock: a namespace, a relation, a root blocker or
    one of the scenario's pids."""
    if any(namespace in line for namespace in NAMESPACES):
        return True
    if "relation " in line or "root blocker" in line:
        return True
    words = set(re.findall(r"\d+", line))
    return any(str(pid) in words for pid in incident.pids.values())


def first_naming(screen: tuple[str, ...], incident: Incident) -> tuple[str, str]:
    """The first line that names a cause, root or lock, and the line after it (a long
    heading wraps)."""
    lines = list(screen)
    for index, line in enumerate(lines):
        if names_a_lock(line, incident):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            return line, following
    raise AssertionError(f"no line names a lock:\n{shown(screen)}")


def assert_names_the_cause(screen: tuple[str, ...], incident: Incident) -> None:
    """The first line naming a lock names billing-worker's pid and its contended key, not
    the uncontested key that sorts first."""
    line, following = first_naming(screen, incident)
    text = shown(screen)
    assert CONTENDED in line, f"first line naming a lock: {line!r}\n{text}"
    if UNCONTESTED in line:
        assert line.index(CONTENDED) < line.index(UNCONTESTED), f"{line!r}\n{text}"
    pid_words = re.findall(r"\d+", f"{line} {following}")
    assert str(incident.billing) in pid_words, f"pid {incident.billing} not in {line!r}\n{text}"


def check_json(incident: Incident, *extra: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        output("check", *extra, *incident.source, "--format", "json", codes=(0, 1, 2))
    )
    return document


def verdict_of(document: dict[str, Any]) -> str:
    summary = document["summary"]
    return (
        f"{document['status']}: {summary['critical']} critical, {summary['warning']} warning "
        f"cause(s); {summary['waiting']} session(s) waiting"
    )


def list_json(incident: Incident, *extra: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        output("list", *extra, *incident.source, "--format", "json")
    )
    return document


def label(lock: dict[str, Any]) -> str:
    if lock["namespace"]:
        return f"{lock['namespace']} {lock['resource']}"
    return str(lock["locktype"])


# -- the scenario is in the snapshot -------------------------------------------------------------


def test_the_snapshot_holds_the_whole_scenario(incident: Incident) -> None:
    """Not a view under test: the incident the other tests rely on is really in the file."""
    saved = json.loads(incident.snapshot.read_text())
    assert incident.total == 27
    document = json.loads(output("blockers", *incident.source, "--format", "json"))
    roots = [(r["pid"], r["direct"], r["total"]) for r in document["roots"]]
    chain_a, _, _ = incident.chain
    table_d, _, _ = incident.table
    assert roots[0] == (incident.billing, 4, 4), roots
    assert sorted(roots[1:]) == sorted(
        [(chain_a, 1, 2), (table_d, 1, 2), (incident.stuck, 1, 1)]
    ), roots
    every = list_json(incident, "--all")["locks"]
    assert sum(1 for lock in every if lock["pid"] == incident.bulk) == 500
    waiting = {lock["pid"] for lock in every if not lock["granted"]}
    assert waiting == {*incident.pdf_waiters, incident.stuck_waiter, *incident.chain[1:],
                       *incident.table[1:]}  # fmt: skip
    held = {label(lock) for lock in every if lock["pid"] == incident.billing and lock["granted"]}
    assert {CONTENDED, UNCONTESTED} <= held
    table_locks = [lock for lock in every if lock["pid"] == table_d and lock["granted"]]
    assert any(lock["mode"] == "AccessExclusiveLock" for lock in table_locks)
    in_file = {session["pid"]: session for session in saved["sessions"]}
    assert set(incident.pids.values()) <= set(in_file)
    assert {in_file[pid]["application_name"] for pid in incident.pids.values()} == set(
        incident.pids
    )
    assert in_file[incident.stuck]["state"] == "idle in transaction"
    assert in_file[table_d]["state"] == "idle in transaction"
    assert in_file[incident.billing]["state"] == "idle"


# -- JSON ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=THRESHOLD_IDS)
def test_check_json_first_cause_is_the_leaked_session_lock(
    incident: Incident, thresholds: tuple[str, ...]
) -> None:
    first = check_json(incident, *thresholds)["causes"][0]
    if thresholds:  # every age in the snapshot is over these
        assert first["severity"] == "critical", first
    assert first["pid"] == incident.billing, first
    assert first["lock"] == CONTENDED, first
    assert first["blocked"] == 4 and first["blocked_directly"] == 4, first
    assert first["contended"][0]["lock"] == CONTENDED, first
    assert first["contended"][0]["waiting"] == 4, first


def test_blockers_json_first_root_is_the_leaked_session_lock(incident: Incident) -> None:
    document = json.loads(output("blockers", *incident.source, "--format", "json"))
    root = document["roots"][0]
    assert root["pid"] == incident.billing, root
    assert (root["direct"], root["total"]) == (4, 4), root
    assert sorted(child["pid"] for child in root["tree"]["children"]) == incident.pdf_waiters
    (node,) = [n for n in document["nodes"] if n["pid"] == incident.billing]
    contended = [label(lock) for lock in node["holds"] if lock["blocks"]]
    assert contended == [CONTENDED], node["holds"]


def test_list_json_names_the_contended_key_as_the_lock_four_wait_for(incident: Incident) -> None:
    """`list --format json` has no causes: its lock others wait for most is billing-worker's
    contended key, and the key that sorts first blocks nobody."""
    locks = list_json(incident)["locks"]
    worst = max(locks, key=lambda lock: len(lock["blocks"]))
    assert (worst["pid"], label(worst)) == (incident.billing, CONTENDED), worst
    assert sorted(worst["blocks"]) == incident.pdf_waiters
    (other,) = [lock for lock in locks if label(lock) == UNCONTESTED]
    assert other["pid"] == incident.billing and other["blocks"] == []
    waiters = [lock for lock in locks if not lock["granted"] and label(lock) == CONTENDED]
    assert sorted(w["pid"] for w in waiters) == incident.pdf_waiters
    assert all(w["waits_for"] == [incident.billing] for w in waiters)


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=THRESHOLD_IDS)
def test_check_text_and_json_agree_on_severities_and_counts(
    incident: Incident, thresholds: tuple[str, ...]
) -> None:
    document = check_json(incident, *thresholds)
    plain = output("check", *thresholds, *incident.source, "--format", "plain", codes=(0, 1, 2))
    lines = plain.splitlines()
    summary = document["summary"]
    assert lines[0] == verdict_of(document), plain
    headings = [line for line in lines[1:] if re.match(r"^(CRITICAL|WARNING) ", line)]
    assert len(headings) == len(document["causes"]) == summary["critical"] + summary["warning"]
    for heading, cause in zip(headings, document["causes"], strict=True):
        assert heading.startswith(f"{cause['severity'].upper()} {cause['kind']}: {cause['lock']}")
        assert f"pid {cause['pid']}" in heading
    for severity in ("critical", "warning"):
        assert sum(c["severity"] == severity for c in document["causes"]) == summary[severity]
    assert summary["waiting"] == 9  # 4 + 1 + 2 (chain) + 2 (behind the table lock)
    assert lines[-1] == lines[0] or not lines[-1].startswith(("CRITICAL:", "WARNING:", "OK:"))


# -- a real terminal, three sizes ----------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=THRESHOLD_IDS)
def test_check_on_a_terminal(
    incident: Incident, size: tuple[int, int], thresholds: tuple[str, ...]
) -> None:
    screen = screen_once(("check", *thresholds, *incident.source), size)
    text = shown(screen)
    lines = nonblank(screen)
    document = check_json(incident, *thresholds)
    verdict = verdict_of(document)
    assert lines[0] == verdict, f"top line {lines[0]!r}, JSON says {verdict!r}:\n{text}"
    assert lines[-1] == verdict, f"bottom line {lines[-1]!r}, JSON says {verdict!r}:\n{text}"
    assert_names_the_cause(screen, incident)
    first = document["causes"][0]
    heading, _ = first_naming(screen, incident)
    expected = f"{first['severity'].upper()} {first['kind']}: {CONTENDED}"
    assert heading.startswith(expected), f"{heading!r} is not {expected!r}...:\n{text}"
    # every cause's heading between the verdicts, as many as the verdict counts
    joined = " ".join(line.strip() for line in screen)
    for cause in document["causes"]:
        start = f"{cause['severity'].upper()} {cause['kind']}: {cause['lock']}"
        assert start in joined and f"pid {cause['pid']}" in joined, f"{start!r}:\n{text}"
    headings = [line for line in screen if re.match(r"^(CRITICAL|WARNING) [a-z-]+: ", line)]
    summary = document["summary"]
    assert len(headings) == summary["critical"] + summary["warning"], text


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("every", [False, True], ids=["list", "list-all"])
def test_list_on_a_terminal(incident: Incident, size: tuple[int, int], every: bool) -> None:
    extra = ("--all",) if every else ()
    screen = screen_once(("list", *extra, *incident.source), size)
    text = shown(screen)
    lines = nonblank(screen)
    # nothing scrolled off: the header (or, on a narrow screen, the first row) on top
    assert lines[0].startswith("LOCK") or names_a_lock(lines[0], incident), text
    assert_names_the_cause(screen, incident)
    first, _ = first_naming(screen, incident)
    assert re.match(rf"^\s*(invoice_pdf_export 9000\s.*\s)?{incident.billing}\s", first), text
    assert "held" in first and "WAITING" not in first, first  # the holder, then its waiters
    # one count line, with the real counts
    document = list_json(incident, *extra)
    total, waiting = document["total"], sum(not lock["granted"] for lock in document["locks"])
    joined = " ".join(line.strip() for line in screen)
    count = f"{total} lock(s), {waiting} waiting"
    assert joined.count(count) == 1, f"not once {count!r}:\n{text}"
    assert "more row(s) not shown" not in text, text  # one count, in the summary
    # what it says it shows is what is on screen: a fold row stands for its N locks
    rows = [line for line in screen if re.search(r"\s(held|WAITING)\s", line)]
    on_screen = sum(
        int(fold.group(1)) if (fold := re.search(r"\b(\d+) x [a-z_]+ \d+\.\.\d+", row)) else 1
        for row in rows
    )
    said = re.search(r"; (\d+) shown here", joined)
    says = int(said.group(1)) if said else total
    assert says == on_screen, f"says {says} shown, {on_screen} on screen:\n{text}"


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_list_folds_count_real_locks(incident: Incident, size: tuple[int, int]) -> None:
    """The 500-lock worker's locks are one row, `500 x invoice_pdf_export 10000..10499`, at
    every size; any fold row says how many locks it stands for, all of them."""
    for extra in ((), ("--all",)):
        screen = screen_once(("list", *extra, *incident.source), size)
        text = shown(screen)
        folds = [line for line in screen if re.search(r"\b\d+ x invoice_pdf_export ", line)]
        if not extra:
            assert any(FOLD in line for line in folds), f"no {FOLD!r} row:\n{text}"
        for line in folds:
            assert FOLD in line, f"a fold that does not count the 500 locks: {line!r}\n{text}"
        rows = [line for line in screen if re.search(rf"(^|\s){incident.bulk}\s", line)]
        assert len(rows) <= 1, f"pid {incident.bulk}'s locks not folded into one row:\n{text}"


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_blockers_on_a_terminal(incident: Incident, size: tuple[int, int]) -> None:
    screen = screen_once(("blockers", *incident.source), size)
    text = shown(screen)
    lines = nonblank(screen)
    assert lines[0].startswith(f"root blocker 1: {CONTENDED}"), text  # nothing scrolled off
    assert_names_the_cause(screen, incident)
    joined = " ".join(line.strip() for line in screen)
    assert f"pid {incident.billing} (billing-worker)" in joined, text
    for rank in (2, 3, 4):  # every root's heading stays on screen
        assert f"root blocker {rank}:" in joined, text
    assert "root blocker 5:" not in joined, text
    assert all(len(line) <= size[1] for line in screen)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_watch_on_a_terminal(incident: Incident, size: tuple[int, int]) -> None:
    args = ("watch", "--from", str(incident.recording), "--registry", str(incident.registry),
            "--interval", "60s")  # fmt: skip
    screen = screen_once(args, size, keys="q")
    text = shown(screen)
    lines = nonblank(screen)
    assert lines[0].startswith("lockdiag watch"), text  # its header, on top
    assert any("q quit" in line for line in screen), text  # its footer, whole
    assert_names_the_cause(screen, incident)
    root = next(line for line in screen if line.startswith("root blocker 1:"))
    assert root.startswith(f"root blocker 1: {CONTENDED}"), text


# -- the exporter's `/` page, rendered by a real browser -----------------------------------------

# what the page shows of a target, and a script that writes down which of its lines are inside
# the viewport, top to bottom, once the browser laid the page out (--dump-dom keeps it)
SEEN_SCRIPT = """<script>
(() => {
  const seen = [];
  for (const node of document.querySelectorAll('h1, h2, h3, p, li, summary, dt, dd')) {
    const box = node.getBoundingClientRect();
    if (box.height > 0 && box.top >= 0 && box.bottom <= window.innerHeight + 1) {
      seen.push(node.innerText.replace(/\\s+/g, ' ').trim());
    }
  }
  const out = document.createElement('pre');
  out.id = 'seen';
  out.dataset.viewport = window.innerWidth + 'x' + window.innerHeight;
  out.textContent = seen.join('\\n');
  document.body.appendChild(out);
})();
</script>"""


@dataclass
class PageTarget:
    """What the page reads of the exporter's Target."""

    name: str
    report: Any
    error: str | None = None
    seconds: float = 0.0123
    taken_at: float = field(default_factory=time.monotonic)
    down_since: float | None = None
    stalled: bool = False


@pytest.fixture(scope="module")
def page_file(incident: Incident) -> Path:
    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.core.findings import CheckPolicy
    from lockdiag.core.snapshot_file import load
    from lockdiag.registry import load_registry
    from lockdiag.views.exporter import page

    policy = CheckPolicy()
    diagnosis = Diagnosis(
        load(incident.snapshot), load_registry(str(incident.registry)), policy.analysis_policy()
    )
    markup = page([PageTarget("db1.example:5432/postgres", diagnosis.incident(policy))], 1.0)
    assert markup.count("</body>") == 1
    path = incident.snapshot.with_name("page.html")
    path.write_text(markup.replace("</body>", f"{SEEN_SCRIPT}</body>"))
    return path


def seen_in_browser(page: Path, width: int, height: int, profile: Path) -> tuple[str, list[str]]:
    """The viewport chromium laid out, and the page's lines inside it, top to bottom."""
    done = browse(page.as_uri(), profile, f"--window-size={width},{height}", "--dump-dom")
    found = re.search(
        r"<pre id=\"seen\" data-viewport=\"(\d+x\d+)\">(.*?)</pre>", done.stdout, re.S
    )
    assert found is not None, done.stdout[-2000:]
    return found.group(1), [html.unescape(line) for line in found.group(2).splitlines()]


# a terminal's size in a browser's pixels: a cell about 8x16
VIEWPORTS = [(columns * 8, rows * 16) for rows, columns in SIZES]


@pytest.fixture(scope="module")
def window_frame(page_file: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """How many pixels of a headless window's height are not viewport (its frame)."""
    profile = tmp_path_factory.mktemp("chromium")
    laid_out, _ = seen_in_browser(page_file, 800, 600, profile)
    return 600 - int(laid_out.split("x")[1])


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def test_exporter_page_in_a_browser(
    incident: Incident,
    page_file: Path,
    window_frame: int,
    viewport: tuple[int, int],
    tmp_path: Path,
) -> None:
    """At three viewports: the header on top, the verdict and the first cause inside the
    viewport, and the first line naming a lock names billing-worker and its contended key."""
    width, height = viewport
    laid_out, seen = seen_in_browser(page_file, width, height + window_frame, tmp_path / "p")
    assert laid_out == f"{width}x{height}", f"viewport {laid_out}, frame {window_frame}"
    text = "\n".join(seen)
    assert seen, f"nothing inside the {laid_out} viewport"
    assert seen[0] == "lockdiag exporter", text  # its header, on top
    verdict = verdict_of(check_json(incident))
    assert verdict in seen, f"the verdict is not inside the {laid_out} viewport:\n{text}"
    naming = [line for line in seen if names_a_lock(line, incident)]
    assert naming, f"no cause inside the {laid_out} viewport:\n{text}"
    first = naming[0]
    assert CONTENDED in first, f"first line naming a lock: {first!r}\n{text}"
    assert f"pid {incident.billing}" in first, f"first line naming a lock: {first!r}\n{text}"
    if UNCONTESTED in first:
        assert first.index(CONTENDED) < first.index(UNCONTESTED), first
    assert seen.index(verdict) < seen.index(first), text
