"""Real sessions on the test servers: the roles and databases the session's cluster has
(``conftest.cluster``), sessions that hold and wait for locks in threads (``Sessions``, the
``sessions`` fixture's), and what ``pg_locks`` shows of them, read on a connection of its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from lockdiag.demo.cluster import Cluster

PASSWORD = "s3cret-Pa55"  # the password of role pw_user, checked never to be printed
OBSERVER = "observer"  # a role without pg_read_all_stats
OTHER_DB = "app2"


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

    def waiting(self, worker: Worker, timeout: float = 10.0) -> None:
        """Block until ``worker`` waits for a lock (seen in pg_locks, with its waitstart)."""
        self.until(
            lambda admin: (
                admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted "
                    "AND waitstart IS NOT NULL",
                    (worker.pid,),
                ).fetchone()[0]  # type: ignore[index]
                > 0
            ),
            timeout,
            f"{worker.name} (pid {worker.pid}) to wait for a lock",
        )

    def until(
        self, condition: Callable[[psycopg.Connection[Any]], bool], timeout: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            while time.monotonic() < deadline:
                if condition(admin):
                    return
                time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

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
