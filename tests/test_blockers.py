"""Wait-for chains, roots, queued waiters and cycles, with real sessions."""

from __future__ import annotations

import io
import json
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import CheckPolicy
from lockdiag.core.graph import Blockers, behind
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import take_snapshot
from lockdiag.registry import Registry, parse_registry
from lockdiag.render import plain

from conftest import Sessions, Worker

REGISTRY = "[namespaces.tenant_summary]\nid = 4102\n"


@pytest.fixture(autouse=True)
def registry_file(tmp_path: Path) -> None:
    (tmp_path / "lockdiag.toml").write_text(REGISTRY)  # tests run in tmp_path


def registry() -> Registry:
    parsed, _ = parse_registry(REGISTRY)
    assert parsed is not None
    return parsed


def graph(cluster: Cluster) -> Blockers:
    return Diagnosis(take_snapshot(cluster.dsn(), 5, "all"), registry()).graph


def three_level_chain(sessions: Sessions) -> tuple[Worker, Worker, Worker]:
    """A holds a table lock, idle in transaction; B holds an advisory lock and waits for the
    table; C waits for B's advisory lock."""
    a = sessions.open("table-owner", autocommit=False)
    a.run("LOCK TABLE items IN SHARE MODE")
    b = sessions.open("middle", autocommit=False)
    b.run("SELECT pg_advisory_xact_lock(4102, 1)")
    b.start("UPDATE items SET note = 'b' WHERE id = 1")
    sessions.waiting(b)
    c = sessions.open("leaf")
    c.start("SELECT pg_advisory_lock(4102, 1)")
    sessions.waiting(c)
    return a, b, c


def test_three_level_chain_mixing_table_and_advisory_locks(
    cluster: Cluster, sessions: Sessions
) -> None:
    a, b, c = three_level_chain(sessions)
    report = graph(cluster)
    (root,) = report.roots
    assert root.tree.pid == a.pid
    assert (root.direct, root.total) == (1, 2)
    assert [child.pid for child in root.tree.children] == [b.pid]
    assert [grandchild.pid for grandchild in root.tree.children[0].children] == [c.pid]
    assert root.longest_wait is not None and root.longest_wait >= 0
    assert behind(report, a.pid) == [b.pid, c.pid]
    assert report.cycles == []
    b_waits = report.nodes[b.pid].waits
    assert b_waits is not None and b_waits.lock.locktype == "relation"

    text = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()]).stdout
    lines = text.splitlines()
    assert lines[0] == (
        f"root blocker 1: relation public.items  pid {a.pid} (table-owner) · blocks 1 directly,"
        " 2 in total, longest wait " + lines[0].split()[-1]
    )
    assert lines[1].startswith(f"pid {a.pid} table-owner [idle in transaction")
    assert "holds relation public.items" in lines[1]
    assert lines[2].startswith(f"└─ pid {b.pid} middle [active")
    assert "for relation public.items (RowExclusiveLock)" in lines[2]
    assert lines[3].startswith(f"   └─ pid {c.pid} leaf [active")
    assert (
        lines[3].endswith("for unregistered pair (4102, 1) (ExclusiveLock)") or "for " in lines[3]
    )

    document = json.loads(
        CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn(), "--format", "json"]).stdout
    )
    assert {(e["waiter"], e["blocker"], e["kind"]) for e in document["edges"]} == {
        (b.pid, a.pid, "holds"), (c.pid, b.pid, "holds")
    }  # fmt: skip
    assert document["roots"][0]["tree"]["children"][0]["children"][0]["pid"] == c.pid


def test_who_holds_sees_that_the_holder_waits_for_a_table_lock(
    cluster: Cluster, sessions: Sessions
) -> None:
    """The holder of the key waits for a table lock: the verdict names the table lock's
    owner as the root, and the next step is no step against the holder (ending it would
    free the leaf for a moment and leave the cause in place)."""
    a, b, _ = three_level_chain(sessions)
    result = CliRunner().invoke(cli, ["who-holds", "tenant_summary", "1", "--dsn", cluster.dsn()])
    verdict = result.stdout.splitlines()
    text = "\n".join(verdict)
    cause = next(line for line in verdict if "root blocker" in line)
    assert f"held by pid {b.pid} (middle), which waits for" in cause, text
    assert f"pid {a.pid} (table-owner) is the worst root blocker" in cause, text
    assert f"terminate {b.pid}" not in text, text
    document = json.loads(
        CliRunner()
        .invoke(cli, ["who-holds", "tenant_summary", "1", "--dsn", cluster.dsn(), "--format",
                      "json"])
        .stdout
    )  # fmt: skip
    assert str(a.pid) in document["verdict"] and f"terminate {b.pid}" not in str(
        document["next_step"]
    )


