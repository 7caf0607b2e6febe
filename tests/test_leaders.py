"""Leaders and standbys (issue 39): a session lock on an idle connection while other sessions
of the same program poll a try-lock. Failed tries leave no row in pg_locks; the standbys show
only as their last query in pg_stat_activity, which drivers binding on the server send as
``pg_try_advisory_lock($1, $2)``."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.leaders import _key, poll_of
from lockdiag.core.model import Session
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import from_bigint, from_pair

from helpers.cli import run_on
from helpers.servers import Sessions

POLL = "SELECT pg_try_advisory_lock(%s, %s)"
HAZARD = "another instance would take"


class Standby:
    """A standby of the elector: a try-lock of (4242, 17) every 0.3 s, bound on the server
    (psycopg's default: the server sees $1, $2), prepared or not."""

    def __init__(self, sessions: Sessions, prepare: bool) -> None:
        self.worker = sessions.open("elector")
        self.prepare, self.tries, self.taken = prepare, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        connection = self.worker.connection
        while not self.stop.is_set():
            try:
                row = connection.execute(POLL, (4242, 17), prepare=self.prepare).fetchone()
            except psycopg.Error:
                return  # ended by the fixture
            self.tries += 1
            self.taken += bool(row and row[0])
            self.stop.wait(0.3)


@pytest.fixture
def elector(sessions: Sessions) -> Iterator[tuple[int, list[Standby], int]]:
    """A leader holding (4242, 17) as a session lock, idle; two standbys polling; an idle
    session of another program and one of the elector's own that polls nothing."""
    leader = sessions.open("elector")
    leader.run("SELECT pg_advisory_lock(4242, 17)")
    standbys = [Standby(sessions, prepare=False), Standby(sessions, prepare=True)]
    other = sessions.open("billing")
    other.run("SELECT 1")
    quiet = sessions.open("elector")
    quiet.run("SELECT 1")
    sessions.until(
        lambda admin: (
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                "'SELECT pg_try_advisory_lock($1, $2)' AND state = 'idle'"
            ).fetchone()
            == (2,)
        ),
        10,
        "two standbys to poll",
    )
    try:
        yield leader.pid, standbys, other.pid
    finally:
        for standby in standbys:
            standby.stop.set()
            standby.thread.join(5)
        assert all(s.taken == 0 and s.tries > 0 for s in standbys), "a standby took the lock"


def test_check_names_a_leader_with_two_standbys(cluster: Cluster, elector: Any) -> None:
    leader, standbys, other = elector
    result = run_on(cluster, "check")
    assert result.exit_code == 0, result.output  # a healthy leader pages nobody
    line = next(x for x in result.output.splitlines() if x.startswith("leader:"))
    assert f"pid {leader} (elector) holds unregistered pair (4242, 17) as a leader lock" in line
    assert "2 standbys poll a try-lock" in line
    assert "failover is meant to work" in line and 'expect = "session"' in line
    assert str(other) not in line
    assert HAZARD not in result.output
    data = json.loads(run_on(cluster, "check", "--format", "json").output)
    (found,) = data["leaders"]
    pids = sorted(s.worker.pid for s in standbys)
    assert found["pid"] == leader and sorted(s["pid"] for s in found["standbys"]) == pids
    assert 'expect = "session"' in found["declaration"]


def test_the_session_age_finding_speaks_of_a_leader(cluster: Cluster, elector: Any) -> None:
    """Past --session-age the finding names the leader and its standbys, failover as the
    design, and the declaration that quiets it; not the hazard of a second instance."""
    leader, _, _ = elector
    time.sleep(1.1)
    result = run_on(cluster, "check", "--session-age", "1s", "--format", "json")
    data = json.loads(result.output)
    (finding,) = [f for f in data["findings"] if f["kind"] == "session-lock"]
    assert finding["pid"] == leader
    assert "a leader lock: 2 standbys poll a try-lock" in finding["evidence"]
    assert "failover, by design" in finding["next_step"]
    # one constant key: the namespace of exactly that key (id = 4242 would take in its space)
    assert '[namespaces.NAME] key = [4242, 17], expect = "session";' in finding["next_step"]
    assert "silences the session-age alert" in finding["next_step"]
    assert HAZARD not in result.output
    assert data["leaders"][0]["pid"] == leader  # JSON lists every leader


