"""`lockdiag log` in bounded memory: peak RSS flat in the log's size, and the bounded tally
gives the same totals as the full one on a log written by a real server under contention."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lockdiag.demo.cluster import create_cluster
from lockdiag.logs import LogReader, LogReport, Tally, report
from lockdiag.registry import Registry

PREFIX = "%m [%p] %q%u@%d/%a "
# each transaction waits for one of six pair keys, then one of three bigint keys, holding the
# first a few ms: the queues make waits past deadlock_timeout (10ms) by the thousand
CONTENTION = """\\set k random(1, 6)
\\set b random(1, 3)
BEGIN;
SELECT pg_advisory_xact_lock(4102, :k);
SELECT pg_sleep(0.002);
SELECT pg_advisory_xact_lock(30064771072 + :b);
COMMIT;
"""


def _dense_log(path: Path, megabytes: int) -> int:
    """A wait-dense stderr log in which every wait is on its own lock (a transaction id, as
    row contention logs it) and one in seven on an advisory key; returns the waits."""
    waits = 0
    with path.open("w") as out:
        written = 0
        number = 0
        while written < megabytes * 2**20:
            chunk = []
            for _ in range(1000):
                number += 1
                pid = 2000 + number % 97
                second = number // 200
                stamp = f"2026-05-01 {second // 3600 % 24:02d}:{second // 60 % 60:02d}:" \
                        f"{second % 60:02d}.{number % 1000:03d} UTC"  # fmt: skip
                head = f"{stamp} [{pid}] app@shop/worker-{pid % 5} "
                tag = (
                    f"advisory lock [5,4102,{number % 50},2]"
                    if number % 7 == 0
                    else f"transaction {number}"
                )
                chunk.append(
                    f"{head}LOG:  process {pid} still waiting for ShareLock on {tag} after "
                    f"10.{number % 1000:03d} ms\n{head}DETAIL:  Process holding the lock: "
                    f"{pid + 1}. Wait queue: {pid}.\n{head}CONTEXT:  while updating tuple "
                    f'(0,{number % 90}) in relation "items"\n{head}STATEMENT:  UPDATE items '
                    f"SET n = n + 1 WHERE id = {number % 90}\n{head}LOG:  process {pid} "
                    f"acquired ShareLock on {tag} after 12.{number % 1000:03d} ms\n"
                )
                waits += 1
            text = "".join(chunk)
            out.write(text)
            written += len(text)
    return waits


class _Run:
    """``lockdiag log FILE --format json`` in a child process, started at once: two of them,
    or one and the writing of the next log, run side by side (peak RSS is each child's own)."""

    def __init__(self, path: Path) -> None:
        self.out = path.with_suffix(".json")
        with self.out.open("wb") as sink:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "lockdiag", "log", str(path), "--format", "json"],
                stdout=sink,
                stderr=subprocess.PIPE,
            )

    def peak_rss(self) -> tuple[int, str]:
        """Its peak RSS in KiB, and its output."""
        _, status, usage = os.wait4(self.child.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return usage.ru_maxrss, self.out.read_text()


def test_peak_memory_is_flat_in_the_size_of_the_log(tmp_path: Path) -> None:
    """16 MB and 64 MB of waits, each on its own lock: the same peak within a few MB (every
    wait kept, as before, took 1.3 MB per MB of log); every wait counted."""
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    waits_small = _dense_log(small, 16)
    first = _Run(small)
    waits_large = _dense_log(large, 64)
    (rss_small, out_small), (rss_large, out_large) = first.peak_rss(), _Run(large).peak_rss()
    for waits, out in ((waits_small, out_small), (waits_large, out_large)):
        assert sum(key["waits"] for key in json.loads(out)["keys"]) == waits
    grown = (rss_large - rss_small) / 1024
    assert grown < 6, f"peak RSS {rss_small / 1024:.0f} MB at 16 MB, {rss_large / 1024:.0f} at 64"


def _never_ending(path: Path, waits: int) -> None:
    """Waits that never end (no "acquired"), each with its own pid, key and holder: the most
    per-wait state a log can make the reader keep (bench/log.py --distinct)."""
    with path.open("w") as out:
        for start in range(0, waits, 10_000):
            out.write(
                "".join(
                    f"2026-05-01 03:10:00.{n % 1000:03d} UTC [{100 + n}] app@shop/worker LOG:  "
                    f"process {100 + n} still waiting for ExclusiveLock on advisory lock "
                    f"[5,4102,{n},2] after 1000.5 ms\n2026-05-01 03:10:00.{n % 1000:03d} UTC "
                    f"[{100 + n}] app@shop/worker DETAIL:  Process holding the lock: "
                    f"{4_000_000 + n}. Wait queue: {100 + n}.\n"
                    for n in range(start, min(start + 10_000, waits))
                )
            )


def test_peak_memory_is_flat_with_waits_that_never_end(tmp_path: Path) -> None:
    """120,000 and 480,000 waits that never end, each its own pid and key: the same peak
    within a few MB (every open wait was kept: 2 million took 2.0 GB); every wait counted, the
    waits closed early (past OPEN_WAITS) said."""
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    _never_ending(small, 120_000)
    first = _Run(small)
    _never_ending(large, 480_000)
    (rss_small, out_small), (rss_large, out_large) = first.peak_rss(), _Run(large).peak_rss()
    for waits, out in ((120_000, out_small), (480_000, out_large)):
        data = json.loads(out)
        assert sum(key["waits"] for key in data["keys"]) == waits
        assert data["waits_closed_early"] > waits - 50_000
        assert any("closed while open" in note for note in data["notes"])
    grown = (rss_large - rss_small) / 1024
    assert grown < 8, f"peak RSS {rss_small / 1024:.0f} MB at 120k, {rss_large / 1024:.0f} at 480k"


@pytest.fixture(scope="module")
def contended_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stderr log written by a real server: pgbench sessions queueing on advisory keys."""
    settings = {
        "log_lock_waits": "on",
        "deadlock_timeout": "10ms",
        "logging_collector": "on",
        "log_destination": "stderr",
        "log_directory": "log",
        "log_filename": "postgresql.log",
        "log_line_prefix": PREFIX,
    }
    server = create_cluster(settings=settings)
    try:
        script = server.base / "contention.sql"
        script.write_text(CONTENTION)
        pgbench = shutil.which("pgbench") or str(server.bindir / "pgbench")
        subprocess.run(
            [pgbench, "-n", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres",
             "-c", "16", "-j", "2", "-T", "4", "-f", str(script), "postgres"],
            capture_output=True, check=True,
        )  # fmt: skip
        server.stop()  # the collector flushes the file
        saved = tmp_path_factory.mktemp("contended") / "postgresql.log"
        shutil.copy(server.data / "log" / "postgresql.log", saved)
        return saved
    finally:
        server.destroy()


def _read(path: Path, kept_keys: int = 1000, kept_episodes: int = 1000) -> LogReport:
    tally = Tally(gap=0.05, kept_keys=kept_keys, kept_episodes=kept_episodes)  # short episodes
    with path.open() as lines:
        tally.read(LogReader(lines, path.name))
    return report(tally, Registry())


def _per_type(done: LogReport) -> dict[str, tuple[int, float, float, Counter[str]]]:
    """Per lock type: waits, total and longest wait, outcomes."""
    out: dict[str, tuple[int, float, float, Counter[str]]] = {}
    for key in done.keys:
        waits, total, longest, outcomes = out.get(key.tally.tag.kind, (0, 0.0, 0.0, Counter()))
        out[key.tally.tag.kind] = (
            waits + key.tally.waits,
            total + key.tally.total_ms,
            max(longest, key.tally.longest_ms),
            outcomes + Counter(key.tally.outcomes),
        )
    return {kind: (w, round(t, 3), lo, o) for kind, (w, t, lo, o) in out.items()}


WAIT_LINE = re.compile(
    r"process (\d+) (still waiting for|acquired|avoided deadlock for|"
    r"detected deadlock while waiting for) \S+ on (.+?) after "
)


def _waits_in(text: str) -> int:
    """The waits a log holds, counted from its lines as grep would: each "still waiting", and
    each end logged with no "still waiting" before it (ProcSleep logs only "acquired" for a
    lock granted between its deadlock check and that message)."""
    waiting: dict[str, str] = {}
    waits = 0
    for match in WAIT_LINE.finditer(text):
        pid, verb, lock = match.groups()
        if verb == "still waiting for" or waiting.get(pid) != lock:
            waits += 1
            waiting[pid] = lock
        if verb in ("acquired", "detected deadlock while waiting for"):
            waiting.pop(pid, None)
    return waits


def test_bounded_totals_equal_the_full_computation(contended_log: Path) -> None:
    """Keys folded (2 kept) and episodes left out (5 kept): per lock type the same waits,
    total, longest and outcomes as the tally that keeps everything, equal to grep's counts;
    the episodes kept are the full tally's with the most wait."""
    text = contended_log.read_text()
    still_waiting, acquired = text.count("still waiting for"), text.count(" acquired ")
    full = _read(contended_log, kept_keys=10**6, kept_episodes=10**6)
    bounded = _read(contended_log, kept_keys=2, kept_episodes=5)
    assert still_waiting > 200, "the contention made too few waits to test anything"
    assert sum(k.tally.waits for k in full.keys) == _waits_in(text)
    assert sum(k.tally.outcomes.get("acquired", 0) for k in full.keys) == acquired
    assert _per_type(bounded) == _per_type(full)
    assert any(k.tally.folded for k in bounded.keys), "no key was folded"

    by_episodes = _read(contended_log, kept_episodes=5)
    whole = {k.label: k.tally for k in full.keys}
    episodes = [(e.total_ms, e.first, e.last, e.waits) for t in whole.values() for e in t.episodes]
    assert len(episodes) > 20, "too few episodes to leave any out"
    kept = [(e.total_ms, e.first, e.last, e.waits) for k in by_episodes.keys
            for e in k.tally.episodes]  # fmt: skip
    assert 5 <= len(kept) < len(episodes)
    assert set(kept) <= set(episodes)
    for key in by_episodes.keys:
        one = whole[key.label]
        assert len(key.tally.episodes) + key.tally.episodes_left_out == len(one.episodes)
        assert (key.tally.waits, key.tally.total_ms, key.tally.outcomes) == (
            one.waits, one.total_ms, one.outcomes,
        )  # fmt: skip
