"""How fast `lockdiag log` reads a large server log, and how much memory it takes.

    python bench/log.py                 # a 400 MB stderr log (and its csvlog twin with --csv)
    python bench/log.py --mb 50 --csv   # smaller, both formats
    python bench/log.py --real --mb 200 # a wait-dense log written by a real server (cached)
    python bench/log.py --distinct 2000000  # waits that never end, each its own pid and key

With ``--real`` the log is written by a real PostgreSQL: a throwaway cluster with
log_lock_waits = on and deadlock_timeout = 10ms, and pgbench sessions that take
pg_advisory_xact_lock on a few keys and sleep a little while holding it, until the log has
reached the size asked. It is cached under /tmp (``REAL_CACHE``) so that a rerun measures at
once. Measured on it: lockdiag log and pgBadger -j 1 on the whole file, peak RSS of each, and
lockdiag's counts against ``grep -c``.

The log is generated: mostly unrelated statements (log_min_duration_statement = 0 style),
connections and checkpoints, and one lock wait (still waiting + DETAIL + STATEMENT, then
acquired) in every thousand entries, some on registry keys. Measured: lockdiag's throughput
(MB/s) and peak RSS (from the child's own rusage), beside `grep -c 'still waiting'` on the same
file (the floor: reading the bytes) and pgBadger when it is installed.

With ``--distinct N`` the log is hostile: N waits (``still waiting`` and its DETAIL) that
never end, each with a pid, a key and a holder of its own, the most per-wait state a log can
make lockdiag keep. Measured: time and peak RSS, flat in N past the tally's bound on the waits
open at once (tally.OPEN_WAITS), and the waits counted (all N) and closed early.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "%m [%p] %q%u@%d/%a "
REAL_CACHE = Path(tempfile.gettempdir()) / "lockdiag-bench-log"
# each transaction waits for one of a few keys, holds it a few ms: waits pass 10ms in a queue
CONTENTION_SCRIPT = """\\set k random(1, 6)
\\set b random(1, 3)
BEGIN;
SELECT pg_advisory_xact_lock(4102, :k);
SELECT pg_sleep(0.002);
SELECT pg_advisory_xact_lock(30064771072 + :b);
COMMIT;
"""
APPS = ("web", "billing-worker", "tenant-summary-worker", "psql", "reporting")


def _stamp(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole % 86400, 3600)
    millis = int(seconds * 1000) % 1000
    return f"2026-05-01 {hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{millis:03d} UTC"


def generate(path: Path, megabytes: int, csv: bool = False) -> int:
    """Write a log of about ``megabytes``; return the number of lock waits in it."""
    chance = random.Random(27)  # noqa: S311 - the same log every run, no secret
    target = megabytes * 2**20
    waits = 0
    clock = 3 * 3600.0
    with path.open("w") as out:
        written = 0
        while written < target:
            chunk: list[str] = []
            for number in range(1000):
                clock += 0.003
                pid = 4000 + chance.randrange(300)
                app = APPS[pid % len(APPS)]
                head = f"{_stamp(clock)} [{pid}] app@shop/{app} "
                if number == 500:
                    waits += 1
                    holder = 4000 + chance.randrange(300)
                    key = chance.choice(("4102,73", "4102,74", "7,5", "31,1"))
                    tag = f"advisory lock [16384,{key},{1 if key == '7,5' else 2}]"
                    waited = 1000 + chance.random() * 4000
                    chunk += _wait_lines(head, pid, holder, tag, waited, clock, app, csv)
                elif number % 97 == 0:
                    chunk.append(
                        _line(
                            head,
                            "LOG",
                            f"connection authorized: user=app database=shop application_name={app}",
                            clock,
                            pid,
                            app,
                            csv,
                        )
                    )
                else:
                    ms = chance.random() * 20
                    statement = (
                        f"SELECT o.id, o.total, c.name FROM orders o JOIN customers c ON "
                        f"c.id = o.customer_id WHERE o.id = {chance.randrange(10**7)}"
                    )
                    chunk.append(
                        _line(
                            head,
                            "LOG",
                            f"duration: {ms:.3f} ms  statement: {statement}",
                            clock,
                            pid,
                            app,
                            csv,
                        )
                    )
            text = "".join(chunk)
            out.write(text)
            written += len(text)
    return waits


def generate_real(megabytes: int, clients: int = 24) -> Path:
    """A stderr log of about ``megabytes`` written by a real server under lock contention;
    cached by size under REAL_CACHE (delete it to write a new one)."""
    cached = REAL_CACHE / f"real-{megabytes}mb.log"
    if cached.exists():
        return cached
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from lockdiag.demo.cluster import create_cluster

    settings = {
        "log_lock_waits": "on",
        "deadlock_timeout": "10ms",
        "logging_collector": "on",
        "log_destination": "stderr",
        "log_directory": "log",
        "log_filename": "postgresql.log",
        "log_rotation_size": "0",
        "log_line_prefix": PREFIX,
    }
    server = create_cluster(settings=settings)
    try:
        log = server.data / "log" / "postgresql.log"
        script = server.base / "contention.sql"
        script.write_text(CONTENTION_SCRIPT)
        pgbench = [
            shutil.which("pgbench") or "pgbench",
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            str(server.port),
            "-U",
            "postgres",
            "-c",
            str(clients),
            "-j",
            "2",
            "-T",
            "20",
            "-f",
            str(script),
            "postgres",
        ]
        environment = {**os.environ, "PGAPPNAME": "tenant-summary-worker"}
        while not log.exists() or log.stat().st_size < megabytes * 2**20:
            subprocess.run(pgbench, env=environment, capture_output=True, check=True)
            size = log.stat().st_size / 2**20 if log.exists() else 0.0
            print(f"  real server log: {size:.0f} of {megabytes} MB", flush=True)
        server.stop()  # the collector flushes the file
        REAL_CACHE.mkdir(exist_ok=True)
        partial = cached.with_suffix(".partial")
        shutil.copy(log, partial)
        partial.rename(cached)
    finally:
        server.destroy()
    return cached


def _line(
    head: str,
    severity: str,
    message: str,
    clock: float,
    pid: int,
    app: str,
    csv: bool,
    detail: str = "",
    statement: str = "",
) -> str:
    if not csv:
        lines = f"{head}{severity}:  {message}\n"
        if detail:
            lines += f"{head}DETAIL:  {detail}\n"
        if statement:
            lines += f"{head}STATEMENT:  {statement}\n"
        return lines
    quoted = message.replace('"', '""')
    return (
        f'{_stamp(clock)},"app","shop",{pid},"10.0.0.5:5000",6b0f19be.{pid:x},1,"SELECT",'
        f'2026-05-01 03:00:00 UTC,3/2,0,{severity},00000,"{quoted}",'
        f"{f'{chr(34)}{detail}{chr(34)}' if detail else ''},,,,,"
        f'{f"{chr(34)}{statement}{chr(34)}" if statement else ""},,,"{app}","client backend",,0\n'
    )


def _wait_lines(
    head: str, pid: int, holder: int, tag: str, waited: float, clock: float, app: str, csv: bool
) -> list[str]:
    statement = "SELECT pg_advisory_xact_lock(4102, 73)"
    detail = f"Process holding the lock: {holder}. Wait queue: {pid}."
    return [
        _line(
            head,
            "LOG",
            f"process {pid} still waiting for ExclusiveLock on {tag} after 1000.112 ms",
            clock,
            pid,
            app,
            csv,
            detail,
            statement,
        ),
        _line(
            head,
            "LOG",
            f"process {pid} acquired ExclusiveLock on {tag} after {waited:.3f} ms",
            clock,
            pid,
            app,
            csv,
            "",
            statement,
        ),
    ]


def generate_distinct(path: Path, waits: int) -> None:
    """N waits that never end, each with its own pid (100 up: all under Linux's largest
    pid_max, 4194304, for N up to 4 million), key and holder."""
    with path.open("w") as out:
        chunk: list[str] = []
        for number in range(waits):
            pid = 100 + number
            head = f"{_stamp(3 * 3600 + number / 1000)} [{pid}] app@shop/worker "
            chunk.append(
                f"{head}LOG:  process {pid} still waiting for ExclusiveLock on advisory lock "
                f"[5,4102,{number},2] after 1000.{number % 1000:03d} ms\n{head}DETAIL:  Process "
                f"holding the lock: {pid + 4_000_000}. Wait queue: {pid}.\n"
            )
            if len(chunk) >= 10_000:
                out.write("".join(chunk))
                chunk = []
        out.write("".join(chunk))


def _distinct_report(waits: int, keep: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="lockdiag-bench-log-"))
    try:
        path = base / "distinct.log"
        generate_distinct(path, waits)
        size = path.stat().st_size / 2**20
        output = base / "distinct.json"
        command = [sys.executable, "-m", "lockdiag", "log", str(path), "--format", "json"]
        seconds, rss, status, cpu = measure_cpu(
            ["sh", "-c", f'exec "$@" > {output}', "-", *command]
        )
        if status != 0:
            raise SystemExit(f"lockdiag log failed with exit status {status}")
        found = json.loads(output.read_text())
        counted = sum(key["waits"] for key in found["keys"])
        print(f"{waits} distinct waits that never end: {size:.0f} MB ({path})")
        print(
            f"  lockdiag log: {seconds:.1f}s wall, {cpu:.1f}s CPU, peak RSS {rss / 1024:.0f} MB; "
            f"{counted} waits counted, {found.get('waits_closed_early')} closed early"
        )
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def measure(command: list[str]) -> tuple[float, int, int]:
    """(seconds, peak RSS in KiB, exit status) of one child process."""
    elapsed, rss, status, _ = measure_cpu(command)
    return elapsed, rss, status


def measure_cpu(command: list[str]) -> tuple[float, int, int, float]:
    """(seconds, peak RSS in KiB, exit status, CPU seconds) of one child process: the CPU
    time holds on a machine busy with other work, where the wall time moves."""
    started = time.perf_counter()
    # not /dev/null: GNU grep stops at the first match when its output goes there
    with tempfile.TemporaryFile() as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_maxrss, child.returncode, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400, help="size of the generated log")
    parser.add_argument("--csv", action="store_true", help="also a csvlog of the same size")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--badger-mb", type=int, default=40, help="pgBadger's share of the log")
    parser.add_argument("--real", action="store_true", help="a log written by a real server")
    parser.add_argument(
        "--distinct", type=int, metavar="N", help="N waits that never end, each its own pid"
    )
    args = parser.parse_args()
    if args.distinct:
        _distinct_report(args.distinct, args.keep)
        return
    if args.real:
        _real_report(generate_real(args.mb))
        return
    base = Path(tempfile.mkdtemp(prefix="lockdiag-bench-log-"))
    try:
        kinds = [("stderr", base / "postgresql.log")]
        if args.csv:
            kinds.append(("csvlog", base / "postgresql.csv"))
        for kind, path in kinds:
            started = time.perf_counter()
            waits = generate(path, args.mb, csv=kind == "csvlog")
            size = path.stat().st_size / 2**20
            print(
                f"{kind}: generated {size:.0f} MB, {waits} lock waits, in "
                f"{time.perf_counter() - started:.1f}s: {path}"
            )
            _report(kind, path, size, args.badger_mb)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def _real_report(path: Path) -> None:
    """lockdiag log and pgBadger -j 1 on the whole of a real server's log; counts against
    grep's."""
    size = path.stat().st_size / 2**20
    measure(["cat", str(path)])  # warm the page cache
    output = Path(tempfile.gettempdir()) / "lockdiag-bench-log-real.json"
    command = [sys.executable, "-m", "lockdiag", "log", str(path), "--format", "json"]
    # exec: the shell becomes lockdiag, so that the figures are lockdiag's own
    seconds, rss, status, cpu = measure_cpu(["sh", "-c", f'exec "$@" > {output}', "-", *command])
    if status != 0:
        raise SystemExit(f"lockdiag log failed with exit status {status}")
    found = json.loads(output.read_text())
    waits = sum(key["waits"] for key in found["keys"])
    acquired = sum(key["outcomes"].get("acquired", 0) for key in found["keys"])
    grep = {
        word: int(
            subprocess.run(
                ["grep", "-c", word, str(path)], capture_output=True, text=True, check=False
            ).stdout
            or 0
        )
        for word in ("still waiting for", " acquired ")
    }
    load = os.getloadavg()[0]
    print(f"real server log: {size:.0f} MB, load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"  lockdiag log: {seconds:.1f}s wall, {cpu:.1f}s CPU, peak RSS {rss / 1024:.0f} MB")
    print(
        f"  waits: lockdiag {waits}, grep -c 'still waiting for' {grep['still waiting for']}; "
        f"acquired: lockdiag {acquired}, grep -c ' acquired ' {grep[' acquired ']}"
    )
    badger = shutil.which("pgbadger")
    if badger is None:
        print("  pgbadger: not installed (apt-get install pgbadger)")
        return
    html = Path(tempfile.gettempdir()) / "lockdiag-bench-pgbadger-real.html"
    b_seconds, b_rss, b_status, b_cpu = measure_cpu(
        [badger, "-j", "1", "-f", "stderr", "--prefix", PREFIX, "-o", str(html), "-q", str(path)]
    )
    state = "" if b_status == 0 else f" (exit status {b_status})"
    print(
        f"  pgbadger -j 1: {b_seconds:.1f}s wall, {b_cpu:.1f}s CPU, peak RSS "
        f"{b_rss / 1024:.0f} MB{state}"
    )
    print(
        f"  lockdiag is {b_seconds / seconds:.1f}x faster by the wall clock, "
        f"{b_cpu / cpu:.1f}x by CPU time"
    )


def _report(kind: str, path: Path, size: float, badger_mb: int) -> None:
    measure(["cat", str(path)])  # warm the page cache: every tool reads from memory
    lockdiag = [sys.executable, "-m", "lockdiag", "log", str(path), "--format", "json"]
    seconds, rss, status = measure(lockdiag)
    if status != 0:
        raise SystemExit(f"lockdiag log failed with exit status {status}")
    grep_seconds, _, _ = measure(["grep", "-c", "still waiting", str(path)])
    print(
        f"  lockdiag log: {seconds:.2f}s, {size / seconds:.0f} MB/s, peak RSS {rss / 1024:.0f} MB"
    )
    print(
        f"  grep -c 'still waiting': {grep_seconds:.2f}s, {size / grep_seconds:.0f} MB/s "
        f"(lockdiag takes {seconds / grep_seconds:.1f}x grep's time)"
    )
    badger = shutil.which("pgbadger")
    if badger is None:
        print("  pgbadger: not installed (apt-get install pgbadger)")
        return
    # pgBadger reads about 1 MB/s: it gets the first BADGER_MB of the same log, and lockdiag
    # is timed again on that part, so that the two figures compare like with like
    part = path.with_name(f"part-{path.name}")
    with path.open() as whole, part.open("w") as out:
        written = 0
        for line in whole:
            if written >= badger_mb * 2**20 and not line.startswith("\t"):
                break
            out.write(line)
            written += len(line)
    part_size = part.stat().st_size / 2**20
    part_seconds, _, _ = measure([*lockdiag[:4], str(part), "--format", "json"])
    out_file = Path(tempfile.gettempdir()) / f"lockdiag-bench-pgbadger-{kind}.html"
    fmt = ["-f", "stderr", "--prefix", PREFIX] if kind == "stderr" else ["-f", "csv"]
    badger_seconds, badger_rss, badger_status = measure(
        [badger, *fmt, "-o", str(out_file), "-q", str(part)]
    )
    state = "" if badger_status == 0 else f" (exit status {badger_status})"
    print(
        f"  on the first {part_size:.0f} MB: lockdiag log {part_seconds:.2f}s, pgbadger "
        f"{badger_seconds:.2f}s ({part_size / badger_seconds:.1f} MB/s, peak RSS "
        f"{badger_rss / 1024:.0f} MB){state}: lockdiag is {badger_seconds / part_seconds:.0f}x "
        "faster"
    )
    part.unlink()


if __name__ == "__main__":
    main()
