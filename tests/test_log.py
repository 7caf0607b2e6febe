"""`lockdiag log`: a real server logs real waits, a deadlock and a lock timeout, in every format
it writes (stderr, csvlog, and jsonlog from PostgreSQL 15); lockdiag reads them back.

The server's own figures ("acquired ... after 702.180 ms") are the reference: the test reads
them from the stderr log with a plain regular expression, not with lockdiag's parser.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.keys import LockTriple
from lockdiag.logs import LogReader, NotALog, Tally, prefix_pattern, report
from lockdiag.registry import Registry

from helpers.cli import run
from helpers.registry import write_registry

PREFIX = "%m [%p] %q%u@%d/%a "
REGISTRY = """
[namespaces.tenant_summary]
id = 4102
form = "pair"

[namespaces.invoice_export]
id = 7
form = "bigint"

[namespaces.ledger_sync]
id = 31
form = "pair"
"""
EXTENSIONS = {"stderr": ".log", "csvlog": ".csv", "jsonlog": ".json"}


@dataclass
class Incident:
    """What the test did, by pid, and the log files the server wrote about it."""

    cluster: Cluster
    files: dict[str, Path]  # format -> file
    pids: dict[str, int] = field(default_factory=dict)  # role in the story -> backend pid
    deadlock_victim: int = 0
    relation: int = 0
    database: int = 0

    def server_figure(self, pid: int, key_text: str) -> float:
        """The server's own "acquired ... after N ms" for one pid and lock."""
        text = self.files["stderr"].read_text()
        found = re.search(
            rf"process {pid} acquired \S+ on {re.escape(key_text)} after ([\d.]+) ms", text
        )
        assert found is not None, f"the server logged no acquisition of {key_text} by {pid}"
        return float(found.group(1))


def _connect(cluster: Cluster, name: str) -> psycopg.Connection[Any]:
    return psycopg.connect(cluster.dsn(application_name=name), autocommit=True)


def _until_logged(cluster: Cluster, text: str, timeout: float = 10.0) -> None:
    """Poll the server's stderr log until ``text`` is in it."""
    deadline = time.monotonic() + timeout
    log = cluster.data / "log" / "postgresql.log"
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.02)
    raise AssertionError(f"the server did not log {text!r} within {timeout}s")


