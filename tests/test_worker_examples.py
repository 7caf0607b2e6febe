"""The worker examples for SQLAlchemy, Django and asyncpg, run against the test cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lockdiag.demo.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run(*command: str, extra: dict[str, str] | None = None) -> list[str]:
    environment = {**os.environ, "LOCKDIAG_REGISTRY": str(EXAMPLES / "lockdiag.toml")}
    result = subprocess.run(
        [sys.executable, *command], env={**environment, **(extra or {})},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_celery_style_sqlalchemy_task(cluster: Cluster) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/postgres"
    assert run(str(EXAMPLES / "celery_sqlalchemy.py"), url, "73", "74") == [
        "tenant 73: rebuilt", "tenant 74: rebuilt", "invoices 1: exported",
    ]  # fmt: skip


def test_the_asyncpg_worker(cluster: Cluster) -> None:
    url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    assert run(str(EXAMPLES / "asyncpg_worker.py"), url, "73", "74") == [
        "tenant 73: rebuilt, twin: busy", "tenant 74: rebuilt, twin: busy", "invoices 1: exported",
    ]  # fmt: skip


def test_the_django_management_command(cluster: Cluster) -> None:
    database = {"LOCKDIAG_DJANGO_HOST": "127.0.0.1", "LOCKDIAG_DJANGO_PORT": str(cluster.port),
                "LOCKDIAG_DJANGO_NAME": "postgres", "LOCKDIAG_DJANGO_USER": "postgres"}  # fmt: skip
    manage = str(EXAMPLES / "django_worker" / "manage.py")
    assert run(manage, "rebuild_summaries", "73", "74", "--export", "1", extra=database) == [
        "outside atomic(): refused", "tenant 73: rebuilt", "tenant 74: rebuilt",
        "invoices 1: exported",
    ]  # fmt: skip
