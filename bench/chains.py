"""Deep and shared wait-for chains (issue 44, item 2): what they cost the commands that show
them, read from snapshot files built by hand, or from a real server.

    python bench/chains.py                          # 14 and 30 layers of 3; a 3000-deep chain
    python bench/chains.py --layers 14 30 60 --width 3 --depth 3000 --runs 3 --json out.json
    python bench/chains.py --server --layers 14 30  # real sessions on the bench's own cluster

A layered incident: layer 0 holds one advisory key in share mode, idle; each session of layer
i holds key i in share mode and waits for key i - 1 in exclusive mode, behind the sessions of
layer i - 1 (they hold it) and those of its own layer that asked before it, as
pg_blocking_pids() names them on a real server (tests/test_chains.py builds it there). Each
waiter has ``width`` blockers: width^depth paths from each root. A straight chain: each
session waits for the one before it.

For each file, each command (``check``, ``blockers``, ``blockers --format json``,
``who-holds``, ``watch --once``, each ``--from`` the file, run as people run it) is timed
``--runs`` times: the median wall and CPU seconds, and the largest peak resident memory
(ru_maxrss of that process alone, from wait4). Output is discarded but counted. With
``--server`` the layers are real sessions on a throwaway cluster, the commands read it with
``--timeout`` (2s), and one exporter scrape is timed too (with the exporter's peak memory,
VmHWM, and its ``lockdiag_up``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from lockdiag.core.model import LockRow, ServerInfo, Session, Snapshot
from lockdiag.core.snapshot_file import save

_SCRIPT = shutil.which("lockdiag", path=str(Path(sys.executable).parent))
LOCKDIAG = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "lockdiag"]
NOW = datetime(2026, 12, 1, 3, 0, 0, tzinfo=timezone.utc)
NAMESPACE = 4102
FIRST_PID = 10_000


def _session(pid: int, state: str, application: str) -> Session:
    return Session(
        pid,
        "app",
        "worker",
        application,
        backend_start=NOW - timedelta(hours=1),
        state_change=NOW - timedelta(minutes=5),
        state=state,
        backend_type="client backend",
        query="SELECT pg_advisory_lock(…)",
    )


def _lock(
    pid: int, key: int, mode: str, blocked_by: tuple[int, ...] | None, waited: float
) -> LockRow:
    """A pair-form advisory lock (NAMESPACE, key): granted, or waited for ``waited`` seconds
    behind ``blocked_by`` (pg_blocking_pids())."""
    granted = blocked_by is None
    return LockRow(
        *("advisory", 5, None, None, None, None, None),  # locktype ... transactionid
        classid=NAMESPACE,
        objid=key,
        objsubid=2,
        virtualtransaction=f"{pid}/0",
        pid=pid,
        mode=mode,
        granted=granted,
        waitstart=None if granted else NOW - timedelta(seconds=waited),
        blocked_by=blocked_by,
    )


def _snapshot(sessions: list[Session], locks: list[LockRow]) -> Snapshot:
    server = ServerInfo(150000, NOW, "postgres", 1, False, True, {5: "app"}, "app")
    return Snapshot(server, "bench", "advisory", {s.pid: s for s in sessions}, locks)


def layered(layers: int, width: int) -> Snapshot:
    """``layers`` layers of ``width`` sessions; layer 0 holds, every other one waits."""
    sessions: list[Session] = []
    locks: list[LockRow] = []
    above: list[int] = []
    pid = FIRST_PID
    for level in range(layers):
        layer: list[int] = []
        for n in range(width):
            pid += 1
            sessions.append(_session(pid, "active" if level else "idle", f"layer{level}-{n}"))
            locks.append(_lock(pid, level, "ShareLock", None, 0.0))
            if level:
                waited = 600.0 - level - n / 10
                locks.append(_lock(pid, level - 1, "ExclusiveLock", (*above, *layer), waited))
            layer.append(pid)
        above = layer
    return _snapshot(sessions, locks)


def straight(depth: int) -> Snapshot:
    """A chain ``depth`` waiters deep: each session holds its key and waits for the last's."""
    pids = range(FIRST_PID, FIRST_PID + depth + 1)
    sessions = [_session(pid, "active" if n else "idle", "chain") for n, pid in enumerate(pids)]
    locks = [_lock(pid, n, "ExclusiveLock", None, 0.0) for n, pid in enumerate(pids)]
    locks += [
        _lock(pid, n - 1, "ExclusiveLock", (pid - 1,), 600.0 - n / 10)
        for n, pid in enumerate(pids)
        if n
    ]
    return _snapshot(sessions, locks)


def commands(path: str | None) -> dict[str, list[str]]:
    """Each command measured, reading the file at ``path`` (None: options said later)."""
    source = ["--from", path] if path is not None else []
    return {
        "check": ["check", *source],
        "blockers": ["blockers", *source],
        "blockers --format json": ["blockers", *source, "--format", "json"],
        "who-holds": ["who-holds", "--key", f"{NAMESPACE},0", *source],
        "watch --once": ["watch", "--once", *source],
    }


def run(arguments: list[str]) -> dict[str, float]:
    """One run: wall and CPU seconds, peak memory (MB) and output bytes of that process."""
    with tempfile.TemporaryFile() as out:
        began = time.perf_counter()
        process = subprocess.Popen([*LOCKDIAG, *arguments], stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - began
        process.returncode = os.waitstatus_to_exitcode(status)
        size = out.seek(0, os.SEEK_END)
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,  # kilobytes on Linux
        "output_bytes": float(size),
        "exit": float(process.returncode),
    }