def _background(connection: psycopg.Connection[Any], sql: str) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            connection.execute(sql.encode())
        except psycopg.Error as error:  # the deadlock victim's error, looked at by the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _story(cluster: Cluster, incident: Incident) -> None:
    """Real waits: a pair key with a queue of two, a bigint key, a table, an advisory
    deadlock and a lock timeout. Each holder keeps its lock until the server has logged the
    wait (past deadlock_timeout), then a little longer."""
    holder, b, c = (_connect(cluster, n) for n in ("holder-a", "worker-b", "worker-c"))
    incident.pids = {n: x.info.backend_pid for n, x in
                     (("holder", holder), ("b", b), ("c", c))}  # fmt: skip
    hp, bp, cp = incident.pids["holder"], incident.pids["b"], incident.pids["c"]
    with holder.cursor() as cursor:
        cursor.execute("CREATE TABLE items (id int PRIMARY KEY)")
        incident.relation = cursor.execute("SELECT 'items'::regclass::oid").fetchone()[0]  # type: ignore[index]
        incident.database = cursor.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]  # type: ignore[index]

    holder.execute("SELECT pg_advisory_lock(4102, 73)")
    waiting_b = _background(b, "SELECT pg_advisory_lock(4102, 73)")
    _until_logged(cluster, f"process {bp} still waiting")
    waiting_c = _background(c, "SELECT pg_advisory_xact_lock(4102, 73)")
    _until_logged(cluster, f"process {cp} still waiting")
    time.sleep(0.2)
    holder.execute("SELECT pg_advisory_unlock(4102, 73)")
    waiting_b.join(10)
    b.execute("SELECT pg_advisory_unlock(4102, 73)")
    waiting_c.join(10)

    key = 7 << 32 | 5  # invoice_export 5, the bigint form
    holder.execute(f"SELECT pg_advisory_lock({key})")
    waiting_b = _background(b, f"SELECT pg_advisory_xact_lock({key})")
    _until_logged(cluster, f"on advisory lock [{incident.database},7,5,1]")
    holder.execute(f"SELECT pg_advisory_unlock({key})")
    waiting_b.join(10)

    holder.execute("BEGIN")
    holder.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
    waiting_b = _background(b, "SELECT count(*) FROM items")
    _until_logged(cluster, f"on relation {incident.relation} of database")
    holder.execute("COMMIT")
    waiting_b.join(10)

    holder.execute("BEGIN")
    b.execute("BEGIN")
    holder.execute("SELECT pg_advisory_xact_lock(31, 1)")
    b.execute("SELECT pg_advisory_xact_lock(31, 2)")
    waiting_h = _background(holder, "SELECT pg_advisory_xact_lock(31, 2)")
    _until_logged(cluster, f"process {hp} still waiting for ExclusiveLock on advisory lock "
                  f"[{incident.database},31,2,2]")  # fmt: skip
    waiting_b = _background(b, "SELECT pg_advisory_xact_lock(31, 1)")
    waiting_h.join(10)
    waiting_b.join(10)
    victims = [p for p, t in ((hp, waiting_h), (bp, waiting_b)) if t.errors]  # type: ignore[attr-defined]
    assert len(victims) == 1, "exactly one session is cancelled by the deadlock"
    incident.deadlock_victim = victims[0]
    holder.execute("ROLLBACK")
    b.execute("ROLLBACK")

    holder.execute("SELECT pg_advisory_lock(4102, 74)")
    c.execute("SET lock_timeout = '400ms'")
    with pytest.raises(psycopg.errors.LockNotAvailable):
        c.execute("SELECT pg_advisory_lock(4102, 74)")
    holder.execute("SELECT pg_advisory_unlock_all()")
    for connection in (holder, b, c):
        connection.close()


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Incident]:
    server = create_cluster(start=False)
    formats = ["stderr", "csvlog"] + (["jsonlog"] if server.version >= 15 else [])
    server.settings.update(
        {
            "log_lock_waits": "on",
            "deadlock_timeout": "100ms",
            "logging_collector": "on",
            "log_destination": ",".join(formats),
            "log_directory": "log",
            "log_filename": "postgresql.log",
            "log_line_prefix": PREFIX,
        }
    )
    try:
        server.start()
        incident = Incident(server, {})
        _story(server, incident)
        server.stop()  # the collector flushes every file
        saved = tmp_path_factory.mktemp("logs")
        for fmt in formats:
            source = server.data / "log" / f"postgresql{EXTENSIONS[fmt]}"
            incident.files[fmt] = Path(shutil.copy(source, saved / source.name))
        yield incident
    finally:
        server.destroy()


def _run(args: list[str], stdin: bytes | None = None) -> Result:
    return run("log", *args, input=stdin)


def _json(args: list[str], stdin: bytes | None = None) -> dict[str, Any]:
    result = _run([*args, "--format", "json"], stdin)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def _key(data: dict[str, Any], label: str) -> dict[str, Any]:
    found = [k for k in data["keys"] if k["key"] == label]
    assert found, f"{label} not among {[k['key'] for k in data['keys']]}"
    key: dict[str, Any] = found[0]
    return key


@pytest.fixture
def registry(tmp_path: Path) -> str:
    return str(write_registry(tmp_path, REGISTRY))


def _formats(incident: Incident) -> list[str]:
    return list(incident.files)