def test_waiter_queued_behind_a_waiter_is_not_a_holder(
    cluster: Cluster, sessions: Sessions
) -> None:
    reader = sessions.open("reader")
    reader.run("SELECT pg_advisory_lock_shared(7, 7)")
    writer = sessions.open("writer")
    writer.start("SELECT pg_advisory_lock(7, 7)")
    sessions.waiting(writer)
    second_reader = sessions.open("second-reader")
    second_reader.start("SELECT pg_advisory_lock_shared(7, 7)")  # compatible with the reader
    sessions.waiting(second_reader)

    report = graph(cluster)
    kinds = {(e.waiter, e.blocker): e.kind for e in report.edges}
    assert kinds == {(writer.pid, reader.pid): "holds", (second_reader.pid, writer.pid): "queued"}
    (root,) = report.roots
    assert root.tree.pid == reader.pid
    (writer_tree,) = root.tree.children
    (queued,) = writer_tree.children
    assert (
        queued.pid == second_reader.pid and queued.edge is not None and queued.edge.kind == "queued"
    )
    text = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()]).stdout
    assert f"queued behind waiter {writer.pid} (not a holder)" in text


def test_cycle_is_shown_once(cluster: Cluster, sessions: Sessions) -> None:
    """The test cluster's deadlock_timeout is 60s: the deadlock stays visible meanwhile."""
    first = sessions.open("first", autocommit=False)
    second = sessions.open("second", autocommit=False)
    first.run("SELECT pg_advisory_xact_lock(9, 1)")
    second.run("SELECT pg_advisory_xact_lock(9, 2)")
    first.start("SELECT pg_advisory_xact_lock(9, 2)")
    sessions.waiting(first)
    second.start("SELECT pg_advisory_xact_lock(9, 1)")
    sessions.waiting(second)

    report = graph(cluster)
    assert report.roots == []
    assert report.cycles == [sorted([first.pid, second.pid])]
    text = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()]).stdout
    low, high = sorted([first.pid, second.pid])
    assert f"{low} → {high} → {low}" in text


def test_no_waits(cluster: Cluster, sessions: Sessions) -> None:
    sessions.open("idle").run("SELECT pg_advisory_lock(1, 1)")
    result = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()])
    assert result.exit_code == 0
    assert result.stdout.strip() == "no session waits for a lock"


def test_parallel_workers_fold_into_their_leader(cluster: Cluster, sessions: Sessions) -> None:
    setup = sessions.open("setup")
    setup.run("CREATE TABLE IF NOT EXISTS wide AS SELECT g FROM generate_series(1, 200000) g")
    setup.run("ANALYZE wide")
    reporter = sessions.open("reporter")
    reporter.run(
        "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0; "
        "SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0"
    )
    reporter.start("SELECT count(*) FROM wide WHERE pg_sleep(0.0001) IS NOT NULL")
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE leader_pid = %s AND pid <> %s",
                (reporter.pid, reporter.pid),
            ).fetchone()[0]  # type: ignore[index]
            > 0
        ),
        10,
        "parallel workers to start",
    )
    ddl = sessions.open("ddl")
    ddl.start("ALTER TABLE wide ADD COLUMN x int")
    sessions.waiting(ddl)
    report = graph(cluster)
    (root,) = report.roots
    assert root.tree.pid == reporter.pid  # the leader, not a worker, once
    assert [child.pid for child in root.tree.children] == [ddl.pid]
    assert report.nodes[reporter.pid].workers  # the workers, folded into their leader
    assert all(pid not in report.nodes for pid in report.nodes[reporter.pid].workers)
    text = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()]).stdout
    assert "parallel worker(s)) holds relation public.wide" in text


def test_prepared_transaction_holds_a_lock(cluster: Cluster, sessions: Sessions) -> None:
    """A forgotten prepared transaction keeps its locks with no session at all."""
    preparer = sessions.open("preparer", autocommit=False)
    preparer.run("SELECT pg_advisory_xact_lock(8, 8)")
    preparer.run("PREPARE TRANSACTION 'lockdiag_test'")
    try:
        waiter = sessions.open("waiter")
        waiter.start("SELECT pg_advisory_lock(8, 8)")
        sessions.waiting(waiter)
        report = graph(cluster)
        (root,) = report.roots
        assert root.tree.pid == 0
        assert [child.pid for child in root.tree.children] == [waiter.pid]
        text = CliRunner().invoke(cli, ["blockers", "--dsn", cluster.dsn()]).stdout
        assert (
            "a prepared transaction (pid 0: COMMIT PREPARED or ROLLBACK PREPARED ends it)" in text
        )
        listed = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(), "--format", "json"])
        held = [lock for lock in json.loads(listed.stdout)["locks"] if lock["granted"]]
        assert [lock["pid"] for lock in held] == [None]  # no session owns it any more
        shown = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn()]).stdout
        assert f"prepared {held[0]['virtualtransaction']}" in shown
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("ROLLBACK PREPARED 'lockdiag_test'")


# -- the bundled incident: the incident's order, a screen's fitting, markdown -------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def bundled() -> Diagnosis:
    from lockdiag.core.snapshot_file import load
    from lockdiag.registry import load_registry

    names = load_registry(str(EXAMPLES / "lockdiag.toml"))
    return Diagnosis(load(EXAMPLES / "incident.json"), names)


