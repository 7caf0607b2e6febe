"""Programs that hold advisory locks idle by design, run for real against PostgreSQL 15 where
they are Python (tooz, RelStorage, dramatiq-pg, django-pglock), or taken with the formula their
source writes (Grafana, tern: Go). Each program is installed once with pip into a cache
directory and reused; no network the first time, or no pip: the test fails, it never skips."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.core.catalogue import FIXED, SOFTWARE, grafana_key, tooz_key
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import LockTriple, from_bigint, from_pair

from helpers.cli import list_json
from helpers.servers import Sessions, create_database, url

PIP_CACHE = Path.home() / ".cache" / "lockdiag-tests" / "pip"  # one install per set, reused


def pip_target(*specs: str) -> Path:
    """A directory holding ``specs`` installed by pip (``--target``), installed once."""
    where = PIP_CACHE / "+".join(s.replace("[", "_").replace("]", "_") for s in specs)
    done = where / ".installed"
    if not done.is_file():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--target", str(where), *specs],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"pip install {' '.join(specs)} failed:\n{result.stderr}"
        done.write_text("\n".join(specs) + "\n")
    return where


class Program:
    """A Python script run with the installed packages; it prints a line when it holds its
    lock and lets go when its standard input is closed."""

    def __init__(self, packages: Path, script: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(packages)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *args], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_for(self, word: str) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip() == word:
                return
        raise AssertionError(f"the program ended before saying {word!r}")

    def finish(self) -> str:
        """Close its input (it lets go) and wait for it to end well."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        output = self.process.stdout.read()
        assert self.process.wait(60) == 0, output
        return output


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    started: list[Program] = []
    yield started
    for program in started:
        if program.process.poll() is None:
            program.process.kill()
            program.process.wait(10)


def held(cluster: Cluster, where: str) -> list[tuple[Any, ...]]:
    """(pid, triple, application_name, state, in a transaction) of granted advisory locks."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT l.pid, l.classid, l.objid, l.objsubid, a.application_name, a.state, "
            "a.xact_start IS NOT NULL FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
            f"WHERE l.locktype = 'advisory' AND l.granted AND {where}"
        ).fetchall()
    return [(r[0], LockTriple(r[1], r[2], r[3]), *r[4:]) for r in rows]


def listed(cluster: Cluster, dbname: str, *args: str) -> list[dict[str, Any]]:
    locks: list[dict[str, Any]] = list_json(cluster, *args, dbname=dbname)["locks"]
    return locks


# -- tooz: a coordination library, idle in transaction for the whole hold ---------------------

TOOZ = """
import sys
from tooz import coordination
coordinator = coordination.get_coordinator(sys.argv[1], b"member-1")
coordinator.start()
with coordinator.get_lock(sys.argv[2].encode()):
    print("held", flush=True)
    sys.stdin.read()
coordinator.stop()
"""


def test_tooz_run_for_real(cluster: Cluster, programs: list[Program], tmp_path: Path) -> None:
    """tooz 9.1.0 (tooz/drivers/pgsql.py PostgresLock): ``pg_advisory_lock(%s, %s)`` with the
    first two bytes of md5(name), on a psycopg2 connection of its own that is never autocommit:
    the member's session stays idle in transaction for as long as it holds the lock."""
    packages = pip_target("tooz==9.1.0", "psycopg2-binary")
    create_database(cluster, "tooz_db")
    member = Program(packages, TOOZ, url(cluster.port, "tooz_db"), "nightly-sync")
    programs.append(member)
    member.wait_for("held")
    digest = hashlib.md5(
        b"nightly-sync", usedforsecurity=False
    ).digest()  # as the driver computes it
    ((pid, triple, _, state, in_transaction),) = held(cluster, "a.datname = 'tooz_db'")
    assert triple == from_pair(digest[0], digest[1]) == tooz_key("nightly-sync")
    assert triple == LockTriple(245, 224, 2)
    assert (state, in_transaction) == ("idle in transaction", True)
    (lock,) = [lock for lock in listed(cluster, "tooz_db") if lock["pid"] == pid]
    assert lock["known"] is None  # 65,536 keys: named only from a listed name
    (tmp_path / "lockdiag.toml").write_text('[known]\ntooz = ["nightly-sync"]\n')
    registry = ["--registry", str(tmp_path / "lockdiag.toml")]
    (lock,) = [lock for lock in listed(cluster, "tooz_db", *registry) if lock["pid"] == pid]
    assert lock["known"] == {
        "software": "tooz", "meaning": "lock 'nightly-sync'", "confidence": "derived"
    }  # fmt: skip
    assert "idle in transaction" in SOFTWARE["tooz"].normal
    member.finish()
    assert held(cluster, "a.datname = 'tooz_db'") == []