def _check(data: dict[str, Any], incident: Incident) -> None:
    """What every format must tell about the story."""
    pids = incident.pids
    hp, bp, cp = pids["holder"], pids["b"], pids["c"]
    pair = _key(data, "tenant_summary 73")
    assert pair["waits"] == 2 and pair["database"] == "postgres"
    (episode,) = pair["episodes"]
    assert {h["pid"] for h in episode["holders"]} == {hp}
    assert {(w["pid"], w["application_name"], w["user"]) for w in episode["waiters"]} == {
        (bp, "worker-b", "postgres"),
        (cp, "worker-c", "postgres"),
    }
    assert episode["holders"][0]["application_name"] == "holder-a"
    tag = f"advisory lock [{incident.database},4102,73,2]"
    expected = max(incident.server_figure(bp, tag), incident.server_figure(cp, tag))
    assert pair["longest_wait_ms"] == pytest.approx(expected, abs=0.001)
    assert pair["outcomes"] == {"acquired": 2}

    bigint = _key(data, "invoice_export 5")
    assert bigint["waits"] == 1 and bigint["objsubid"] == 1
    figure = incident.server_figure(bp, f"advisory lock [{incident.database},7,5,1]")
    assert bigint["longest_wait_ms"] == pytest.approx(figure, abs=0.001)

    table = _key(data, f"relation oid {incident.relation}")
    assert table["waits"] == 1 and table["relation_oid"] == incident.relation

    assert data["deadlock_count"] == 1
    (deadlock,) = data["deadlocks"]
    assert deadlock["cancelled_pid"] == incident.deadlock_victim
    assert {s["key"] for s in deadlock["cycle"]} == {"ledger_sync 1", "ledger_sync 2"}
    assert {s["pid"] for s in deadlock["cycle"]} == {hp, bp}

    (timeout,) = [c for c in data["cancellations"] if c["kind"] == "lock timeout"]
    assert timeout["pid"] == cp and timeout["key"] == "tenant_summary 74"
    assert timeout["waited_ms"] == pytest.approx(400, abs=60)  # lock_timeout = 400ms
    assert data["files"][0]["unparsed_lines"] == 0


def test_every_format_gives_the_waits_the_deadlock_and_the_timeout(
    incident: Incident, registry: str
) -> None:
    for fmt in _formats(incident):
        data = _json([str(incident.files[fmt]), "--registry", registry])
        assert data["files"][0]["format"] == fmt
        _check(data, incident)


def test_gzip_and_standard_input(incident: Incident, registry: str, tmp_path: Path) -> None:
    for fmt in _formats(incident):
        raw = incident.files[fmt].read_bytes()
        packed = tmp_path / f"{incident.files[fmt].name}.gz"
        packed.write_bytes(gzip.compress(raw))
        _check(_json([str(packed), "--registry", registry]), incident)
        _check(_json(["-", "--registry", registry], stdin=raw), incident)
        _check(_json(["-", "--registry", registry], stdin=gzip.compress(raw)), incident)


def test_the_prefix_given_or_detected(incident: Incident, registry: str) -> None:
    path = str(incident.files["stderr"])
    detected = _json([path, "--registry", registry])
    assert detected["files"][0]["prefix"] == PREFIX
    given = _json([path, "--registry", registry, "--prefix", PREFIX])
    assert given["keys"] == detected["keys"]


def test_timeline_of_one_key_by_numbers_or_by_name(incident: Incident, registry: str) -> None:
    path = str(incident.files["stderr"])
    by_numbers = _json([path, "--registry", registry, "--key", "4102,73"])
    by_name = _json([path, "--registry", registry, "--key", "tenant_summary 73"])
    assert by_numbers["timeline"] == by_name["timeline"]
    events = [e["event"] for e in by_numbers["timeline"]]
    assert events.count("waiting for ExclusiveLock") == 2
    assert events.count("acquired ExclusiveLock") == 2


def test_since_and_until(incident: Incident, registry: str) -> None:
    path = str(incident.files["stderr"])
    everything = _json([path, "--registry", registry])
    later = "2999-01-01 00:00"
    assert _json([path, "--registry", registry, "--since", later])["keys"] == []
    assert _json([path, "--registry", registry, "--until", later])["keys"] == everything["keys"]


