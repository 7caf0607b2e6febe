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
        _remove_base(self.base)

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
    port = free_port()
    base = _new_base(user)
    try:  # whatever ends it (a failure, Ctrl-C in the middle of initdb): nothing is left
        cluster = Cluster(bindir, base, port, user, dict(settings or {}))
        initdb = [str(bindir / "initdb"), "-D", str(cluster.data), "-U", "postgres"]
        initdb += ["-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]
        result = _run_to_the_end(initdb, user, base)
        if result.returncode != 0:
            output = result.stderr.strip() or result.stdout.strip()
            raise ClusterError(f"initdb failed:\n{output}")
        rules = [*(hba or []), "local all all trust", "host all all 127.0.0.1/32 trust"]
        rules += ["local replication all trust", "host replication all 127.0.0.1/32 trust"]
        (cluster.data / "pg_hba.conf").write_text("\n".join(rules) + "\n")
    except BaseException:
        _remove_base(base)
        raise
    return _started(cluster) if start else cluster


def create_standby(primary: Cluster) -> Cluster:
    """A streaming standby of ``primary`` (pg_basebackup -R), started on its own port."""
    user = primary.user
    port = free_port()
    base = _new_base(user)
    try:
        standby = Cluster(primary.bindir, base, port, user, dict(primary.settings))
        # a command line reads as typed: each option beside its value
        # fmt: off
        result = _run_to_the_end(
            [str(primary.bindir / "pg_basebackup"), "-D", str(standby.data), "-R",
             "-X", "stream", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
             "--no-sync", "--checkpoint=fast"],
            user, base,
        )
        # fmt: on
        if result.returncode != 0:
            raise ClusterError(f"pg_basebackup failed:\n{result.stderr.strip()}")
    except BaseException:
        _remove_base(base)
        raise
    return _started(standby)


def _new_base(user: str | None) -> Path:
    """A fresh directory for one server, and its empty data directory, owned by the user it
    runs as. The data directory is made here, not by initdb, so that it outlives an initdb
    that removes what it wrote when it is ended: its inode names the shared memory a killed
    server process leaves behind (``_remove_base``)."""
    base = Path(tempfile.mkdtemp(prefix="lockdiag-pg-"))
    try:
        (base / "data").mkdir(mode=0o700)
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (base, base / "data"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        base.chmod(0o755)  # the server's user must reach its socket and data in it
    except BaseException:
        _remove_base(base)
        raise
    return base


def _run_to_the_end(
    command: list[str], user: str | None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """Run a server tool (initdb, pg_basebackup) in a process group of its own. Whatever ends
    the run first (Ctrl-C, SIGTERM, a failure) ends the tool and every process it started, and
    returns only when none of them can write any more: initdb's single-user postgres, orphaned
    by a killed initdb, went on writing into the directory being removed."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=user,
        cwd=cwd,
        start_new_session=True,  # Ctrl-C in a terminal reaches us; we end the whole group
    )
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        _end_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _end_group(process: subprocess.Popen[str], grace: float = 3.0) -> None:
    """End the process group ``process`` leads (its pid is the group's id): SIGTERM first, so
    a server process exits as it means to (removing its shared memory), SIGKILL after
    ``grace`` seconds; return once no live process is left in the group."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        deadline = time.monotonic() + grace
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
        while _group_lives(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not _group_lives(process.pid):
            return


def _group_lives(group: int) -> bool:
    """Whether a process of ``group`` still runs. An orphan killed with the group is a zombie
    until its new parent reaps it (it answers a signal, and writes nothing): on Linux, /proc
    says which are; elsewhere every answer counts until the deadline."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for status in proc.glob("[0-9]*/stat"):
        try:  # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            state, _, pgrp = status.read_text().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state != "Z":
            return True
    return False


def _remove_base(base: Path) -> None:
    """Remove a server's directory, and the System V shared memory segment a server process
    killed before it could exit left behind (initdb's bootstrap postgres does not catch
    SIGTERM): PostgreSQL keys it by the data directory's inode, and it is an orphan when no
    process is attached. Only Linux lists segments (/proc/sysvipc/shm); elsewhere the next
    server started in a directory with that inode removes it."""
    with contextlib.suppress(OSError, ValueError):
        data = (base / "data").stat()
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
        # "key shmid perms size cpid lpid nattch uid ...": ours, with no process attached;
        # the key is a 32-bit key_t, the inode cast to it (printed signed)
        key = data.st_ino & 0xFFFFFFFF
        fields = [row.split() for row in rows]
        orphans = [
            int(row[1])
            for row in fields
            if (int(row[0]) & 0xFFFFFFFF, int(row[6]), int(row[7])) == (key, 0, data.st_uid)
        ]
        if orphans:
            import ctypes  # only here: a segment left by a killed server is rare

            libc = ctypes.CDLL(None, use_errno=True)
            for shmid in orphans:
                libc.shmctl(shmid, 0, None)  # IPC_RMID
    shutil.rmtree(base, ignore_errors=True)


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