def test_the_declaration_pasted_quiets_the_leader(
    cluster: Cluster, elector: Any, tmp_path: Path
) -> None:
    """The declaration the finding gives, pasted into a registry, is accepted by registry
    check and quiets the session-age alert; the leader is still named."""
    leader, _, _ = elector
    time.sleep(1.1)
    data = json.loads(run_on(cluster, "check", "--session-age", "1s", "--format", "json").output)
    (finding,) = [f for f in data["findings"] if f["kind"] == "session-lock"]
    entry = re.search(r"\[namespaces.NAME\] (.*?);", finding["next_step"])
    assert entry is not None and 'expect = "session"' in entry[1], finding["next_step"]
    lines = re.split(r", (?![^\[]*\])", entry[1])  # key = [4242, 17], expect = "session"
    registry = tmp_path / "lockdiag.toml"
    registry.write_text("[namespaces.leader]\n" + "\n".join(lines) + "\n")
    checked = CliRunner().invoke(cli, ["registry", "check", "--registry", str(registry)])
    assert checked.exit_code == 0, checked.output
    args = ("check", "--registry", str(registry), "--session-age", "1s", "--format", "json")
    quiet = json.loads(run_on(cluster, *args).output)
    assert quiet["status"] == "OK" and not quiet["findings"], quiet
    assert [x["pid"] for x in quiet["leaders"]] == [leader]