def test_text_markdown_and_csv(incident: Incident, registry: str) -> None:
    path = str(incident.files["stderr"])
    text = _run([path, "--registry", registry, "--format", "plain"]).stdout
    assert "tenant_summary 73" in text and "Deadlocks (1)" in text and "lock timeout" in text
    markdown = _run([path, "--registry", registry, "--format", "markdown"]).stdout
    assert "| tenant\\_summary 73" in markdown
    rows = _run([path, "--registry", registry, "--format", "csv"]).stdout.splitlines()
    assert rows[0].startswith("KEY,DATABASE,FIRST SEEN")
    assert rows[1].startswith("tenant_summary 73,")  # the most total wait first


def test_names_from_the_server(incident: Incident, registry: str) -> None:
    """--dsn names the table of a relation wait (the server has been stopped: start it)."""
    incident.cluster.start()
    try:
        data = _json([str(incident.files["csvlog"]), "--registry", registry,
                      "--dsn", incident.cluster.dsn()])  # fmt: skip
    finally:
        incident.cluster.stop()
    assert _key(data, "relation public.items")["relation_oid"] == incident.relation


# -- bad input: counted, said, never a traceback -----------------------------------------------


def test_not_a_log_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\nthis is not a server log\n")
    result = CliRunner().invoke(cli, ["log", str(path)])
    assert result.exit_code == 2
    assert "not a PostgreSQL log" in result.stderr and "Traceback" not in result.output
    missing = CliRunner().invoke(cli, ["log", str(tmp_path / "missing.log")])
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


