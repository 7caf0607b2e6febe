"""Throwaway PostgreSQL clusters for the tests, the benchmark and the demo.

A cluster lives in a fresh temporary directory, listens on 127.0.0.1 on a free port and on a Unix
socket in that directory, and is stopped by the pid of the server it started. PostgreSQL refuses
to run as root, so when lockdiag runs as root the server runs as an unprivileged OS user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockdiag.errors import LockdiagError

BIN_ENV = "LOCKDIAG_PG_BIN"
UNPRIVILEGED_USERS = ("postgres", "nobody")
DEFAULT_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


class ClusterError(LockdiagError):
    """The server binaries are missing, or the server would not start."""


def find_bindir() -> Path:
    """PostgreSQL server binaries: ``$LOCKDIAG_PG_BIN``, ``pg_config --bindir``, then the newest
    ``/usr/lib/postgresql/*/bin``."""
    candidates: list[Path] = []
    if os.environ.get(BIN_ENV):
        candidates.append(Path(os.environ[BIN_ENV]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        result = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        )
        if result.returncode == 0:
            candidates.append(Path(result.stdout.strip()))
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(debian)
    for candidate in candidates:
        if (candidate / "postgres").is_file() and (candidate / "initdb").is_file():
            return candidate
    raise ClusterError(
        "no PostgreSQL server binaries found (looked at $LOCKDIAG_PG_BIN, pg_config --bindir, "
        "/usr/lib/postgresql/*/bin)",
        hint="install them, e.g. apt-get install postgresql, or set LOCKDIAG_PG_BIN",
    )


def server_user() -> str | None:
    """The OS user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ClusterError("running as root and no unprivileged user (postgres, nobody) exists")


def runs_for_server_user(bindir: Path) -> bool:
    """Whether the server's OS user can run ``bindir/postgres``: always as ourselves; as root, only
    when every directory on the way lets that user through (a virtualenv under /root, or under a
    ``mktemp -d`` directory, does not)."""
    user = server_user()
    if user is None:
        return True
    account = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, account.pw_gid))
    path = (bindir / "postgres").resolve()
    for place in (*reversed(path.parents), path):
        status = place.stat()
        if status.st_uid == account.pw_uid:
            bit = stat.S_IXUSR
        elif status.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not status.st_mode & bit:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Cluster:
    bindir: Path
    base: Path
    port: int
    user: str | None
    settings: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def log(self) -> Path:
        return self.base / "server.log"

    @property
    def version(self) -> int:
        """The major version, from PG_VERSION."""
        return int((self.data / "PG_VERSION").read_text().split(".")[0])

    def dsn(self, user: str = "postgres", dbname: str = "postgres", **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": user, "dbname": dbname}
        parts.update(extra)
        return " ".join(f"{key}={_quote(value)}" for key, value in parts.items())

    def start(self, timeout: float = 30.0) -> None:
        command = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        command += ["-k", str(self.base), "-c", "listen_addresses=127.0.0.1"]
        for name, value in {**DEFAULT_SETTINGS, **self.settings}.items():
            command += ["-c", f"{name}={value}"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self.user,
                cwd=self.base,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not the server
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ClusterError(f"PostgreSQL exited at start:\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.05)
        self.stop()
        raise ClusterError(f"PostgreSQL did not start within {timeout:g}s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        result = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", "-h", str(self.base), "-p", str(self.port)],
            check=False,
        )
        return result.returncode == 0

    def stop(self, mode: str = "fast") -> None:
        """Stop the server we started, by its pid: SIGINT is a fast shutdown."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def create_cluster(
    bindir: Path | None = None,
    settings: dict[str, str] | None = None,
    hba: list[str] | None = None,
    start: bool = True,
) -> Cluster:
    """initdb a fresh cluster in a new temporary directory and start it.

    ``hba`` lines go before the default rules (trust on the socket and on 127.0.0.1).
    """
    bindir = bindir or find_bindir()
    user = server_user()
    cluster = Cluster(bindir, _new_base(user), free_port(), user, dict(settings or {}))
    base = cluster.base
    initdb = [str(bindir / "initdb"), "-D", str(cluster.data), "-U", "postgres", "-A", "trust"]
    try:  # whatever ends it (a failure, Ctrl-C in the middle of initdb): nothing is left
        result = subprocess.run(
            [*initdb, "-E", "UTF8", "--locale=C", "--no-sync"],
            capture_output=True,
            text=True,
            user=user,
            cwd=base,
            check=False,
        )
        if result.returncode != 0:
            output = result.stderr.strip() or result.stdout.strip()
            raise ClusterError(f"initdb failed:\n{output}")
        rules = [*(hba or []), "local all all trust", "host all all 127.0.0.1/32 trust"]
        rules += ["local replication all trust", "host replication all 127.0.0.1/32 trust"]
        (cluster.data / "pg_hba.conf").write_text("\n".join(rules) + "\n")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return _started(cluster) if start else cluster