def test_chains_in_the_incident_order_named_as_check_names_them() -> None:
    from lockdiag.views.blockers import blockers_output
    from lockdiag.views.check import cause_heading
    from lockdiag.views.watch import CHECK

    diagnosis = bundled()
    incident = diagnosis.incident(CHECK)
    graph = diagnosis.graph
    roots = [c.pid for c in incident.causes if c.root is not None]
    assert [r.tree.pid for r in graph.roots] == roots  # the graph's order is the incident's
    lines = plain(blockers_output(incident).blocks())
    headings = [line for line in lines.splitlines() if line.startswith("root blocker")]
    assert len(headings) == len(roots)
    first, _ = cause_heading(incident.alerting[0])
    name = first.split(": ", 1)[1]  # "tenant_summary 73 (+1 more)  pid 4163 (billing-worker)"
    assert headings[0].startswith(f"root blocker 1: {name} · blocks 2 directly")


def test_a_small_screen_keeps_every_heading_and_counts_the_rest() -> None:
    from lockdiag.views.blockers import blockers_output

    output = blockers_output(bundled().incident(CheckPolicy()))
    assert output.screen is not None
    fitted = plain(output.screen(60, 12)).splitlines()
    assert sum(line.startswith("root blocker") for line in fitted) == 2
    assert any("more session(s) in this chain" in line for line in fitted), fitted
    assert len(fitted) <= 12 - 1, fitted  # the shell's prompt after it
    assert all(len(line) <= 60 for line in fitted), fitted
    wrapped = plain(output.screen(60, 200)).splitlines()
    assert all(len(line) <= 60 for line in wrapped), wrapped
    # a wrapped line keeps the tree's indent: under a child, the bars and spaces go on
    index = next(i for i, line in enumerate(wrapped) if line.startswith("├─ pid 9933"))
    assert wrapped[index + 1].startswith("│     "), wrapped


def test_markdown_is_a_pipe_table_of_every_session() -> None:
    from lockdiag.render import render
    from lockdiag.views.blockers import blockers_output

    document = io.StringIO()
    render(blockers_output(bundled().incident(CheckPolicy())), "markdown", document)
    text = document.getvalue()
    assert "```" not in text, text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert [cell.strip() for cell in rows[0].split("|")[1:-1]] == [
        "root", "position", "pid", "application", "state", "lock", "blocked by", "wait"
    ]  # fmt: skip
    body = rows[2:]
    assert len(body) == 5  # two roots, three waiters
    root = next(r for r in body if "4163" in r and "holds" in r)
    assert "tenant\\_summary 73" in root and "root" in root
    waiter = next(r for r in body if "| 9933 " in r)
    assert "pid 4163" in waiter and "7m28s" in waiter and "ExclusiveLock" in waiter


# -- which figure is which ---------------------------------------------------------------------


def test_a_chatty_holder_shows_both_figures_and_what_each_means(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A holder that runs SELECT 1 every 200 ms on its connection while it holds a session
    lock: its lower bound (since its last change of state) stays under a second while its
    waiter's wait grows. Side by side the two figures would read as a contradiction: check,
    blockers, who-holds and list say what each one means, never dating the holder by the
    queue."""
    import threading
    import time

    holder = sessions.open("chatty")
    holder.run("SELECT pg_advisory_lock(4102, 9)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(4102, 9)")
    sessions.waiting(waiter)
    stop = threading.Event()

    def chat() -> None:
        while not stop.wait(0.2):
            holder.run("SELECT 1")

    chatter = threading.Thread(target=chat, daemon=True)
    chatter.start()
    try:
        time.sleep(3)
        meaning = "counts from the holder's last change of state, as PostgreSQL records no lock"
        args = ["--dsn", cluster.dsn(), "--format", "plain"]
        text = shown_once(["blockers", *args], meaning)
        row = text.splitlines()[1]
        assert row.startswith(f"pid {holder.pid} chatty [idle ") and meaning in row, text
        assert "its oldest waiter has waited 3" in row, row
        assert "by this session or by one before it" in row, row
        shown = shown_once(["who-holds", "tenant_summary", "9", *args], meaning)
        assert any(line.startswith("figures: held ≥ ") for line in shown.splitlines()), shown
        checked = shown_once(["check", "--wait-age", "1s", *args], meaning)
        assert any(line.startswith("  figures: held ≥ ") for line in checked.splitlines())
        listed = shown_once(["list", *args], meaning)
        note = f"figures: pid {holder.pid}: held ≥ "
        assert any(line.startswith(note) for line in listed.splitlines()), listed
    finally:
        stop.set()
        chatter.join(5)


def shown_once(args: list[str], text: str, tries: int = 20) -> str:
    """The output of the first of ``tries`` runs that shows ``text`` (a chatty holder has a
    lower bound only when the read finds it between two of its queries), else the last."""
    for _ in range(tries):
        output = CliRunner().invoke(cli, args).stdout
        if text in output:
            break
    return output