# -- RelStorage: ZODB's two-phase commit, idle in transaction between vote and finish ----------

RELSTORAGE = """
import sys
import transaction, ZODB
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError
from ZODB.utils import z64
from relstorage.adapters.postgresql import PostgreSQLAdapter
from relstorage.options import Options
from relstorage.storage import RelStorage
options = Options(keep_history=False, commit_lock_timeout=30)
db = ZODB.DB(RelStorage(PostgreSQLAdapter(dsn=sys.argv[1], options=options), options=options))
if sys.argv[2] == "setup":
    connection = db.open()
    connection.root()["counter"] = 1
    transaction.commit()
    connection.close()
else:  # one commit of the root object, stopped between its vote and its finish
    storage = db.storage.new_instance()
    txn = TransactionMetaData()
    storage.tpc_begin(txn)
    data, serial = storage.load(z64)
    print("storing", flush=True)
    storage.store(z64, serial, data, "", txn)
    try:
        storage.tpc_vote(txn)
    except ConflictError:  # it waited for the lock, then saw the other commit's change
        print("conflict", flush=True)
        storage.tpc_abort(txn)
    else:
        print("voted", flush=True)
        sys.stdin.read()
        storage.tpc_finish(txn)
    storage.release()
db.close()
"""


def test_relstorage_run_for_real(
    cluster: Cluster, sessions: Sessions, programs: list[Program]
) -> None:
    """RelStorage 4.3.0 with ZODB, history-free: between tpc_vote and tpc_finish its store
    connection ('RS: Store', connmanager.py) is idle in transaction holding
    ``pg_advisory_xact_lock(zoid)`` for each object it changes
    (procs/lock_objects_and_detect_conflicts.sql): the root object's OID 0 here. A second
    commit of the same object waits for it. lockdiag speaks of it in RelStorage's terms and
    never advises the timeout that would break the commit's second phase; its pack lock -2
    (locker.py) is named where RelStorage's tables are, and only "could be" elsewhere."""
    packages = pip_target("RelStorage[postgresql]==4.3.0", "ZODB", "psycopg2-binary")
    create_database(cluster, "rs_db")
    dsn = f"host=127.0.0.1 port={cluster.port} user=postgres dbname=rs_db"
    Program(packages, RELSTORAGE, dsn, "setup").finish()
    first = Program(packages, RELSTORAGE, dsn, "commit")
    programs.append(first)
    first.wait_for("voted")
    ((pid, triple, app, state, in_transaction),) = held(cluster, "a.datname = 'rs_db'")
    assert (triple, app, state, in_transaction) == (
        from_bigint(0),
        "RS: Store",
        "idle in transaction",
        True,
    )
    second = Program(packages, RELSTORAGE, dsn, "commit")
    programs.append(second)
    second.wait_for("storing")
    sessions.until(
        lambda admin: bool(
            admin.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchall()
        ),
        30,
        "the second commit to wait for the object's lock",
    )
    result = CliRunner().invoke(
        cli,
        ["check", "--dsn", cluster.dsn(dbname="rs_db"), "--idle-age", "0s", "--format", "json"],
    )
    document = json.loads(result.stdout)
    (finding,) = [f for f in document["findings"] if f["kind"] == "stuck-owner"]
    assert finding["pid"] == pid
    step = finding["next_step"]
    assert "RelStorage" in step and "inconsistent state" in step, step
    assert "idle_in_transaction_session_timeout" not in step
    assert "pg_terminate_backend" not in step
    first.finish()
    assert "conflict" in second.finish()  # it waited, then saw the first one's commit
    # the pack lock, as locker.py hold_pack_lock() takes it
    packer = sessions.open("RS: Prepack", dbname="rs_db")
    packer.run("SELECT pg_try_advisory_lock(-2)")
    (lock,) = [lock for lock in listed(cluster, "rs_db") if lock["pid"] == packer.pid]
    assert lock["known"]["software"] == "RelStorage"
    assert lock["known"]["meaning"] == "pack lock"
    assert lock["known"]["confidence"] == "corroborated"
    elsewhere = sessions.open("some-program", dbname="postgres")
    elsewhere.run("SELECT pg_try_advisory_lock(-2)")  # no RelStorage table, no RS: session
    (lock,) = [lock for lock in listed(cluster, "postgres") if lock["pid"] == elsewhere.pid]
    assert lock["known"]["confidence"] == "guess"
    assert FIXED[from_bigint(-1)].software == "RelStorage"


