"""Real sessions on the test servers: the roles and databases the session's cluster has
(``conftest.cluster``), sessions that hold and wait for locks in threads (``Sessions``, the
``sessions`` fixture's), and what ``pg_locks`` shows of them, read on a connection of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from lockdiag.demo.cluster import Cluster

from helpers import polling

PASSWORD = "s3cret-Pa55"  # the password of role pw_user, checked never to be printed
OBSERVER = "observer"  # a role without pg_read_all_stats
OTHER_DB = "app2"


def url(port: int, dbname: str = "postgres", scheme: str = "postgresql") -> str:
    """The URL of ``dbname`` as postgres on 127.0.0.1:``port`` (``scheme``: a driver's, such as
    SQLAlchemy's ``postgresql+psycopg``)."""
    return f"{scheme}://postgres@127.0.0.1:{port}/{dbname}"


def create_database(cluster: Cluster, name: str, setup: str | None = None) -> None:
    """A database ``name`` of its own on ``cluster``, ``setup`` run in it."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    if setup is not None:
        with psycopg.connect(cluster.dsn(dbname=name), autocommit=True) as connection:
            connection.execute(setup.encode())


@dataclass
class Worker:
    """A real session, optionally running one statement in a background thread."""

    connection: psycopg.Connection[Any]
    pid: int
    name: str
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def run(self, sql: str) -> list[Any]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql.encode())
            return cursor.fetchall() if cursor.description else []

    def start(self, sql: str) -> None:
        """Run ``sql`` in the background (for statements that wait on a lock)."""

        def target() -> None:
            try:
                self.run(sql)
            except BaseException as error:  # stored, looked at by tests that care
                self.error = error

        self.thread = threading.Thread(target=target, daemon=True, name=self.name)
        self.thread.start()

    def done(self, timeout: float = 10.0) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True


@dataclass
class Sessions:
    """Sessions opened on ``cluster``, each a ``Worker``; ``with Sessions(cluster)`` (or
    ``close()``) ends them all, waiters included."""

    cluster: Cluster
    workers: list[Worker] = field(default_factory=list)

    def open(
        self,
        name: str = "worker",
        user: str = "postgres",
        dbname: str = "postgres",
        autocommit: bool = True,
    ) -> Worker:
        connection = psycopg.connect(
            self.cluster.dsn(user=user, dbname=dbname, application_name=name),
            autocommit=autocommit,
        )
        pid = connection.info.backend_pid
        worker = Worker(connection, pid, name)
        self.workers.append(worker)
        return worker

    def waiting(self, *workers: Worker, timeout: float = 10.0) -> None:
        """Block until every one of ``workers`` waits for a lock (seen in pg_locks, with its
        waitstart); fail at once when one of them has failed instead."""

        def all_wait(admin: psycopg.Connection[Any]) -> bool:
            failed = [f"{w.name}: {w.error}" for w in workers if w.error is not None]
            assert not failed, failed
            return waiting_for_a_lock(admin, [w.pid for w in workers])

        names = ", ".join(f"{w.name} (pid {w.pid})" for w in workers)
        self.until(all_wait, timeout, f"{names} to wait for a lock")

    def until(
        self, condition: Callable[[psycopg.Connection[Any]], bool], timeout: float, what: str
    ) -> None:
        """Poll ``condition`` on an admin connection of its own (every 20 ms) until it is
        true; after ``timeout`` seconds fail naming ``what``."""
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            polling.until(lambda: condition(admin), timeout, what, every=0.02)

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every helper session by pid (waiters included), then close the connections."""
        pids = [w.pid for w in self.workers]
        if pids:
            with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,)
                )
        for worker in self.workers:
            worker.done(5)
            worker.connection.close()
        self.workers.clear()


@contextlib.contextmanager
def keep_alive(worker: Worker, every: float = 0.5) -> Iterator[None]:
    """A keep-alive on WORKER's connection, as leader libraries ping theirs: SELECT 1 every
    EVERY seconds (its state_change keeps moving; its locks stay held)."""
    stop = threading.Event()

    def ping() -> None:
        while not stop.wait(every):
            worker.run("SELECT 1")

    thread = threading.Thread(target=ping, daemon=True, name="ping")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def until_waiting(cluster: Cluster, *pids: int, timeout: float = 10.0) -> None:
    """Block until every one of ``pids`` waits for a lock (``waiting_for_a_lock``)."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        polling.until(
            lambda: waiting_for_a_lock(admin, list(pids)), timeout,
            f"pid(s) {', '.join(map(str, pids))} to wait for a lock", every=0.02,
        )  # fmt: skip


def waiting_for_a_lock(admin: psycopg.Connection[Any], pids: list[int]) -> bool:
    """Whether every one of ``pids`` waits for a lock: one not granted in pg_locks, with its
    waitstart (set once the wait has begun, so a reader of the snapshot sees it as a wait)."""
    row = admin.execute(
        "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted "
        "AND waitstart IS NOT NULL AND pid = ANY(%s::int[])",
        (pids,),
    ).fetchone()
    return row is not None and row[0] == len(set(pids))


def held(cluster: Cluster, resource: int, namespace: int = 4102) -> int:
    """How many sessions hold advisory lock (``namespace``, ``resource``), tenant_summary's
    namespace unless said: granted in pg_locks, seen from a connection of its own."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND (classid, objid, objsubid) = (%s, %s, 2)", (namespace, resource),
        ).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


def advisory_locks_of(cluster: Cluster, pid: int) -> int:
    """How many advisory locks backend ``pid`` holds or waits for."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", (pid,)
        ).fetchone()
    return int(row[0]) if row else 0
