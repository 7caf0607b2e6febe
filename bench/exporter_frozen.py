"""What frozen targets cost the exporter's scrapes: one deadline, once.

    python bench/exporter_frozen.py                  # 1 healthy + 3 frozen targets, 10 scrapes
    python bench/exporter_frozen.py --frozen 3 --scrapes 10 --timeout 5s

Starts its own cluster and a `lockdiag exporter` process with one healthy target (the cluster)
and N frozen ones: ports that accept TCP and never answer, as a stopped server or a
black-holed path does. Prints the time of the first GET /metrics and of each of the next ones,
and exits 1 unless the first reports every frozen target down and each next one answers with
the healthy target up in less than --timeout (waiting for a frozen target costs at least that).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack

from run import LOCKDIAG  # bench/run.py: this script's directory is on sys.path

from lockdiag.demo.cluster import create_cluster, free_port
from lockdiag.durations import parse_duration


def scrape(url: str) -> tuple[float, str]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - loopback
        body = response.read().decode()
    return time.perf_counter() - began, body


def up_values(body: str) -> dict[str, str]:
    """``lockdiag_up``'s value per target."""
    prefix = 'lockdiag_up{target="'
    return dict(
        line.removeprefix(prefix).split('"} ', 1)
        for line in body.splitlines()
        if line.startswith(prefix)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--frozen", type=int, default=3, help="frozen targets (default 3)")
    parser.add_argument("--scrapes", type=int, default=10, help="scrapes after the first")
    parser.add_argument("--timeout", default="5s", help="the exporter's --timeout (default 5s)")
    options = parser.parse_args()
    timeout = parse_duration(options.timeout)
    with ExitStack() as stack:
        cluster = create_cluster()
        stack.callback(cluster.destroy)
        silent = []
        for _ in range(options.frozen):  # the kernel completes the handshake; nobody answers
            listener = stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=64))
            silent.append(f"host=127.0.0.1 port={listener.getsockname()[1]} user=x dbname=x")
        port = free_port()
        dsns = [arg for dsn in [cluster.dsn(), *silent] for arg in ("--dsn", dsn)]
        process = subprocess.Popen(
            [*LOCKDIAG, "exporter", *dsns, "--listen", f"127.0.0.1:{port}",
             "--timeout", options.timeout, "--interval", "1h"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(process.wait, 10)
        stack.callback(process.terminate)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(f"{url}/-/healthy")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("bench: the exporter did not start") from None
                time.sleep(0.1)
        first, body = scrape(f"{url}/metrics")
        states = up_values(body)
        healthy = next(name for name in states if "/postgres" in name)
        print(f"1 healthy + {options.frozen} frozen targets, --timeout {options.timeout}")
        print(f"first scrape: {first:.3f}s  up: {sorted(states.values())}")
        failures = []
        if sorted(states.values()) != ["0.0"] * options.frozen + ["1.0"]:
            failures.append(f"the first scrape says {states}")
        nexts = []
        for number in range(2, options.scrapes + 2):
            took, body = scrape(f"{url}/metrics")
            nexts.append(took)
            states = up_values(body)
            print(f"scrape {number}: {took:.3f}s")
            if took >= timeout or states.get(healthy) != "1.0":
                failures.append(f"scrape {number}: {took:.3f}s, {states}")
            time.sleep(0.2)
        print(
            f"next {len(nexts)} scrapes: median {statistics.median(nexts):.3f}s, "
            f"max {max(nexts):.3f}s (the first: {first:.3f}s)"
        )
        if failures:
            print("bench: " + "; ".join(failures), file=sys.stderr)
            raise SystemExit(1)


if __name__ == "__main__":
    main()