# -- dramatiq-pg: a session lock per consumed message, on an idle consumer connection ----------

DRAMATIQ = """
import sys, threading
import dramatiq
from dramatiq_pg import PostgresBroker
broker = PostgresBroker(url=sys.argv[1], results=False)
dramatiq.set_broker(broker)
done = threading.Event()

@dramatiq.actor(queue_name="reports")
def build():
    print("working", flush=True)
    sys.stdin.read()
    done.set()

message = build.send()
worker = dramatiq.Worker(broker, worker_threads=1)
worker.start()
assert done.wait(60)
worker.join()
worker.stop()
"""


def test_dramatiq_pg_run_for_real(cluster: Cluster, programs: list[Program]) -> None:
    """dramatiq-pg 0.12.0 (dramatiq_pg/broker.py): the consumer connection
    (application_name 'dramatiq-pg', autocommit) takes ``pg_try_advisory_lock(message_lock)``
    in CONSUME_ONE and keeps it, idle, while the worker runs the message; message_lock() is
    ``int(sha256(queue_name + message_id).hexdigest()[24:40], 16) - 2**63``. lockdiag names
    it from the row of dramatiq.queue."""
    packages = pip_target("dramatiq-pg==0.12.0", "dramatiq", "psycopg2-binary")
    create_database(cluster, "dq_db")
    schema = (packages / "dramatiq_pg" / "schema.sql").read_text()
    with psycopg.connect(cluster.dsn(dbname="dq_db"), autocommit=True) as setup:
        for line in schema.splitlines():  # psql's variables, as the file sets them
            if line.startswith("\\set "):
                _, name, value = line.split(maxsplit=2)
                schema = schema.replace(f':"{name}"', f'"{value.strip(chr(39))}"')
        setup.execute("\n".join(x for x in schema.splitlines() if not x.startswith("\\")))
    worker = Program(packages, DRAMATIQ, url(cluster.port, "dq_db"))
    programs.append(worker)
    worker.wait_for("working")
    with psycopg.connect(cluster.dsn(dbname="dq_db")) as db:
        ((queue, message_id),) = db.execute(
            "SELECT queue_name, message_id::text FROM dramatiq.queue"
        ).fetchall()
    digest = hashlib.sha256(f"{queue}{message_id}".encode()).hexdigest()
    expected = from_bigint(int(digest[24:40], 16) - 2**63)  # as message_lock() computes it
    ((pid, triple, app, state, in_transaction),) = held(cluster, "a.datname = 'dq_db'")
    assert (triple, app, state, in_transaction) == (expected, "dramatiq-pg", "idle", False)
    (lock,) = [lock for lock in listed(cluster, "dq_db") if lock["pid"] == pid]
    assert lock["known"] == {
        "software": "dramatiq-pg", "meaning": f"message {queue}/{message_id}",
        "confidence": "derived",
    }  # fmt: skip
    worker.finish()