def measure(name: str, shot: Snapshot, runs: int, directory: Path) -> list[dict[str, Any]]:
    path = directory / f"{name.replace(' ', '-')}.json"
    save(shot, path)
    size = path.stat().st_size / 1024
    return [
        _row(name, size, command, [run(arguments) for _ in range(runs)])
        for command, arguments in commands(str(path)).items()
    ]


def _row(name: str, file_kb: float, command: str, times: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "snapshot": name,
        "file_kb": round(file_kb, 1),
        "command": command,
        "wall_s": round(statistics.median(t["wall_s"] for t in times), 3),
        "cpu_s": round(statistics.median(t["cpu_s"] for t in times), 3),
        "peak_mb": round(max(t["peak_mb"] for t in times), 1),
        "output_kb": round(times[0]["output_bytes"] / 1024, 1),
        "exit": int(times[0]["exit"]),
    }


def on_server(layers: int, width: int, runs: int, timeout: str) -> list[dict[str, Any]]:
    """The layered incident with real sessions on a throwaway cluster: each command against
    it, then one exporter scrape."""
    import psycopg
    from run import exporter_process, scraper  # bench/run.py, beside this file

    from lockdiag.demo.cluster import create_cluster

    cluster = create_cluster(settings={"max_connections": str(layers * width + 20)})
    name = f"{layers} layers of {width}, server"
    sessions: list[psycopg.Connection[Any]] = []  # open while measured: they hold the locks
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            for level in range(layers):
                for n in range(width):
                    dsn = cluster.dsn(application_name=f"layer{level}-{n}")
                    sessions.append(_layer_session(dsn, level, admin))
        options = ["--dsn", cluster.dsn(), "--timeout", timeout]
        found = [
            _row(name, 0.0, command, [run([*arguments, *options]) for _ in range(runs)])
            for command, arguments in commands(None).items()
        ]
        with exporter_process(cluster, "--interval", "1h", "--timeout", timeout) as (pid, address):
            scrape = {"wall_s": scraper(address)(), "cpu_s": 0.0, "output_bytes": 0.0, "exit": 0.0}
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            scrape["peak_mb"] = (
                next(int(s.split()[1]) for s in status if s.startswith("VmHWM")) / 1024
            )
            up = _up(address)
        found.append(_row(name, 0.0, f"exporter scrape (up {up})", [scrape]))
        return found
    finally:
        cluster.destroy()  # ends every session, the waiting ones included


def _layer_session(dsn: str, level: int, admin: Any) -> Any:
    """A session that holds key ``level`` in share mode and, past layer 0, waits (in a thread
    of its own) for key ``level - 1`` in exclusive mode; returns once pg_locks shows it."""
    import threading

    import psycopg

    session = psycopg.connect(dsn, autocommit=True)
    session.execute("SELECT pg_advisory_lock_shared(%s, %s)", (NAMESPACE, level))
    if not level:
        return session

    def wait() -> None:
        with contextlib.suppress(psycopg.Error):  # until the cluster goes
            session.execute("SELECT pg_advisory_lock(%s, %s)", (NAMESPACE, level - 1))

    threading.Thread(target=wait, daemon=True).start()
    deadline = time.monotonic() + 30
    while not admin.execute(WAITING, (session.info.backend_pid,)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: pid {session.info.backend_pid} never waited")
        time.sleep(0.01)
    return session


WAITING = "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND waitstart IS NOT NULL"


def _up(address: str) -> str:
    """lockdiag_up on the exporter's page: 1 when its scrape answered within its deadline."""
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=120) as response:
        page = response.read().decode()
    return ",".join(
        line.split()[-1] for line in page.splitlines() if line.startswith("lockdiag_up")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[14, 30])
    parser.add_argument("--width", type=int, default=3)
    parser.add_argument("--depth", type=int, nargs="*", default=[3000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="out", help="also write the figures to this file")
    parser.add_argument("--server", action="store_true", help="real sessions, not files")
    parser.add_argument("--timeout", default="2s", help="the commands' --timeout (--server)")
    options = parser.parse_args()
    results: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    print(
        f"{'snapshot':<26} {'file':>8} {'command':<26} {'wall':>7} {'CPU':>7} {'peak':>9} "
        f"{'output':>9} exit"
    )
    if options.server:
        for layers in options.layers:
            for row in on_server(layers, options.width, options.runs, options.timeout):
                results.append(_print(row))
    else:
        shapes = [
            (f"{n} layers of {options.width}", layered(n, options.width)) for n in options.layers
        ]
        shapes += [(f"chain {d} deep", straight(d)) for d in options.depth]
        with tempfile.TemporaryDirectory(prefix="lockdiag-chains-") as directory:
            for name, shot in shapes:
                for row in measure(name, shot, options.runs, Path(directory)):
                    results.append(_print(row))
    print(f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; {options.runs} runs")
    if options.out:
        Path(options.out).write_text(json.dumps({"runs": options.runs, "results": results}))


def _print(row: dict[str, Any]) -> dict[str, Any]:
    print(
        f"{row['snapshot']:<26} {row['file_kb']:>6.0f}KB {row['command']:<26} "
        f"{row['wall_s']:>6.2f}s {row['cpu_s']:>6.2f}s {row['peak_mb']:>7.1f}MB "
        f"{row['output_kb']:>7.1f}KB {row['exit']:>4}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
