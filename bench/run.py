"""lockdiag's benchmark: its own cluster, real lock populations, side-by-side comparisons.

    python bench/run.py                 # 1k, 10k, 100k locks; 16 and 160 waiters; 5 repeats
    python bench/run.py --quick         # 1k locks, 16 waiters, 2 repeats (CI runs this)
    python bench/run.py --json out.json
    python bench/run.py --observer-only --observer-cost   # what watching costs, pgbench too

Prints a table of medians and ratios and writes it as JSON. Each target of issue 8 is a
ratio measured in one run, so machine speed cancels out.
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import psycopg

from lockdiag.core import ahead
from lockdiag.demo.cluster import Cluster, create_cluster
from lockdiag.pg import queries

FLOOR = Path(__file__).with_name("floor.py")
# the console script, as people run it (python -m adds runpy's few milliseconds)
_SCRIPT = shutil.which("lockdiag", path=str(Path(sys.executable).parent))
LOCKDIAG = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "lockdiag"]
PSQL_JOIN = """SELECT l.locktype, l.database, l.classid, l.objid, l.objsubid, l.mode, l.granted,
 l.pid, a.application_name, a.usename, a.client_addr, a.client_port, a.state, a.xact_start,
 a.state_change, l.waitstart
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"""
# the "lock monitoring" self-join copied from the PostgreSQL wiki into many tools
WIKI_SELF_JOIN = """SELECT blocked_locks.pid AS blocked_pid, blocking_locks.pid AS blocking_pid
FROM pg_catalog.pg_locks blocked_locks
JOIN pg_catalog.pg_locks blocking_locks
  ON blocking_locks.locktype = blocked_locks.locktype
 AND blocking_locks.database IS NOT DISTINCT FROM blocked_locks.database
 AND blocking_locks.relation IS NOT DISTINCT FROM blocked_locks.relation
 AND blocking_locks.page IS NOT DISTINCT FROM blocked_locks.page
 AND blocking_locks.tuple IS NOT DISTINCT FROM blocked_locks.tuple
 AND blocking_locks.virtualxid IS NOT DISTINCT FROM blocked_locks.virtualxid
 AND blocking_locks.transactionid IS NOT DISTINCT FROM blocked_locks.transactionid
 AND blocking_locks.classid IS NOT DISTINCT FROM blocked_locks.classid
 AND blocking_locks.objid IS NOT DISTINCT FROM blocked_locks.objid
 AND blocking_locks.objsubid IS NOT DISTINCT FROM blocked_locks.objsubid
 AND blocking_locks.pid != blocked_locks.pid
WHERE NOT blocked_locks.granted"""


class Population:
    """Advisory locks in both forms, table locks, and sessions waiting on some of them."""

    def __init__(self, cluster: Cluster, locks: int, waiters: int) -> None:
        self.cluster, self.locks, self.waiters = cluster, locks, waiters
        self.connections: list[psycopg.Connection[Any]] = []
        self.threads: list[threading.Thread] = []

    def connect(self, name: str, autocommit: bool = True) -> psycopg.Connection[Any]:
        connection = psycopg.connect(self.cluster.dsn(application_name=name), autocommit=autocommit)
        self.connections.append(connection)
        return connection

    def __enter__(self) -> Population:
        half = self.locks // 2
        holder = self.connect("bench-holder")
        holder.execute("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, %s) g", (half,))
        holder.execute(
            "SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, %s) g",
            (self.locks - half,),
        )
        tables = self.connect("bench-tables", autocommit=False)
        tables.execute("LOCK TABLE bench_1, bench_2, bench_3, bench_4 IN SHARE MODE")
        rows = self.connect("bench-rows", autocommit=False)
        rows.execute("SELECT * FROM bench_1 WHERE id = 1 FOR UPDATE")
        row_waiter = self.connect("bench-row-waiter")
        self._wait(row_waiter, "UPDATE bench_1 SET id = id WHERE id = 1")
        for number in range(self.waiters - 1):
            waiter = self.connect(f"bench-waiter-{number}")
            self._wait(waiter, f"SELECT pg_advisory_lock({number + 1})")
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as watcher:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
                if row and row[0] >= self.waiters:
                    return self
                time.sleep(0.05)
        raise SystemExit("bench: the waiters did not start waiting")

    def _wait(self, connection: psycopg.Connection[Any], sql: str) -> None:
        def run() -> None:
            with contextlib.suppress(psycopg.Error):  # ended at teardown
                connection.execute(sql.encode())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def __exit__(self, *_: object) -> None:
        pids = [c.info.backend_pid for c in self.connections]
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) p", (pids,))
        for thread in self.threads:
            thread.join(10)
        for connection in self.connections:
            connection.close()


def rounds(repeats: int, least: int) -> int:
    """Rounds for a cheap figure that noise moves a lot (a query of 60 ms, a run of 250 ms): at
    least ``least`` of them, except in a quick run (fewer than 3 repeats)."""
    return repeats if repeats < 3 else max(repeats, least)


def medians(repeats: int, measures: dict[str, Callable[[], float]]) -> dict[str, float]:
    """The median of each measure, taken in turns (one of each per round), so that a change in
    the machine's speed during the run weighs on every figure of a ratio alike."""
    taken: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            taken[name].append(measure())
    return {name: statistics.median(values) for name, values in taken.items()}


