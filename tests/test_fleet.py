"""Many servers in one command: several real clusters, one of them unreachable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster, create_cluster, free_port

from helpers.cli import run
from helpers.servers import Sessions


@pytest.fixture(scope="module")
def second(cluster: Cluster) -> Iterator[Cluster]:
    server = create_cluster(cluster.bindir)
    yield server
    server.destroy()


def test_list_across_servers(cluster: Cluster, second: Cluster, sessions: Sessions) -> None:
    sessions.open("here").run("SELECT pg_advisory_lock(1, 1)")
    with psycopg.connect(second.dsn(application_name="there"), autocommit=True) as there:
        there.execute("SELECT pg_advisory_lock(2, 2)")
        down = f"host=127.0.0.1 port={free_port()} user=x"
        args = ["list", "--dsn", cluster.dsn(), "--dsn", second.dsn(), "--dsn", down]
        result = run(*args, "--timeout", "2s", "--format", "json")
        assert result.exit_code == 3  # a target failed: reported, after every answer
        document: dict[str, Any] = json.loads(result.stdout)
        by_target = {t["target"]: t for t in document["targets"]}
        assert by_target[f"127.0.0.1:{cluster.port}/postgres"]["ok"] is True
        assert by_target[f"127.0.0.1:{second.port}/postgres"]["ok"] is True
        failed = by_target[f"127.0.0.1:{down.split('port=')[1].split(maxsplit=1)[0]}"]
        assert failed["ok"] is False and "cannot connect" in failed["error"]
        rows = {(lock["target"], lock["classid"], lock["objid"]) for lock in document["locks"]}
        assert rows == {
            (f"127.0.0.1:{cluster.port}/postgres", 1, 1),
            (f"127.0.0.1:{second.port}/postgres", 2, 2),
        }
        plain = run(*args, "--timeout", "2s")
        assert plain.stdout.splitlines()[0].split()[0] == "TARGET"
        assert "FAILED: cannot connect" in plain.stdout
        assert "Traceback" not in plain.stdout + plain.stderr


def test_targets_file_with_a_service_name(
    cluster: Cluster, second: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[second]\nhost=127.0.0.1\nport={second.port}\nuser=postgres\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    targets = tmp_path / "targets.txt"
    targets.write_text(f"# the fleet\n{cluster.dsn()}\n\nsecond\n")
    result = run("list", "--targets", str(targets), "--format", "json")
    assert result.exit_code == 0, result.stderr
    names = [t["target"] for t in json.loads(result.stdout)["targets"]]
    assert names == [f"127.0.0.1:{cluster.port}/postgres", "service=second"]


def test_check_returns_the_worst_status(
    cluster: Cluster, second: Cluster, sessions: Sessions
) -> None:
    owner = sessions.open("owner", autocommit=False)
    owner.run("SELECT pg_advisory_xact_lock(3, 3)")
    waiter = sessions.open("waiter")
    waiter.start("SELECT pg_advisory_lock(3, 3)")
    sessions.waiting(waiter)
    down = f"host=127.0.0.1 port={free_port()} user=x"
    base = ["check", "--wait-age", "0s,0s", "--timeout", "2s"]
    critical = run(*base, "--dsn", cluster.dsn(), "--dsn", second.dsn(), "--dsn", down,
                   "--format", "json")  # fmt: skip
    assert critical.exit_code == 2
    statuses = [t["status"] for t in json.loads(critical.stdout)["targets"]]
    assert statuses == ["CRITICAL", "OK", "UNKNOWN"]
    unknown = run(*base, "--dsn", second.dsn(), "--dsn", down, "--format", "nagios")
    assert unknown.exit_code == 3
    assert unknown.stdout.startswith("LOCKDIAG UNKNOWN - 2 target(s): ")
    assert "failed_targets=1" in unknown.stdout
    fine = run(*base, "--dsn", second.dsn(), "--dsn", second.dsn(dbname="template1"))
    assert fine.exit_code == 0
    metrics = run(*base, "--dsn", cluster.dsn(), "--dsn", second.dsn(), "--format", "prometheus")
    assert f'lockdiag_up{{target="127.0.0.1:{second.port}/postgres"}} 1' in metrics.stdout
    assert metrics.stdout.count("# TYPE lockdiag_findings gauge") == 1


def test_blockers_and_who_holds_per_target(
    cluster: Cluster, second: Cluster, sessions: Sessions
) -> None:
    sessions.open("holder").run("SELECT pg_advisory_lock(4, 4)")
    both = ["--dsn", cluster.dsn(), "--dsn", second.dsn()]
    held = run("who-holds", "--key", "4,4", *both, "--format", "json")
    assert held.exit_code == 0
    results = [t["result"]["held"] for t in json.loads(held.stdout)["targets"]]
    assert results == [True, False]
    chains = run("blockers", *both)
    assert chains.stdout.count("== 127.0.0.1:") == 2


def test_single_server_commands_refuse_many() -> None:
    result = run("snapshot", "-o", "x.json", "--dsn", "host=a", "--dsn", "host=b")
    assert result.exit_code == 2
    assert "give a single --dsn" in result.stderr
