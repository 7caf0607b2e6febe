"""How long lockdiag takes to answer when it reads no server: ``--help``, ``--version`` and a
snapshot file read by ``list`` and ``check``, each run as people run it (the console script).

    python bench/startup.py              # 15 runs of each, alternated
    python bench/startup.py --runs 30 --from examples/incident.json

Prints the median and the best of the wall and CPU time (user + system, the child's own) of
each command, with the load average before and after: on a busy machine the wall time waits
for a core, the CPU time much less. The target of issue 36: at most 0.15 s.

Python's bytecode is cached as an installed package has it (a first run of each command writes
it under a temporary PYTHONPYCACHEPREFIX): with PYTHONDONTWRITEBYTECODE set and a module
changed since its last .pyc, every run would compile its source again (tens of milliseconds).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = shutil.which("lockdiag", path=str(Path(sys.executable).parent))
LOCKDIAG = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "lockdiag"]


def commands(snapshot: str) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "--version": ["--version"],
        "list --from FILE": ["list", "--from", snapshot],
        "check --from FILE": ["check", "--from", snapshot],
    }


def timed(arguments: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One run's wall and CPU seconds (its output discarded; check's exit code is a verdict)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([*LOCKDIAG, *arguments], stdout=subprocess.DEVNULL, env=env, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--from", dest="snapshot", default=str(ROOT / "examples/incident.json"))
    options = parser.parse_args()
    cases = commands(options.snapshot)
    cache = tempfile.TemporaryDirectory(prefix="lockdiag-startup-")
    env = {**os.environ, "PYTHONPYCACHEPREFIX": cache.name}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for arguments in cases.values():  # one run each first: bytecode, plugin cache, page cache
        timed(arguments, env)
    load = os.getloadavg()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(options.runs):  # alternated: a busy moment spreads over every command
        for name, arguments in cases.items():
            times[name].append(timed(arguments, env))
    after = os.getloadavg()[0]
    print(f"load average {load[0]:.2f} before, {after:.2f} after; {options.runs} runs each")
    print(
        f"{'command':<20} {'wall median':>12} {'wall best':>10} {'CPU median':>11} {'CPU best':>9}"
    )
    for name, runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{name:<20} {statistics.median(walls):>11.3f}s {min(walls):>9.3f}s "
            f"{statistics.median(cpus):>10.3f}s {min(cpus):>8.3f}s"
        )
    cache.cleanup()


if __name__ == "__main__":
    main()