def server_ms(cluster: Cluster, sql: str, params: dict[str, Any] | None = None) -> float:
    """Execution time reported by EXPLAIN ANALYZE with TIMING OFF (no per-node clock reads)."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as connection:
        plan = connection.execute(
            ("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql).encode(), params
        ).fetchone()
    assert plan is not None
    return float(plan[0][0]["Execution Time"])


def wall(command: list[str], env: dict[str, str] | None = None) -> float:
    """Whole-process time; exit codes 1 and 2 are answers here (check's WARNING, CRITICAL)."""
    started = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, check=False, env=env)
    if result.returncode not in (0, 1, 2):
        raise SystemExit(f"bench: {command[:4]} failed with exit code {result.returncode}")
    return time.perf_counter() - started


def peak_rss_mb(command: list[str]) -> float:
    """Peak resident memory of a child process (ru_maxrss of a fresh measuring process)."""
    probe = (
        "import resource, subprocess, sys;"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *command], capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip()) / 1024


def _terminal_env() -> dict[str, str]:
    """The environment for a pseudo-terminal child: without COLUMNS and LINES (pytest sets
    them), which rich would take over the terminal's real size."""
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def first_screen(command: list[str]) -> float:
    """Whole run on a pseudo-terminal of 50 rows: lockdiag's table view is bounded."""
    import pexpect

    started = time.perf_counter()
    child = pexpect.spawn(
        command[0], command[1:], dimensions=(50, 200), timeout=120, env=_terminal_env()
    )
    child.expect(pexpect.EOF)
    child.close()
    return time.perf_counter() - started


def watch_times(command: list[str]) -> tuple[float, float]:
    """`watch` on a pseudo-terminal of 50 rows: seconds to the first frame, and from a key
    press (p, pause) to the redrawn frame."""
    import pexpect

    started = time.perf_counter()
    child = pexpect.spawn(command[0], [*command[1:], "watch", "--interval", "60s"],
                          dimensions=(50, 200), timeout=120, env=_terminal_env())  # fmt: skip
    child.expect("refresh #1")
    first = time.perf_counter() - started
    child.expect("q quit")  # the footer: the frame is drawn whole
    pressed = time.perf_counter()
    child.send("p")
    child.expect("paused")
    redraw = time.perf_counter() - pressed
    child.send("q")
    child.expect(pexpect.EOF)
    return first, redraw


@contextmanager
def bench_cluster() -> Iterator[Cluster]:
    cluster = create_cluster(
        settings={"max_locks_per_transaction": "2048", "max_connections": "220"}
    )
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as setup:
            for number in range(1, 5):
                setup.execute(f"CREATE TABLE bench_{number} (id int PRIMARY KEY)")
                setup.execute(f"INSERT INTO bench_{number} SELECT generate_series(1, 100)")
        yield cluster
    finally:
        cluster.destroy()


def compile_bytecode() -> None:
    """Write lockdiag's .pyc files, as ``pip install`` does. An editable install under
    PYTHONDONTWRITEBYTECODE would otherwise compile every module on every run (about 20 ms),
    which the psycopg it is compared with, installed normally, never pays."""
    import compileall

    import lockdiag

    compileall.compile_dir(Path(lockdiag.__file__).parent, quiet=1)


def server_version_num(cluster: Cluster) -> int:
    with psycopg.connect(cluster.dsn(), autocommit=True) as connection:
        return connection.info.server_version


def measure_server(
    cluster: Cluster, size: int, waiters: int, repeats: int, snapshot_sql: str
) -> dict[str, Any]:
    """Target 1: the snapshot query against a bare read of pg_locks (and the wiki's join)."""
    with Population(cluster, size, waiters):
        ms = medians(rounds(repeats, 15), {
            "pg_locks_ms": lambda: server_ms(cluster, "SELECT * FROM pg_locks"),
            "snapshot_ms": lambda: server_ms(cluster, snapshot_sql,
                                             {"all_types": True, "names": [],
                                              **ahead.probe_params()}),
            "wiki_self_join_ms": lambda: server_ms(cluster, WIKI_SELF_JOIN),
        })  # fmt: skip
    return {
        "locks": size, "waiters": waiters, **ms, "ratio": ms["snapshot_ms"] / ms["pg_locks_ms"],
        "wiki_ratio": ms["wiki_self_join_ms"] / ms["pg_locks_ms"],
    }  # fmt: skip


def measure_large_list(
    cluster: Cluster, env: dict[str, str], size: int, waiters: int, repeats: int
) -> dict[str, Any]:
    """Targets 2, 3 and 5: list at scale against psql and the Python floor; the terminal's
    first screen; watch; JSON's peak memory."""
    psql = shutil.which("psql") or "psql"
    with_dsn = ["/usr/bin/env", f"LOCKDIAG_DSN={cluster.dsn()}", *LOCKDIAG]
    with Population(cluster, size, waiters):
        with running_exporter(cluster) as scrape:
            figures = medians(repeats, {
                "list_plain_s": lambda: wall([*LOCKDIAG, "list", "--format", "plain"], env),
                "list_json_s": lambda: wall([*LOCKDIAG, "list", "--format", "json"], env),
                "psql_aligned_s": lambda: wall([psql, "-X", "-c", PSQL_JOIN], env),
                "python_floor_s": lambda: wall([sys.executable, str(FLOOR), cluster.dsn(),
                                                PSQL_JOIN]),
                "exporter_scrape_s": scrape,
                "list_terminal_s": lambda: first_screen([*with_dsn, "list"]),
            })  # fmt: skip
        # the rest without the exporter connected: with it, list's peak memory reads about
        # 35 MB more (its Python allocations are the same, by tracemalloc)
        watch = [watch_times(with_dsn) for _ in range(repeats)]
        memory = statistics.median(
            peak_rss_mb([*with_dsn, "list", "--format", "json"]) for _ in range(repeats)
        )
        figures.update(phases(cluster, repeats))
    return {"locks": size, **figures,
            "watch_first_frame_s": statistics.median(first for first, _ in watch),
            "watch_key_redraw_s": statistics.median(redraw for _, redraw in watch),
            "list_json_peak_mb": memory}  # fmt: skip