# -- django-pglock: sha256 read little-endian ------------------------------------------------

DJANGO_PGLOCK = """
import sys
import django
from django.conf import settings
settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "HOST": "127.0.0.1",
                           "PORT": sys.argv[1], "USER": "postgres", "NAME": "postgres"}},
    INSTALLED_APPS=["pgactivity", "pglock"],
)
django.setup()
import pglock
with pglock.advisory(sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_django_pglock_run_for_real(
    cluster: Cluster, programs: list[Program], tmp_path: Path
) -> None:
    """django-pglock 1.8.0 (pglock/core.py _cast_lock_id): ``pg_advisory_lock(int.from_bytes(
    sha256(name)[:8], "little", signed=True))``, a session lock on Django's connection, idle
    between queries. A name listed under [known] django_pglocks is tried in that byte order."""
    packages = pip_target("django-pglock==1.8.0", "django", "psycopg2-binary")
    program = Program(packages, DJANGO_PGLOCK, str(cluster.port), "report:daily")
    programs.append(program)
    program.wait_for("held")
    key = int.from_bytes(hashlib.sha256(b"report:daily").digest()[:8], "little", signed=True)
    ((pid, triple, _, state, in_transaction),) = held(cluster, "a.datname = 'postgres'")
    assert (triple, state, in_transaction) == (from_bigint(key), "idle", False)
    (tmp_path / "lockdiag.toml").write_text('[known]\ndjango_pglocks = ["report:daily"]\n')
    registry = ["--registry", str(tmp_path / "lockdiag.toml")]
    (lock,) = [lock for lock in listed(cluster, "postgres", *registry) if lock["pid"] == pid]
    assert lock["known"] == {
        "software": "django-pglock", "meaning": "lock 'report:daily'", "confidence": "derived"
    }  # fmt: skip
    program.finish()


# -- Grafana and tern (Go): the lock as their source takes it ----------------------------------


def test_grafana_and_tern_with_their_formulas(cluster: Cluster, sessions: Sessions) -> None:
    """Grafana (pkg/services/sqlstore/migrator/migrator.go RunMigrations):
    ``pg_try_advisory_lock(GenerateAdvisoryLockId(dbName))`` on a connection of its own,
    golang-migrate's database/util.go with no other names: crc32(dbName) * 1486364155, uint32.
    tern (migrate/migrate.go): ``pg_advisory_lock(9628173550095224)``."""
    create_database(cluster, "grafana")
    key = (zlib.crc32(b"grafana") * 1486364155) % 2**32  # Go's uint32 product
    assert grafana_key("grafana") == from_bigint(key)
    holder = sessions.open("grafana-migrator", dbname="grafana")
    holder.run(f"SELECT pg_try_advisory_lock({key}), pg_advisory_lock(9628173550095224)")
    found = {
        lock["known"]["software"]: lock["known"]
        for lock in listed(cluster, "grafana")
        if lock["pid"] == holder.pid
    }
    assert found["Grafana"] == {
        "software": "Grafana", "meaning": "migration lock of database grafana",
        "confidence": "derived",
    }  # fmt: skip
    assert found["tern"]["confidence"] == "exact"
    other = sessions.open("elsewhere", dbname="postgres")
    other.run(f"SELECT pg_try_advisory_lock({key})")  # another database, another key
    (lock,) = [lock for lock in listed(cluster, "postgres") if lock["pid"] == other.pid]
    assert lock["known"] is None
    assert SOFTWARE["Grafana"].runs and SOFTWARE["tern"].runs