def test_bad_lines_are_counted_and_a_truncated_end_is_fine(
    incident: Incident, registry: str, tmp_path: Path
) -> None:
    text = incident.files["stderr"].read_text()
    lines = text.splitlines(keepends=True)
    broken = [*lines[:5], "\x1b[31mgarbage line\n", "another one\n", *lines[5:]]
    cut = "".join(broken) + lines[-1][: len(lines[-1]) // 2]  # a last line cut in the middle
    path = tmp_path / "broken.log"
    path.write_text(cut)
    data = _json([str(path), "--registry", registry])
    assert data["files"][0]["unparsed_lines"] == 2
    _check({**data, "files": [{**data["files"][0], "unparsed_lines": 0}]}, incident)
    records = incident.files["csvlog"].read_text().splitlines(keepends=True)
    path = tmp_path / "broken.csv"
    path.write_text("".join([*records[:3], "garbage, not a record\n", *records[3:]]))
    data = _json([str(path), "--registry", registry])
    assert data["files"][0]["unparsed_lines"] == 1
    _check({**data, "files": [{**data["files"][0], "unparsed_lines": 0}]}, incident)
    packed = tmp_path / "cut.log.gz"
    packed.write_bytes(gzip.compress(text.encode())[:-30])  # compressed data ends early
    result = CliRunner().invoke(cli, ["log", str(packed), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert "compressed data ends early" in result.stderr


def test_a_stretch_of_nul_bytes_is_read_around(
    incident: Incident, registry: str, tmp_path: Path
) -> None:
    """What a crash leaves in an append-only log: the server's first line cut by a megabyte of
    NUL bytes, and another stretch between two entries; in each format the damage is skipped
    and said, with where it was, and the story is read whole."""
    for fmt in _formats(incident):
        raw = incident.files[fmt].read_bytes()
        first = raw.index(b"\n") + 1
        middle = raw.index(b"\n", len(raw) // 2) + 1
        nuls = b"\0" * (1 << 20)
        damaged = raw[: first // 2] + nuls + raw[first:middle] + nuls + raw[middle:]
        path = tmp_path / f"damaged-{incident.files[fmt].name}"
        path.write_bytes(damaged)
        data = _json([str(path), "--registry", registry])
        _check(data, incident)
        damage = data["files"][0]["damage"]
        assert damage["nul_stretches"] == 2, (fmt, damage)
        assert damage["nul_bytes"] == 2 * len(nuls) + first // 2
        second = first // 2 + len(nuls) + middle - first
        assert damage["skipped"] == [[0, first // 2 + len(nuls)], [second, len(nuls)]], fmt
        assert any("stretch(es) of NUL bytes skipped" in note for note in data["notes"])


def test_bytes_that_are_not_utf8_are_replaced(incident: Incident, registry: str,
                                              tmp_path: Path) -> None:  # fmt: skip
    """Invalid UTF-8 in a statement (a client's LATIN1): U+FFFD, counted; never a traceback."""
    raw = incident.files["stderr"].read_bytes()
    path = tmp_path / "latin1.log"
    path.write_bytes(raw.replace(b"SELECT pg_advisory_lock(4102, 74)",
                                 b"SELECT pg_advisory_lock(4102, 74) -- caf\xe9 \xff"))  # fmt: skip
    data = _json([str(path), "--registry", registry])
    _check(data, incident)
    statements = raw.count(b"SELECT pg_advisory_lock(4102, 74)")
    assert data["files"][0]["damage"]["undecodable_bytes"] == 2 * statements > 0
    (timeout,) = [c for c in data["cancellations"] if c["kind"] == "lock timeout"]
    assert timeout["statement"].endswith("-- caf\ufffd \ufffd")


def test_another_language_is_detected_not_misread(incident: Incident, tmp_path: Path) -> None:
    """A log written with lc_messages = 'de_DE': the severities and messages are German."""
    german = (
        incident.files["stderr"].read_text()
        .replace("ERROR:", "FEHLER:").replace("STATEMENT:", "ANWEISUNG:")
        .replace("still waiting for", "wartet noch auf")
    )  # fmt: skip
    path = tmp_path / "de.log"
    path.write_text(german)
    data = _json([str(path)])
    assert data["files"][0]["foreign_entries"] > 0
    assert any("another language" in note for note in data["notes"])
    assert data["deadlock_count"] == 0  # "FEHLER: deadlock detected" is not read as English


def test_prefix_patterns_of_common_layouts() -> None:
    lines = {
        "%t [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h ":
            "2026-05-01 03:10:00 UTC [812]: [3-1] user=app,db=shop,app=billing worker,"
            "client=10.0.0.5 LOG:  process 812 still waiting for ShareLock on transaction 9 "
            "after 1000.123 ms",
        "%m [%p] ": "2026-05-01 03:10:00.123 CEST [812] LOG:  checkpoint starting: time",
        "%t:%r:%u@%d:[%p]:": "2026-05-01 03:10:00 UTC:10.0.0.5(5432):app@shop:[812]:LOG:  x",
    }  # fmt: skip
    for prefix, line in lines.items():
        found = prefix_pattern(prefix).match(line)
        assert found is not None and found.group("pid") == "812", prefix
    app = prefix_pattern("%t [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h ").match(
        lines["%t [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h "]
    )
    assert app is not None and app.group("application") == "billing worker"


def test_memory_does_not_hold_the_lines() -> None:
    """A stream of 40 MB of unrelated lines and some waits: what is allocated while reading
    stays a fraction of it (the lines are not kept) and every wait is counted."""

    def lines() -> Iterator[str]:
        for number in range(40_000):
            pid = 1000 + number % 50
            head = (
                f"2026-05-01 03:10:{number % 60:02d}.{number % 1000:03d} UTC [{pid}] app@shop/web "
            )
            if number % 200 == 199:
                yield (
                    f"{head}LOG:  process {pid} still waiting for ExclusiveLock on advisory "
                    f"lock [5,4102,{number},2] after 1000.5 ms\n"
                )
                yield f"{head}DETAIL:  Process holding the lock: 7. Wait queue: {pid}.\n"
            else:
                padding = " " * 1000
                yield f"{head}LOG:  duration: 0.{number} ms  statement: SELECT {number}{padding}\n"

    tracemalloc.start()
    tally = Tally()
    reader = LogReader(lines(), "generated")
    tally.read(reader)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    done = report(tally, Registry())
    assert reader.counts.lines == 40_200 and reader.counts.unparsed == 0
    assert sum(k.tally.waits for k in done.keys) == 200
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MB while reading 40 MB"


@settings(max_examples=200)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=200),
            st.sampled_from(
                [
                    "2026-05-01 03:10:00.123 UTC [812] app@shop/web LOG:  process 812 still "
                    "waiting for ExclusiveLock on advisory lock [5,4102,73,2] after 1000.1 ms",
                    "2026-05-01 03:10:00.123 UTC [812] app@shop/web DETAIL:  Process holding "
                    "the lock: 9. Wait queue: 812.",
                    "2026-05-01 03:10:00.123 UTC [812] app@shop/web ERROR:  deadlock detected",
                    "\tProcess 812 waits for ShareLock on transaction 5; blocked by process 9.",
                    '{"timestamp":"2026-05-01 03:10:00.123 UTC","pid":812,"message":"process"}',
                    '2026-05-01 03:10:00.123 UTC,"app","shop",812,"x",1,1,"",,,,LOG,,"",,',
                ]
            ),
        ),
        max_size=40,
    )
)
def test_any_text_is_read_or_refused_with_one_line(lines: list[str]) -> None:
    """Random lines among real ones: counted and skipped, or a NotALog; never another error."""
    tally = Tally()
    try:
        tally.read(LogReader([f"{line}\n" for line in lines], "fuzz"))
    except NotALog as error:
        assert "\n" not in str(error)
        return
    report(tally, Registry())


# the texts below were produced by real servers (14.23, 15.20, 18.6) outside the story above
_OTHER = [
    (704, "LOG", "process 704 still waiting for ShareLock on relation 16384 of database 5 after "
     "100.713 ms at character 22"),
    (704, "DETAIL", "Processes holding the lock: 24247, 24250. Wait queue: 704."),
    (702, "LOG", "process 702 avoided deadlock for ExclusiveLock on advisory lock [5,9,9,2] by "
     "rearranging queue order after 100.337 ms"),
    (702, "DETAIL", "Process holding the lock: 704. Wait queue: 702."),
    (702, "LOG", "process 702 still waiting for ExclusiveLock on advisory lock [5,9,9,2] after "
     "100.337 ms"),
    (702, "DETAIL", "Process holding the lock: 704. Wait queue: 702."),
    (704, "ERROR", "canceling statement due to user request"),
    (702, "FATAL", "terminating connection due to administrator command"),
    (430, "LOG", "process 430 could not obtain ShareLock on transaction 758"),
    (430, "DETAIL", "Process holding the lock: 429, Wait queue: ."),
    (430, "STATEMENT", "select * from items where id=2 for update nowait"),
]  # fmt: skip
OTHER_MESSAGES = "".join(
    f"2026-12-01 19:02:{51 + n // 4}.{n:03d} UTC [{pid}] postgres@postgres/app {severity}:  "
    f"{text}\n"
    for n, (pid, severity, text) in enumerate(_OTHER)
)


def test_other_real_messages() -> None:
    """Plural holders, a rearranged queue, a cancel and a terminate ending waits, and
    PostgreSQL 18's log_lock_failures message."""
    tally = Tally()
    tally.read(LogReader(OTHER_MESSAGES.splitlines(keepends=True), "other"))
    done = report(tally, Registry())
    by_text = {k.tally.tag.text: k for k in done.keys}
    relation = by_text["relation 16384 of database 5"].tally
    assert relation.outcomes == {"cancelled": 1}
    assert set(relation.episodes[0].holders) == {24247, 24250}
    advisory = by_text["advisory lock [5,9,9,2]"].tally
    assert advisory.outcomes == {"terminated": 1}
    assert by_text["transaction 758"].tally.failures == 1
    assert [c.kind for c in done.cancellations] == ["cancelled", "terminated"]
    timeline = Tally(timeline_key=LockTriple(9, 9, 2))
    timeline.read(LogReader(OTHER_MESSAGES.splitlines(keepends=True), "other"))
    events = [e.event for e in report(timeline, Registry()).timeline]
    assert events[0] == "avoided deadlock (queue rearranged)"