def phases(cluster: Cluster, repeats: int) -> dict[str, float]:
    """Where the time of `list` and of a scrape goes, measured inside this process (without the
    cycle collector, as the command runs): the snapshot (query, fetch, lock records), the
    analysis, the plain table's rows, aligning them, the JSON items, check's findings and the
    metrics of a scrape. Each phase's median, in seconds."""
    import gc

    from lockdiag.core.diagnosis import Diagnosis
    from lockdiag.core.findings import CheckPolicy
    from lockdiag.pg.session import DiagnosticSession
    from lockdiag.registry import Registry
    from lockdiag.render import plain, render
    from lockdiag.views.check import check_metrics
    from lockdiag.views.listing import list_output
    from lockdiag.views.metrics import exposition

    registry, policy = Registry(), CheckPolicy()
    taken: dict[str, list[float]] = {}

    def timed(name: str, work: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = work()
        taken.setdefault(f"phase_{name}_s", []).append(time.perf_counter() - started)
        return result

    def one_round(session: DiagnosticSession, sink: TextIO) -> None:
        snapshot = timed("snapshot", lambda: session.snapshot("advisory"))
        diagnosis = timed("analysis", lambda: Diagnosis(snapshot, registry))
        blocks = timed("rows", list_output(diagnosis.listing()).blocks)
        timed("aligning", lambda: sink.write(plain(blocks)))
        timed("json", lambda: render(list_output(diagnosis.listing()), "json", sink))
        checked = Diagnosis(snapshot, registry, policy.analysis_policy())
        incident = timed("findings", lambda: checked.incident(policy))
        timed("metrics", lambda: exposition(check_metrics(incident)))

    gc.disable()
    try:
        with (
            DiagnosticSession(cluster.dsn(), 60.0, registry) as session,
            Path(os.devnull).open("w") as sink,
        ):
            for _ in range(repeats):
                one_round(session, sink)
                gc.collect()  # the last round's objects, outside the timings
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in taken.items()}


@contextmanager
def exporter_process(cluster: Cluster, *options: str) -> Iterator[tuple[int, str]]:
    """A running `lockdiag exporter` on the cluster with these options; yields its pid and its
    address (host:port) once /-/healthy answers (which takes no snapshot)."""
    import urllib.request

    from lockdiag.demo.cluster import free_port

    port = free_port()
    process = subprocess.Popen(
        [*LOCKDIAG, "exporter", "--dsn", cluster.dsn(), "--listen", f"127.0.0.1:{port}",
         *options],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise SystemExit(f"bench: the exporter exited with code {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://{address}/-/healthy", timeout=10) as response:
                    response.read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("bench: the exporter did not answer /-/healthy") from None
                time.sleep(0.1)
        yield process.pid, address
    finally:
        process.terminate()
        process.wait(10)


def scraper(address: str) -> Callable[[], float]:
    """The time of one GET /metrics (one snapshot, its analysis and the exposition)."""
    import urllib.request

    def once() -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=120) as response:
            response.read()
        return time.perf_counter() - started

    return once


@contextmanager
def running_exporter(cluster: Cluster) -> Iterator[Callable[[], float]]:
    """A running `lockdiag exporter`, its sampler set to an hour so it does not compete; yields
    the time of one GET /metrics (one snapshot, its analysis and the exposition)."""
    with exporter_process(cluster, "--interval", "1h", "--timeout", "60s") as (_, address):
        once = scraper(address)
        once()  # warm: the exporter's first snapshot is done
        time.sleep(2)
        yield once


def measure_small_server(
    cluster: Cluster, env: dict[str, str], repeats: int, snapshot_sql: str
) -> dict[str, Any]:
    """Target 4: list on a small server against the least psycopg script running the same
    query; and a fleet of twenty targets against one."""
    minimal = (
        "import psycopg,sys;c=psycopg.connect(sys.argv[1]);"
        "c.execute(open(sys.argv[2]).read().replace('%(all_types)s','false')"
        ".replace('%(names)s',\"'{}'\")).fetchall()"
    )
    with (
        Population(cluster, 100, 2),
        tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as sql_file,
    ):
        try:
            sql_file.write(snapshot_sql)
            sql_file.close()
            many = [arg for _ in range(20) for arg in ("--dsn", cluster.dsn())]
            check = [*LOCKDIAG, "check", "--format", "json"]
            return medians(rounds(repeats, 9), {
                "list_small_s": lambda: wall([*LOCKDIAG, "list", "--format", "plain"], env),
                "minimal_psycopg_s": lambda: wall(
                    [sys.executable, "-c", minimal, cluster.dsn(), sql_file.name]),
                "fleet_1_target_s": lambda: wall([*check, "--dsn", cluster.dsn()], env),
                "fleet_20_targets_s": lambda: wall([*check, *many], env),
            })  # fmt: skip
        finally:
            Path(sql_file.name).unlink(missing_ok=True)


def measure_startup(repeats: int) -> dict[str, Any]:
    """Target 4: --help and --version against importing click alone."""
    return medians(max(repeats, 5), {
        "help_s": lambda: wall([*LOCKDIAG, "--help"]),
        "version_s": lambda: wall([*LOCKDIAG, "--version"]),
        "import_click_s": lambda: wall([sys.executable, "-c", "import click"]),
    })  # fmt: skip