def test_a_constant_bigint_leader_is_declared_by_its_key(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A hand-picked bigint constant: the exact key, never its high word as a namespace id;
    a leader with two keys in one space is declared by that space."""
    constant = 8237461823746182
    leader = sessions.open("elector-64")
    leader.run(f"SELECT pg_advisory_lock({constant})")
    standby = psycopg.ClientCursor(sessions.open("elector-64").connection)
    standby.execute("SELECT pg_try_advisory_lock(%s)", (constant,))  # literals: its key
    two = sessions.open("elector-2")
    two.run("SELECT pg_advisory_lock(4242, 21), pg_advisory_lock(4242, 22)")
    psycopg.ClientCursor(sessions.open("elector-2").connection).execute(POLL, (4242, 21))
    data = json.loads(run_on(cluster, "check", "--format", "json").output)
    declared = {x["pid"]: x["declaration"] for x in data["leaders"]}
    assert f"[namespaces.NAME] key = {constant}," in declared[leader.pid]
    assert "id = 1917933" not in declared[leader.pid]
    assert '[namespaces.NAME] id = 4242, form = "pair",' in declared[two.pid]


def test_who_holds_says_who_polls_instead_of_nothing_to_do(cluster: Cluster, elector: Any) -> None:
    leader, _, _ = elector
    result = run_on(cluster, "who-holds", "--key", "4242,17", "--format", "plain")
    assert result.exit_code == 0, result.output
    assert "nothing to do" not in result.output
    assert f"pid {leader} (elector) holds unregistered pair (4242, 17) as a leader lock" in (
        result.output
    )
    assert "2 standbys poll a try-lock" in result.output
    assert "next: a healthy leader: name it in the registry: [namespaces.NAME]" in result.output


def test_sample_counts_the_standbys(cluster: Cluster, elector: Any) -> None:
    leader, standbys, _ = elector
    args = ("sample", "--duration", "2s", "--interval", "250ms")
    data = json.loads(run_on(cluster, *args, "--format", "json").stdout)
    (seen,) = data["leaders"]
    assert seen["pid"] == leader
    assert seen["standby_pids"] == sorted(s.worker.pid for s in standbys)
    assert data["polling_sessions"] == {"unregistered": 2}
    plain = run_on(cluster, *args, "--format", "plain").stdout
    assert "standby(s) seen polling a try-lock" in plain and "leader lock" in plain
    metrics = run_on(cluster, *args, "--format", "prometheus").stdout
    assert 'lockdiag_sample_polling_sessions{namespace="unregistered"} 2' in metrics


def test_the_exporters_series_counts_them(cluster: Cluster, elector: Any) -> None:
    """The exporter's /metrics is check's series (check_metrics): the gauge counts the two
    standbys, under the leader's namespace; the idle sessions are not counted."""
    metrics = run_on(cluster, "check", "--format", "prometheus").output
    assert 'lockdiag_polling_sessions{namespace="unregistered"} 2' in metrics
    assert 'lockdiag_polling_sessions{namespace="unknown"} 0' in metrics


def test_no_leader_without_standbys(cluster: Cluster, sessions: Sessions) -> None:
    """An idle holder beside idle sessions of its program that poll nothing is no leader."""
    holder = sessions.open("elector")
    holder.run("SELECT pg_advisory_lock(4242, 18)")
    sessions.open("elector").run("SELECT 1")
    data = json.loads(run_on(cluster, "check", "--format", "json").output)
    assert data["leaders"] == []
    result = run_on(cluster, "who-holds", "--key", "4242,18", "--format", "plain")
    assert "nobody waits" in result.output and "leader lock" not in result.output


def test_a_standby_polling_another_key_is_not_its_leaders(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A try-lock with literals names its key: a poll of a key another program holds stands
    by for no leader of its own program (counted under "unknown")."""
    holder = sessions.open("elector")
    holder.run("SELECT pg_advisory_lock(4242, 19)")
    sessions.open("billing").run("SELECT pg_advisory_lock(4242, 20)")  # its try fails
    client = psycopg.ClientCursor(sessions.open("elector").connection)
    client.execute(POLL, (4242, 20))  # literals: the server sees (4242, 20)
    metrics = run_on(cluster, "check", "--format", "prometheus").output
    assert 'lockdiag_polling_sessions{namespace="unknown"} 1' in metrics
    data = json.loads(run_on(cluster, "check", "--format", "json").output)
    assert data["leaders"] == []


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("SELECT pg_try_advisory_lock($1, $2)", None),
        ("SELECT pg_try_advisory_lock(4242, 17)", from_pair(4242, 17)),
        ("select PG_TRY_ADVISORY_XACT_LOCK(-5::bigint)", from_bigint(-5)),
        (
            "SELECT pg_catalog.pg_try_advisory_lock(CAST(4242 AS integer), CAST(-1 AS integer))",
            from_pair(4242, -1),
        ),
        ("SELECT pg_try_advisory_lock(hashtext('jobs'))", None),
        ("SELECT pg_try_advisory_lock(4242, 17", None),  # cut by track_activity_query_size
        ("SELECT pg_try_advisory_lock(1, 2, 3)", None),
        ("SELECT pg_try_advisory_lock(99999999999, 1)", None),  # not an int4
    ],
)
def test_the_polled_key(query: str, key: Any) -> None:
    poll = poll_of(Session(1, query=query, state="idle", backend_type="client backend"))
    assert poll is not None and poll.key == key
    start = query.index("(") + 1
    assert _key(query[start:]) == key


def test_not_a_poll() -> None:
    for session in (
        Session(1, query="SELECT pg_advisory_lock(1, 2)", state="active"),
        Session(1, query="SELECT pg_try_advisory_lock(1, 2)", wait_event_type="Lock"),
        Session(1, query="SELECT pg_try_advisory_lock(1, 2)", backend_type="autovacuum worker"),
        Session(1, query="<insufficient privilege>"),
    ):
        assert poll_of(session) is None
