"""The exporter as the tests reach it: HTTP GETs on loopback, an exporter served in this process,
its ``lockdiag_up`` lines and scrape threads, and a real Prometheus scraping it."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lockdiag.core.findings import CheckPolicy
from lockdiag.demo.cluster import free_port
from lockdiag.evidence import Target
from lockdiag.exporter import Exporter
from lockdiag.exporter.server import WORKERS
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Registry


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """The status and the body (text) of a GET of ``url``; an HTTP error is a status too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def healthy(url: str) -> bool:
    """Whether the exporter at ``url`` answers its health check (not yet listening: False)."""
    try:
        return get(f"{url}/-/healthy")[0] == 200
    except OSError:
        return False


def make_exporter(named: dict[str, str], timeout: float = 2.0) -> Exporter:
    """An exporter of these DSNs by name, whose every scrape reads its targets (no minimum
    interval between reads): for the tests of what a scrape does when a target changes between
    two of them."""
    limit = Timeout(timeout)
    targets = [Target.of(dsn, limit, Registry(), name=name) for name, dsn in named.items()]
    return Exporter(targets, CheckPolicy(), 1.0, min_read_interval=0.0)


@contextmanager
def serving(exporter: Exporter, workers: int = WORKERS, queued: int = 256) -> Iterator[str]:
    """The exporter served in this process (its threads countable), its URL."""
    port = free_port()
    server = exporter.serve("127.0.0.1", port, workers, queued)
    accept = threading.Thread(target=server.serve_forever, daemon=True, name="http accept")
    accept.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        accept.join(5)
        exporter.close()


def up(body: str, name: str) -> str | None:
    """The value of ``lockdiag_up`` for target ``name`` in an exposition ``body``, if any."""
    prefix = f'lockdiag_up{{target="{name}"}} '
    line = next((line for line in body.splitlines() if line.startswith(prefix)), None)
    return line.removeprefix(prefix) if line is not None else None


def scrape_threads(name: str) -> int:
    """How many threads of this process are scraping target ``name`` now."""
    return sum(1 for thread in threading.enumerate() if thread.name == f"scrape {name}")


@contextmanager
def prometheus(tmp_path: Path, config: str) -> Iterator[str]:
    """A real Prometheus on loopback with this configuration (beside files written in
    ``tmp_path``), its API's URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: apt-get install prometheus (.ci/run does)"
    (tmp_path / "prometheus.yml").write_text(config)
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        process.terminate()
        process.wait(10)


def scrape_config(url: str, timeout: str = "1s", rules: str = "") -> str:
    """One job scraping ``url``'s /metrics every second, within ``timeout``; these rule files."""
    host = url.removeprefix("http://")
    return (
        f"global: {{scrape_interval: 1s, scrape_timeout: {timeout}, evaluation_interval: 1s}}\n"
        f"rule_files: [{rules}]\n"
        f"scrape_configs:\n  - job_name: lockdiag\n    static_configs: [{{targets: ['{host}']}}]\n"
    )


def series(api: str, query: str) -> list[dict[str, Any]]:
    """The result of an instant query to a Prometheus API; none while it does not answer."""
    try:
        status, body = get(f"{api}/query?query={urllib.parse.quote(query)}")
    except OSError:
        return []
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"] if status == 200 else []
    return result