# -- full dumps: every lock, streamed ----------------------------------------------------------

PSQL_AT = ["-X", "-Atq", "-c", PSQL_JOIN]  # the floor a user reaches for: unaligned, no headers
DUMP_FORMATS = ("plain", "json")
# each dump: the list's formats, and the snapshot file written to standard output
DUMPS = {
    **{fmt: ["list", "--format", fmt] for fmt in DUMP_FORMATS},
    "snapshot": ["snapshot", "-o", "-"],
}
# issue 47: each dump at most this many times psql -At at 100k and 300k locks, and at most
# DUMP_PEAK_MB at the peak at 300k
DUMP_RATIO = {"plain": 2.0, "json": 1.5, "snapshot": 1.5}
DUMP_PEAK_MB = 150.0


def measure_dumps(
    cluster: Cluster, env: dict[str, str], sizes: list[int], repeats: int
) -> list[dict[str, Any]]:
    """Issue 36: a dump of every lock (`list --format plain` and `json`, piped) against `psql
    -X -Atq` printing the join, alternated in turns, and each dump's peak memory (ru_maxrss of
    the child), at each size."""
    psql = shutil.which("psql") or "psql"
    with_dsn = ["/usr/bin/env", f"LOCKDIAG_DSN={cluster.dsn()}", *LOCKDIAG]
    found = []
    for size in sizes:
        with Population(cluster, size, 16):
            runs: dict[str, Callable[[], float]] = {
                "psql_at_s": lambda: wall([psql, *PSQL_AT], env)
            }
            for name, args in DUMPS.items():
                runs[_dump(name, "s")] = partial(wall, [*LOCKDIAG, *args], env)
            times = medians(repeats, runs)
            peaks = {
                _dump(name, "peak_mb"): statistics.median(
                    peak_rss_mb([*with_dsn, *args]) for _ in range(repeats)
                )
                for name, args in DUMPS.items()
            }
            psql_env = ["/usr/bin/env", *(f"{k}={env[k]}" for k in ("PGHOST", "PGPORT", "PGUSER",
                                                                     "PGDATABASE"))]  # fmt: skip
            psql_peak = statistics.median(
                peak_rss_mb([*psql_env, psql, *PSQL_AT]) for _ in range(repeats)
            )
        found.append({"locks": size, **times, **peaks, "psql_at_peak_mb": psql_peak})
    return found


def _dump(name: str, measure: str) -> str:
    """A dump's figure's name: list_plain_s, list_json_peak_mb, snapshot_s..."""
    return f"{name}_{measure}" if name == "snapshot" else f"list_{name}_{measure}"


def dumps_report(dumps: list[dict[str, Any]]) -> list[str]:
    lines = ["full dumps (medians; ratio to psql -X -Atq of the join; peak RSS of the child)",
             f"{'locks':>7} {'psql -At s':>10} " + " ".join(
                 f"{name[:4] + ' s':>8} {'ratio':>6} {name[:4] + ' MB':>9}" for name in DUMPS)
             + f" {'psql MB':>8}"]  # fmt: skip
    for d in dumps:
        cells = " ".join(
            f"{d[_dump(name, 's')]:>8.3f} {d[_dump(name, 's')] / d['psql_at_s']:>6.2f} "
            f"{d[_dump(name, 'peak_mb')]:>9.1f}"
            for name in DUMPS
        )
        lines.append(
            f"{d['locks']:>7} {d['psql_at_s']:>10.3f} {cells} {d['psql_at_peak_mb']:>8.1f}"
        )
    lines.append(
        "  targets: ratio <= "
        + ", ".join(f"{name} {DUMP_RATIO[name]:g}" for name in DUMPS if name in DUMP_RATIO)
        + f"; peak <= {DUMP_PEAK_MB:g} MB at 300k"
    )
    lines += [f"  {'met' if met else 'MISSED'}: {what}" for what, met in dump_targets(dumps)]
    return lines


