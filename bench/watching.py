"""What watching costs the client, and how fast a command that reads a file starts.

    python bench/watching.py                       # 100k locks, 20 s each, this tree
    PYTHONPATH=/tmp/before/src python bench/watching.py --json before.json   # another tree

At 100k held advisory locks (40 sessions, 37 of them waiting), on the bench's own cluster:
the client CPU of `watch` at its default interval on a pseudo-terminal (``--watch-seconds``)
and of `sample --interval 250ms` (``--seconds``), from /proc/PID/stat (utime + stime, all threads)
between two readings taken once the command runs; the CPU of lockdiag's server backend over
the same time; quiet (nothing changes) and under churn (a session takes and releases a lock
every 100 ms, so pg_stat_activity changes at every probe). Then the wall time of `--help` and
`list --from examples/incident.json` (median of 10). Targets (issue 36): watch at most 15 % of
a core, sample at most 25 %, `--help` and `list --from` at most 0.15 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from run import (
    LOCKDIAG,
    OBSERVER_WAITERS,
    Population,
    _terminal_env,
    bench_cluster,
    compile_bytecode,
    cpu_seconds,
    lockdiag_backends,
    wall,
)

from lockdiag.demo.cluster import Cluster

INCIDENT = Path(__file__).parents[1] / "examples" / "incident.json"
SETTLE_S = 3.0  # seconds from the start of a command to the first CPU reading


@contextlib.contextmanager
def churn(cluster: Cluster, on: bool) -> Iterator[None]:
    """A session that takes and releases an advisory lock every 100 ms (when ``on``)."""
    stop = threading.Event()

    def run() -> None:
        with psycopg.connect(cluster.dsn(application_name="bench-churn"), autocommit=True) as c:
            while not stop.is_set():
                c.execute("SELECT pg_advisory_lock(424242, 1)")
                time.sleep(0.05)
                c.execute("SELECT pg_advisory_unlock(424242, 1)")
                time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    if on:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            thread.join(5)


def client_and_server(cluster: Cluster, pid: int, seconds: float) -> dict[str, float]:
    """% of one core used by process ``pid`` and by lockdiag's backends over ``seconds``."""
    backends = lockdiag_backends(cluster)
    client = cpu_seconds(pid)
    started = time.monotonic()
    time.sleep(seconds)
    client_end = cpu_seconds(pid)
    took = time.monotonic() - started
    after = lockdiag_backends(cluster)
    if client is None or client_end is None:
        raise SystemExit("bench: the command ended before it was measured")
    server = sum(after[p] - backends.get(p, 0.0) for p in after)
    return {"client_pct": 100 * (client_end - client) / took, "server_pct": 100 * server / took}


def watch_cost(cluster: Cluster, seconds: float) -> dict[str, float]:
    """`watch` at its default interval on a pseudo-terminal of 50x200."""
    import pexpect

    arguments = [*LOCKDIAG[1:], "watch", "--dsn", cluster.dsn()]
    child = pexpect.spawn(
        LOCKDIAG[0], arguments, dimensions=(50, 200), timeout=120, env=_terminal_env()
    )
    try:
        child.expect("refresh #1")
        drain = threading.Thread(target=_drain, args=(child,), daemon=True)
        drain.start()
        time.sleep(SETTLE_S)
        return client_and_server(cluster, child.pid, seconds)
    finally:
        child.send("q")
        child.expect(pexpect.EOF)
        child.close()


def _drain(child: Any) -> None:
    """Read the child's frames so that it never blocks on a full terminal."""
    import pexpect

    with contextlib.suppress(pexpect.EOF, OSError):
        while True:
            with contextlib.suppress(pexpect.TIMEOUT):  # no new frame this second
                child.read_nonblocking(65536, timeout=1)


def sample_cost(cluster: Cluster, seconds: float) -> dict[str, Any]:
    """`sample --interval 250ms`, measured from SETTLE_S after its start for ``seconds``."""
    duration = f"{seconds + SETTLE_S + 2:g}s"
    command = [*LOCKDIAG, "sample", "--interval", "250ms", "--duration", duration,
               "--format", "json", "--dsn", cluster.dsn()]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(SETTLE_S)
    figures: dict[str, Any] = client_and_server(cluster, process.pid, seconds)
    out, _ = process.communicate(timeout=120)
    document = json.loads(out)
    cost = document.get("cost", {})
    figures.update(
        samples=document["samples"],
        reads=cost.get("pg_locks_reads"),
        achieved_interval_s=document.get("achieved_interval_seconds"),
        read_interval_s=cost.get("read_interval_seconds"),
    )
    return figures


def startup(repeats: int) -> dict[str, float]:
    return {
        "help_s": statistics.median(wall([*LOCKDIAG, "--help"]) for _ in range(repeats)),
        "list_from_file_s": statistics.median(
            wall([*LOCKDIAG, "list", "--from", str(INCIDENT)]) for _ in range(repeats)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    # watch reads the lock table within a duty cycle: at 100k locks about once a minute, so
    # its share of a core is measured over a window that holds a few reads
    parser.add_argument("--watch-seconds", type=float, default=150.0)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    compile_bytecode()
    import lockdiag

    result: dict[str, Any] = {
        "lockdiag": str(Path(lockdiag.__file__).parent),
        "cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "startup": startup(options.repeats),
    }
    with bench_cluster() as cluster, Population(cluster, options.locks, OBSERVER_WAITERS):
        for name, churning in (("quiet", False), ("churn", True)):
            with churn(cluster, churning):
                result[f"watch_{name}"] = watch_cost(cluster, options.watch_seconds)
                result[f"sample_{name}"] = sample_cost(cluster, options.seconds)
    result["loadavg_end"] = list(os.getloadavg())
    print(report(result, options.locks, options.watch_seconds, options.seconds))
    if options.json:
        options.json.write_text(json.dumps(result, indent=2))


def report(result: dict[str, Any], locks: int, watching: float, sampling: float) -> str:
    start = result["startup"]
    lines = [
        f"lockdiag from {result['lockdiag']}; {result['cpus']} CPUs, load average "
        f"{result['loadavg_start'][0]:.1f} at the start, {result['loadavg_end'][0]:.1f} at the end",
        f"--help {start['help_s']:.3f} s, list --from FILE {start['list_from_file_s']:.3f} s "
        "(median wall; target 0.15 s)",
        f"at {locks} locks: % of one core over {watching:g} s (watch) and {sampling:g} s "
        "(sample); targets: watch 15, sample 25, on the client",
    ]
    for name in ("quiet", "churn"):
        watch, sample = result[f"watch_{name}"], result[f"sample_{name}"]
        reads = f"{sample['reads']}" if sample["reads"] is not None else "n/a"
        lines.append(
            f"  {name:<6} watch client {watch['client_pct']:5.1f} server {watch['server_pct']:5.1f}"
            f" | sample client {sample['client_pct']:5.1f} server {sample['server_pct']:5.1f},"
            f" {sample['samples']} samples, {reads} reads, every "
            f"{sample['achieved_interval_s'] or 0:.2f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
