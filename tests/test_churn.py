"""Exact under load: a busy server, real workers at a high rate, every read command run again
and again. No claim of certainty may be false, ordinary contention raises no finding, and real
leaks planted in the middle of the churn are found in every run.

The workers are pgbench clients (C, so the rate is the server's, not Python's):
- 24 take only transaction-level locks (BEGIN; pg_advisory_xact_lock(4102, k); COMMIT) over 30
  keys, some idle up to 1.5 s between bursts. Any "session" lifetime on 4102 is false.
- 8 take session locks and release them properly (pg_advisory_lock, then pg_advisory_unlock)
  in namespace 4103.
Planted in the middle: a session lock left behind by an idle session (4104, expect = "xact"),
and a session idle in transaction on 4105 with a waiter behind it (a stuck owner).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster, create_cluster

from helpers.cli import lockdiag

REGISTRY = """\
[namespaces.tenant_summary]
id = 4102
expect = "xact"

[namespaces.session_mix]
id = 4103

[namespaces.planted]
id = 4104
expect = "xact"

[namespaces.stuck]
id = 4105
"""
XACT_SCRIPT = """\
\\set k random(1, 30)
\\set r random(1, 150)
BEGIN;
SELECT pg_advisory_xact_lock(4102, :k);
COMMIT;
\\if :r = 1
\\set pause random(100, 1500)
\\sleep :pause ms
\\endif
"""
SESSION_SCRIPT = """\
\\set k random(1, 30)
SELECT pg_advisory_lock(4103, :k);
SELECT pg_advisory_unlock(4103, :k);
"""
RUNS = 12  # of list, and of check
CHECK = ["--idle-age", "1s,1h", "--wait-age", "5m"]  # the planted owner is idle for seconds


@dataclass
class Churn:
    cluster: Cluster
    env: dict[str, str]
    pgbench: list[subprocess.Popen[str]]
    started: float

    def transactions(self) -> int:
        """Transactions over the whole churn, from the server's own counters."""
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            row = admin.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = 'postgres'"
            ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Churn]:
    cluster = create_cluster(settings={"max_connections": "80"})
    directory = tmp_path_factory.mktemp("churn")
    (directory / "xact.sql").write_text(XACT_SCRIPT)
    (directory / "session.sql").write_text(SESSION_SCRIPT)
    (directory / "lockdiag.toml").write_text(REGISTRY)
    pgbench = str(cluster.bindir / "pgbench")
    common = ["-n", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-T", "600"]
    processes = [
        subprocess.Popen(
            [
                pgbench,
                *common,
                "-c",
                str(clients),
                "-j",
                "2",
                "-f",
                str(directory / script),
                "postgres",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script, clients in (("xact.sql", 24), ("session.sql", 8))
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKDIAG_", "PG"))}
    env.update(
        {"LOCKDIAG_DSN": cluster.dsn(), "LOCKDIAG_REGISTRY": str(directory / "lockdiag.toml")}
    )
    try:
        time.sleep(1.0)  # the workers are connected and busy
        for process in processes:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
        yield Churn(cluster, env, processes, time.monotonic())
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
        cluster.destroy()


def run(churn: Churn, *args: str) -> str:
    result = lockdiag(*args, env=churn.env, timeout=60)
    assert result.returncode in (0, 1, 2), result.stderr
    assert result.stdout, result.stderr
    return result.stdout


def json_of(churn: Churn, *args: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(run(churn, *args, "--format", "json"))
    return document


@pytest.mark.timeout(900)  # a busy machine: the churn is measured in snapshots, not seconds
def test_churn_makes_no_false_claim_and_no_finding_while_leaks_are_found(churn: Churn) -> None:
    dsn = churn.cluster.dsn
    with (
        psycopg.connect(dsn(application_name="planted-leak"), autocommit=True) as leak,
        psycopg.connect(dsn(application_name="planted-owner")) as owner,
    ):
        leak.execute("SELECT pg_advisory_lock(4104, 1)")  # and stays idle: a leaked session lock
        owner.execute("SELECT pg_advisory_xact_lock(4105, 1)")  # and stays idle in transaction
        waiter = subprocess.Popen(
            [sys.executable, "-c", "import psycopg, sys; psycopg.connect(sys.argv[1], "
             "autocommit=True).execute('SELECT pg_advisory_lock(4105, 1)')", dsn()],
        )  # fmt: skip
        time.sleep(1.5)  # the owner has been idle in transaction for more than --idle-age
        try:
            found = run_commands(churn, leak.info.backend_pid, owner.info.backend_pid)
        finally:
            waiter.terminate()
            waiter.wait(10)
    false_claims, other_findings, missed, snapshots = found
    per_snapshot = churn.transactions() / snapshots
    rate = churn.transactions() / (time.monotonic() - churn.started)
    report = f"{snapshots} snapshots, {per_snapshot:.0f} transactions each ({rate:.0f}/s)"
    print(f"churn: {report}; {false_claims} false claims, {len(other_findings)} findings")
    # what makes the churn mean something is how much the lock table moved under each read,
    # not the machine's speed: a slow machine runs fewer transactions and takes longer reads
    assert per_snapshot > 50, f"the churn was too slow to mean anything: {report}"
    assert false_claims == 0, f"{false_claims} false session claims in {report}"
    assert other_findings == [], f"{len(other_findings)} findings from churn: {other_findings[:5]}"
    assert missed == [], f"planted leaks missed in {report}: {missed[:5]}"


def run_commands(
    churn: Churn, leak_pid: int, owner_pid: int
) -> tuple[int, list[str], list[str], int]:
    """RUNS of list, check, who-holds and watch --once, and one sample: false session claims
    on 4102, findings about anything but the planted sessions, planted leaks missed, and how
    many snapshots that was."""
    false_claims, other_findings, missed, snapshots = 0, [], [], 0
    planted_pids = (leak_pid, owner_pid)
    for number in range(RUNS):
        locks = json_of(churn, "list")["locks"]
        false_claims += sum(
            1 for lock in locks
            if lock["namespace"] == "tenant_summary" and lock["lifetime"] == "session"
        )  # fmt: skip
        if not any(lock["pid"] == leak_pid and lock["lifetime"] == "session" for lock in locks):
            missed.append("list: the planted session lock")
        findings = json_of(churn, "check", *CHECK)["findings"]
        planted = {(f["kind"], f["pid"]) for f in findings}
        if ("expect-violated", leak_pid) not in planted:
            missed.append("check: the planted session lock")
        if ("stuck-owner", owner_pid) not in planted:
            missed.append("check: the planted stuck owner")
        other_findings += [
            f"{f['kind']}: {f['evidence']}" for f in findings if f["pid"] not in planted_pids
        ]
        snapshots += 2
        if number % 4:
            continue  # who-holds and watch every fourth run: the CPU is the churn's
        holders = json_of(churn, "who-holds", "planted", "1")["holders"]
        if [(h["pid"], h["lifetime"]) for h in holders] != [(leak_pid, "session")]:
            missed.append("who-holds: the planted session lock")
        frame = run(churn, "watch", "--once").splitlines()
        false_claims += sum(
            1 for line in frame if "tenant_summary" in line and "expect-xact" in line
        )
        other_findings += [
            line for line in frame
            if line.startswith(("WARNING", "CRITICAL")) and not planted_line(line, planted_pids)
        ]  # fmt: skip
        snapshots += 2
    sampled = json_of(churn, "sample", "--duration", "3s", "--interval", "100ms")
    snapshots += sampled["samples"]
    other_findings += [
        f"sample {p['kind']}: {p['key']}" for p in sampled["patterns"]
        if p["kind"] != "duplicate-dispatch"  # many workers take the same keys: that is the churn
        and not p["key"].startswith(("planted", "stuck"))
    ]  # fmt: skip
    return false_claims, other_findings, missed, snapshots


def planted_line(line: str, pids: tuple[int, int]) -> bool:
    """A finding of watch about a planted session (the stuck owner's waiter included)."""
    return any(f"pid {pid}" in line for pid in pids) or "stuck 1 ·" in line