def dump_targets(dumps: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """Issue 47's targets for the dumps, each with its figure, and whether it is met."""
    found = []
    for d in dumps:
        for name in DUMPS:
            if name not in DUMP_RATIO:
                continue
            ratio = d[_dump(name, "s")] / d["psql_at_s"]
            found.append(
                (f"{name} at {d['locks']}: {ratio:.2f}x <= {DUMP_RATIO[name]:g}x",
                 ratio <= DUMP_RATIO[name])
            )  # fmt: skip
            if d["locks"] >= 300_000:
                peak = d[_dump(name, "peak_mb")]
                found.append(
                    (f"{name} at {d['locks']}: {peak:.0f} MB <= {DUMP_PEAK_MB:g} MB",
                     peak <= DUMP_PEAK_MB)
                )  # fmt: skip
    return found


def run_dumps(sizes: list[int], repeats: int) -> dict[str, Any]:
    """Only the full dumps (``--dumps``), on a cluster of their own."""
    compile_bytecode()
    with bench_cluster() as cluster:
        env = {**os.environ, "LOCKDIAG_DSN": cluster.dsn(), "PGHOST": "127.0.0.1"}
        env.update({"PGPORT": str(cluster.port), "PGUSER": "postgres", "PGDATABASE": "postgres"})
        return {"dumps": measure_dumps(cluster, env, sizes, repeats)}


# -- the answers that need few rows: check, blockers, who-holds --key, a scrape --------------

ANSWER_RATIO = 1.0  # issue 36: at most psql -At of the join
ANSWERS = ("check", "blockers", "who_holds_key", "exporter_scrape")


def measure_answers(
    cluster: Cluster, env: dict[str, str], sizes: list[int], repeats: int
) -> list[dict[str, Any]]:
    """Issue 36: check, blockers, who-holds --key (a key of the bulk nobody waits for) and one
    exporter scrape against `psql -X -Atq` printing the join, alternated in turns, at each
    size; the load average before each size."""
    psql = shutil.which("psql") or "psql"
    found = []
    for size in sizes:
        with Population(cluster, size, 16), running_exporter(cluster) as scrape:
            load = os.getloadavg()[0]
            times = medians(repeats, {
                "psql_at_s": lambda: wall([psql, *PSQL_AT], env),
                "check_s": lambda: wall([*LOCKDIAG, "check", "--format", "json"], env),
                "blockers_s": lambda: wall([*LOCKDIAG, "blockers", "--format", "json"], env),
                "who_holds_key_s": lambda: wall([*LOCKDIAG, "who-holds", "--key", "7,500"], env),
                "exporter_scrape_s": scrape,
            })  # fmt: skip
        found.append({"locks": size, "load_average_1m": load, **times})
    return found


def answers_report(answers: list[dict[str, Any]]) -> list[str]:
    lines = ["answers that need few rows (medians; ratio to psql -X -Atq of the join)",
             f"{'locks':>7} {'load':>5} {'psql -At s':>10} "
             + " ".join(f"{name:>15} {'ratio':>6}" for name in ANSWERS)]  # fmt: skip
    for a in answers:
        cells = " ".join(
            f"{a[f'{name}_s']:>15.3f} {a[f'{name}_s'] / a['psql_at_s']:>6.2f}" for name in ANSWERS
        )
        lines.append(
            f"{a['locks']:>7} {a['load_average_1m']:>5.2f} {a['psql_at_s']:>10.3f} {cells}"
        )
    lines.append(f"  target: ratio <= {ANSWER_RATIO:g}")
    return lines


def run_answers(sizes: list[int], repeats: int) -> dict[str, Any]:
    """Only the answers (``--answers``), on a cluster of their own."""
    compile_bytecode()
    with bench_cluster() as cluster:
        env = {**os.environ, "LOCKDIAG_DSN": cluster.dsn(), "PGHOST": "127.0.0.1"}
        env.update({"PGPORT": str(cluster.port), "PGUSER": "postgres", "PGDATABASE": "postgres"})
        return {"answers": measure_answers(cluster, env, sizes, repeats)}


# -- what watching costs the watched server ------------------------------------------------

OBSERVER_WAITERS = 37  # Population's 3 other sessions make 40
SAMPLE_INTERVAL_S, SAMPLE_DURATION_S = 0.25, 8.0  # `lockdiag sample`'s run at each size
PGBENCH_CLASS = 424242  # the workload's keys: pg_advisory_xact_lock(424242, k), none held
PGBENCH_SCRIPT = f"""\\set k random(1, 10000)
SELECT pg_advisory_xact_lock({PGBENCH_CLASS}, :k);
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, all its threads, from /proc/PID/stat; None once it is gone.
    (Root reads the postgres user's backends too.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15


def lockdiag_backends(cluster: Cluster) -> dict[int, float]:
    """The CPU seconds so far of each of lockdiag's own backends, told by the application_name
    lockdiag sets on every session."""
    from lockdiag.pg.connection import APPLICATION_NAME

    with psycopg.connect(cluster.dsn(application_name="bench-observer"), autocommit=True) as c:
        rows = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION_NAME,)
        ).fetchall()
    return {pid: cpu for (pid,) in rows if (cpu := cpu_seconds(pid)) is not None}


def sampler_series(text: str) -> dict[str, float]:
    """Every series of an exposition whose name contains "sampler" (histogram buckets left out),
    keyed by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "sampler" in sample.name and not sample.name.endswith(("_bucket", "_created")):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                found[f"{sample.name}{{{labels}}}"] = float(sample.value)
    return found


def pick(series: dict[str, float], *words: str) -> float | None:
    """The first series whose name holds every word, one that says "achieved" preferred."""
    named = [(key, value) for key, value in series.items()
             if all(word in key.split("{")[0] for word in words)]  # fmt: skip
    named.sort(key=lambda item: "achieved" not in item[0])
    return named[0][1] if named else None


def sampler_figures(series: dict[str, float], alive_s: float) -> dict[str, Any]:
    """The sampler's achieved interval and duty cycle: as the exporter exposes them, else
    derived from lockdiag_sampler_seconds (count and sum over the exporter's life), else None."""
    count = sum(v for k, v in series.items() if k.startswith("lockdiag_sampler_seconds_count"))
    busy = sum(v for k, v in series.items() if k.startswith("lockdiag_sampler_seconds_sum"))
    derived = "derived from lockdiag_sampler_seconds"
    figures: dict[str, Any] = {"sampler_samples": count or None}
    fallbacks = {"interval": alive_s / count if count else None,
                 "duty_cycle": busy / alive_s if count else None}  # fmt: skip
    for name, word in (("interval", "interval"), ("duty_cycle", "duty")):
        fallback = fallbacks[name]
        exposed = pick(series, "sampler", word)
        figures[f"sampler_{name}"] = exposed if exposed is not None else fallback
        figures[f"sampler_{name}_source"] = (
            "exposed" if exposed is not None else derived if fallback is not None else "n/a"
        )
    figures["sampler_interval_s"] = figures.pop("sampler_interval")
    return figures


def idle_exporter(cluster: Cluster, window: float, repeats: int, env: dict[str, str]) -> Any:
    """The exporter with its defaults, nothing scraping it, for ``window`` seconds: its own CPU
    and that of its backends per second of wall time; then one scrape for its sampler's series;
    then scrapes beside psql printing the same join, with the sampler running."""
    with exporter_process(cluster) as (pid, address):
        healthy = time.monotonic()
        deadline = healthy + 30
        while not lockdiag_backends(cluster) and time.monotonic() < deadline:
            time.sleep(0.1)  # the sampler's session is open
        time.sleep(2)  # and it has sampled a few times
        backends_before, cpu_before = lockdiag_backends(cluster), cpu_seconds(pid)
        started = time.monotonic()
        time.sleep(window)
        cpu_after, elapsed = cpu_seconds(pid), time.monotonic() - started
        backends_after = lockdiag_backends(cluster)
        if cpu_before is None or cpu_after is None:
            raise SystemExit("bench: the exporter died during the window")
        # a backend there at the end only counts whole; one gone by then is missed (counted)
        backends_s = sum(cpu - backends_before.get(p, 0.0) for p, cpu in backends_after.items())
        scrape = scraper(address)
        with metrics_text(address) as text:
            series, alive = sampler_series(text), time.monotonic() - healthy
        psql = shutil.which("psql") or "psql"
        timed = medians(rounds(repeats, 5), {
            "scrape_s": scrape,
            "psql_aligned_s": lambda: wall([psql, "-X", "-c", PSQL_JOIN], env),
        })  # fmt: skip
    return {
        "window_s": elapsed,
        "exporter_cpu_pct": 100 * (cpu_after - cpu_before) / elapsed,
        "backends_cpu_pct": 100 * backends_s / elapsed,
        "backends": sorted(set(backends_before) | set(backends_after)),
        "backends_gone": len(set(backends_before) - set(backends_after)),
        **sampler_figures(series, alive),
        "sampler_series": series,
        **timed,
        "scrape_vs_psql": timed["scrape_s"] / timed["psql_aligned_s"],
    }


@contextmanager
def metrics_text(address: str) -> Iterator[str]:
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=120) as response:
        yield response.read().decode()