def create_standby(primary: Cluster) -> Cluster:
    """A streaming standby of ``primary`` (pg_basebackup -R), started on its own port."""
    user = primary.user
    standby = Cluster(primary.bindir, _new_base(user), free_port(), user, dict(primary.settings))
    base = standby.base
    # a command line reads as typed: each option beside its value
    # fmt: off
    result = subprocess.run(
        [str(primary.bindir / "pg_basebackup"), "-D", str(standby.data), "-R", "-X", "stream",
         "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "--no-sync",
         "--checkpoint=fast"],
        capture_output=True, text=True, user=user, cwd=base, check=False,
    )
    # fmt: on
    if result.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        raise ClusterError(f"pg_basebackup failed:\n{result.stderr.strip()}")
    return _started(standby)


def _new_base(user: str | None) -> Path:
    """A fresh directory for one server, owned by the user it runs as."""
    base = Path(tempfile.mkdtemp(prefix="lockdiag-pg-"))
    try:
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        base.chmod(0o755)  # the server's user must reach its socket and data in it
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return base


def _started(cluster: Cluster) -> Cluster:
    try:
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def _quote(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class Bouncer:
    """A PgBouncer in front of a cluster, started and stopped by its pid."""

    base: Path
    port: int
    mode: str
    process: subprocess.Popen[bytes] | None = None

    def dsn(self, user: str = "postgres", dbname: str = "postgres", **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": user, "dbname": dbname}
        parts.update(extra)
        return " ".join(f"{key}={_quote(value)}" for key, value in parts.items())

    def console_dsn(self) -> str:
        return self.dsn(dbname="pgbouncer")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # SIGINT: safe shutdown
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def start_pgbouncer(
    cluster: Cluster, mode: str = "transaction", settings: dict[str, str] | None = None
) -> Bouncer:
    """PgBouncer (the ``pgbouncer`` program) on a free port, trusting local users, with
    ``postgres`` as admin. As root it runs as the cluster's unprivileged user."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).is_file():
        raise ClusterError("pgbouncer is not installed", hint="apt-get install pgbouncer")
    base = Path(tempfile.mkdtemp(prefix="lockdiag-pgbouncer-"))
    port = free_port()
    (base / "users.txt").write_text('"postgres" ""\n')
    options = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(base / "users.txt"),
        "admin_users": "postgres",
        "pool_mode": mode,
        "default_pool_size": "4",
        "logfile": str(base / "pgbouncer.log"),
        **(settings or {}),
    }
    lines = ["[databases]", f"* = host=127.0.0.1 port={cluster.port}", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in options.items()]
    (base / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
    if cluster.user is not None:
        entry = pwd.getpwnam(cluster.user)
        for path in (base, *base.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    bouncer = Bouncer(base, port, mode)
    bouncer.process = subprocess.Popen(
        [binary, str(base / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=cluster.user,
        start_new_session=True,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if bouncer.process.poll() is not None:
            log = (base / "pgbouncer.log").read_text(errors="replace")[-2000:]
            bouncer.stop()
            raise ClusterError(f"pgbouncer exited at start:\n{log}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return bouncer
        time.sleep(0.05)
    bouncer.stop()
    raise ClusterError("pgbouncer did not start within 15s")