def sample_rate(env: dict[str, str], duration: float) -> dict[str, Any]:
    """`lockdiag sample --interval 250ms --format json` for ``duration``: samples taken against
    those expected, the achieved interval, and the command's own CPU (by wait4)."""
    command = [*LOCKDIAG, "sample", "--interval", f"{int(SAMPLE_INTERVAL_S * 1000)}ms",
               "--duration", f"{duration:g}s", "--format", "json"]  # fmt: skip
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        took = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise SystemExit(f"bench: sample failed with exit code {process.returncode}")
        out.seek(0)
        data = json.loads(out.read())
    samples, expected = int(data["samples"]), max(1, int(duration / SAMPLE_INTERVAL_S))
    achieved = data.get("achieved_interval_seconds")
    return {
        "sample_samples": samples, "sample_expected": expected,
        "sample_rate": samples / expected,
        "sample_achieved_interval_s": float(achieved) if achieved is not None
        else duration / max(1, samples),
        "sample_interval_source": "reported" if achieved is not None else "duration / samples",
        "sample_median_query_s": data.get("cost", {}).get("median_seconds"),
        "sample_wall_s": took,
        "sample_cpu_pct": 100 * (usage.ru_utime + usage.ru_stime) / took,
    }  # fmt: skip


def pgbench_tps(cluster: Cluster, script: Path, seconds: float) -> float:
    """Transactions per second of the advisory-lock workload: 8 clients, 2 threads."""
    pgbench = cluster.bindir / "pgbench"
    result = subprocess.run(
        [str(pgbench if pgbench.exists() else "pgbench"), "-n", "-f", str(script), "-c", "8",
         "-j", "2", "-T", str(max(1, round(seconds))), "-h", "127.0.0.1", "-p", str(cluster.port),
         "-U", "postgres", "postgres"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for line in result.stdout.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise SystemExit(f"bench: no tps in pgbench's output: {result.stdout[-300:]}")


def observer_cost(cluster: Cluster, seconds: float, repeats: int) -> dict[str, Any]:
    """pgbench's tps with and without the exporter (defaults) running, in turns (ABBA, so a
    drift of the machine's speed weighs on both): the median loss, and the noise (the spread of
    the losses, and of the tps without the exporter)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(PGBENCH_SCRIPT)
    script = Path(handle.name)
    without: list[float] = []
    with_exporter: list[float] = []
    try:
        pgbench_tps(cluster, script, 1)  # warm
        for turn in range(repeats):
            for watched in (False, True) if turn % 2 == 0 else (True, False):
                if not watched:
                    without.append(pgbench_tps(cluster, script, seconds))
                    continue
                with exporter_process(cluster):
                    time.sleep(2)  # its sampler has started
                    with_exporter.append(pgbench_tps(cluster, script, seconds))
    finally:
        script.unlink(missing_ok=True)
    losses = [100 * (1 - w / b) for w, b in zip(with_exporter, without, strict=True)]
    base = statistics.median(without)
    return {
        "tps_without": without, "tps_with": with_exporter,
        "tps_loss_pct": statistics.median(losses),
        "tps_loss_spread_pct": [min(losses), max(losses)],
        "tps_noise_pct": 100 * (max(without) - min(without)) / base,
    }  # fmt: skip


def measure_observer(
    cluster: Cluster, env: dict[str, str], sizes: list[int], options: argparse.Namespace
) -> dict[str, Any]:
    """What watching costs the watched server, at each size (40 sessions)."""
    import hashlib

    import lockdiag

    # the lockdiag the bench and its children import (PYTHONPATH can point at another tree)
    exporter_source = Path(lockdiag.__file__).parent / "exporter.py"
    context = {
        "exporter_py_sha256": hashlib.sha256(exporter_source.read_bytes()).hexdigest()[:12]
        if exporter_source.exists() else None,
        "lockdiag": str(exporter_source.parent), "cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "note": "CPU-time figures (% of one core) are robust on a busy machine; wall figures "
                "(scrape/psql, sample rate, tps) move with the machine's load",
    }  # fmt: skip
    rows = []
    for size in sizes:
        with Population(cluster, size, OBSERVER_WAITERS):
            row: dict[str, Any] = {"locks": size}
            row.update(idle_exporter(cluster, options.window, options.repeats, env))
            row.update(sample_rate(env, options.sample_duration))
            if options.observer_cost:
                row.update(observer_cost(cluster, options.observer_seconds,
                                         options.observer_rounds))  # fmt: skip
        rows.append(row)
    context["loadavg_end"] = list(os.getloadavg())
    return {"context": context, "rows": rows}


def observer_report(observer: dict[str, Any]) -> list[str]:
    def number(value: float | None, form: str) -> str:
        return "n/a" if value is None else format(value, form)

    rows = observer["rows"]
    window = statistics.median(r["window_s"] for r in rows) if rows else 0.0
    lines = [
        f"what watching costs the watched server (exporter defaults, nothing scraping it, "
        f"{window:.0f} s window; CPU in % of one core)",
        f"{'locks':>7} {'exporter':>9} {'backends':>9} {'sampler':>9} {'duty':>6} "
        f"{'sample':>8} {'rate':>5} {'interval':>9} {'scrape':>8} {'psql':>7} {'ratio':>6} "
        f"{'tps loss':>9} {'spread':>13} {'noise':>6}",
        f"{'':>7} {'%cpu':>9} {'%cpu':>9} {'interval':>9} {'cycle':>6} {'n/exp':>8} {'':>5} "
        f"{'sample':>9} {'s':>8} {'s':>7} {'':>6} {'%':>9} {'%':>13} {'%':>6}",
    ]
    for r in rows:
        spread = r.get("tps_loss_spread_pct")
        lines.append(
            f"{r['locks']:>7} {r['exporter_cpu_pct']:>9.2f} {r['backends_cpu_pct']:>9.2f} "
            f"{number(r['sampler_interval_s'], '.3f'):>9} "
            f"{number(r['sampler_duty_cycle'], '.3f'):>6} "
            f"{r['sample_samples']:>4}/{r['sample_expected']:<3} {r['sample_rate']:>5.2f} "
            f"{r['sample_achieved_interval_s']:>9.3f} {r['scrape_s']:>8.3f} "
            f"{r['psql_aligned_s']:>7.3f} {r['scrape_vs_psql']:>6.2f} "
            f"{number(r.get('tps_loss_pct'), '.1f'):>9} "
            f"{'n/a' if spread is None else f'{spread[0]:.1f}..{spread[1]:.1f}':>13} "
            f"{number(r.get('tps_noise_pct'), '.1f'):>6}"
        )

    def sources(key: str) -> str:
        return ", ".join(sorted({r[key] for r in rows}))

    context = observer["context"]
    lines += [
        f"  sampler interval: {sources('sampler_interval_source')}; duty cycle: "
        f"{sources('sampler_duty_cycle_source')}; sample's interval: "
        f"{sources('sample_interval_source')}",
        f"  {context['cpus']} CPUs, load average {context['loadavg_start'][0]:.1f} at the start, "
        f"{context['loadavg_end'][0]:.1f} at the end: {context['note']}",
    ]
    return lines


def run(
    sizes: list[int],
    waiter_counts: list[int],
    repeats: int,
    observer: argparse.Namespace | None = None,
) -> dict[str, Any]:
    """Every measurement; with ``observer`` (the observer options), what watching costs too,
    and with its ``observer_only`` nothing else."""
    results: dict[str, Any] = {"server": [], "client": {}, "targets": []}
    compile_bytecode()
    with bench_cluster() as cluster:
        snapshot_sql = queries.query("snapshot", server_version_num(cluster))
        env = {**os.environ, "LOCKDIAG_DSN": cluster.dsn(), "PGHOST": "127.0.0.1"}
        env.update({"PGPORT": str(cluster.port), "PGUSER": "postgres", "PGDATABASE": "postgres"})
        if observer is not None:
            results["observer"] = measure_observer(cluster, env, sizes, observer)
            if observer.observer_only:
                return results
        results["server"] = [
            measure_server(cluster, size, waiters, repeats, snapshot_sql)
            for size in sizes
            for waiters in waiter_counts
        ]
        client = results["client"]
        client.update(measure_large_list(cluster, env, max(sizes), waiter_counts[0], repeats))
        client.update(measure_small_server(cluster, env, repeats, snapshot_sql))
    results["client"].update(measure_startup(repeats))
    results["targets"] = targets(results)
    results["context"] = context(results)
    return results


def context(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Ratios that explain target 2: what the least Python client of psql's join pays."""
    client = results["client"]
    return [
        {"what": "Python floor / psql (fetch the join as text, print it aligned)",
         "value": client["python_floor_s"] / client["psql_aligned_s"]},
        {"what": "list --format plain / Python floor",
         "value": client["list_plain_s"] / client["python_floor_s"]},
    ]  # fmt: skip


Client = dict[str, Any]
# what each target measures, the figure from the client measurements, and its limit
TARGETS: list[tuple[str, Callable[[Client], float], float]] = [
    ("2. list --format plain / psql at {locks} locks",
     lambda c: c["list_plain_s"] / c["psql_aligned_s"], 1.2),
    ("2. list --format json / psql at {locks} locks",
     lambda c: c["list_json_s"] / c["psql_aligned_s"], 1.2),
    ("3. list on a terminal at {locks} locks (seconds)", lambda c: c["list_terminal_s"], 1.0),
    ("4. --help / import click", lambda c: c["help_s"] / c["import_click_s"], 1.5),
    ("4. --version / import click", lambda c: c["version_s"] / c["import_click_s"], 1.5),
    ("4. list (small server) / minimal psycopg script",
     lambda c: c["list_small_s"] / c["minimal_psycopg_s"], 1.3),
    ("5. list --format json peak memory at {locks} locks (MB)",
     lambda c: c["list_json_peak_mb"], 150.0),
    ("6. one exporter scrape / psql at {locks} locks",
     lambda c: c["exporter_scrape_s"] / c["psql_aligned_s"], 1.0),
    ("fleet: check on 20 targets / on 1 target",
     lambda c: c["fleet_20_targets_s"] / c["fleet_1_target_s"], 2.0),
]  # fmt: skip
SNAPSHOT_LIMIT = 1.5  # target 1: snapshot / pg_locks, set at 10k and 100k locks


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    client = results["client"]
    found = [  # smaller populations are for context
        {"target": f"1. snapshot/pg_locks at {r['locks']} locks, {r['waiters']} waiters",
         "value": r["ratio"], "limit": SNAPSHOT_LIMIT}
        for r in results["server"]
        if r["locks"] >= 10000
    ]  # fmt: skip
    found += [
        {"target": name.format(locks=client["locks"]), "value": figure(client), "limit": limit}
        for name, figure, limit in TARGETS
    ]
    for target in found:
        target["met"] = target["value"] <= target["limit"]
    return found


def report(results: dict[str, Any]) -> str:
    if "server" in results and not results["server"] and "observer" in results:
        return "\n".join(observer_report(results["observer"]))  # --observer-only
    lines = ["server side (EXPLAIN ANALYZE execution time, medians)",
             f"{'locks':>7} {'waiters':>7} {'pg_locks ms':>12} {'snapshot ms':>12} {'ratio':>6} "
             f"{'wiki join ms':>13} {'ratio':>7}"]  # fmt: skip
    for r in results["server"]:
        lines.append(
            f"{r['locks']:>7} {r['waiters']:>7} {r['pg_locks_ms']:>12.2f} "
            f"{r['snapshot_ms']:>12.2f} {r['ratio']:>6.2f} "
            f"{r['wiki_self_join_ms']:>13.2f} {r['wiki_ratio']:>7.1f}"
        )
    lines += ["", "client side (whole process, medians)"]
    lines += [f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}"
              for key, value in results["client"].items()]  # fmt: skip
    lines += ["", "targets"]
    for target in results["targets"]:
        verdict = "met" if target["met"] else "MISSED"
        lines.append(
            f"  {target['target']}: {target['value']:.2f} (limit {target['limit']:g}) {verdict}"
        )
    lines += ["", "context"]
    lines += [f"  {item['what']}: {item['value']:.2f}" for item in results["context"]]
    if "observer" in results:
        lines += ["", *observer_report(results["observer"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1k locks, 16 waiters, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1000, 10000, 100000],
        help="lock populations (the largest is used for the client figures)",
    )
    parser.add_argument("--waiters", type=int, nargs="+", default=[16, 160])
    parser.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    watching = parser.add_argument_group("what watching costs the watched server")
    watching.add_argument("--window", type=float, default=30.0, metavar="SECONDS",
                          help="the idle exporter's measured window (--quick: 3)")  # fmt: skip
    watching.add_argument("--sample-duration", type=float, default=SAMPLE_DURATION_S,
                          metavar="SECONDS", help="lockdiag sample's run (--quick: 2)")  # fmt: skip
    watching.add_argument("--observer-cost", action="store_true",
                          help="also pgbench's tps with and without the exporter")  # fmt: skip
    watching.add_argument("--observer-seconds", type=float, default=10.0, metavar="SECONDS",
                          help="each pgbench run")  # fmt: skip
    watching.add_argument("--observer-rounds", type=int, default=5,
                          help="pgbench runs with and without the exporter, in turns")  # fmt: skip
    watching.add_argument("--observer-only", action="store_true",
                          help="measure only what watching costs")  # fmt: skip
    watching.add_argument("--no-observer", action="store_true",
                          help="skip what watching costs")  # fmt: skip
    parser.add_argument(
        "--dumps", action="store_true", help="only the full dumps (list plain/json) vs psql -At"
    )
    parser.add_argument(
        "--answers",
        action="store_true",
        help="only check, blockers, who-holds --key and a scrape vs psql -At",
    )
    options = parser.parse_args()
    if options.answers:
        answers = run_answers(options.sizes, options.repeats)
        print("\n".join(answers_report(answers["answers"])))
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(answers, indent=2) + "\n")
        return
    if options.dumps:
        dumps = run_dumps(options.sizes, options.repeats)
        print("\n".join(dumps_report(dumps["dumps"])))
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(dumps, indent=2) + "\n")
        return
    observer = None if options.no_observer else options
    if options.quick:
        options.sizes, options.repeats = [1000], 2
        options.window = min(options.window, 3.0)
        options.sample_duration = min(options.sample_duration, 2.0)
        options.observer_seconds = min(options.observer_seconds, 2.0)
        options.observer_rounds = min(options.observer_rounds, 2)
        results = run([1000], [16], 2, observer)
    else:
        results = run(options.sizes, options.waiters, options.repeats, observer)
    print(report(results))
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {options.json}")


if __name__ == "__main__":
    main()
