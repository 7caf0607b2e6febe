"""A snapshot keeps its names: it carries the registry it was read with, so a colleague who
reads the file without the registry file sees the same names (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lockdiag.core import snapshot_file
from lockdiag.demo.cluster import Cluster
from lockdiag.registry import parse_registry

from helpers.cli import run
from helpers.servers import Sessions

REGISTRY = """\
[namespaces.tenant_summary]
id = 4102
description = "Rebuild one tenant's summary \\u007f \\"quoted\\" été"
owner = "reporting"
expect = "xact"
max_hold = "5m"
max_wait = "90s"

[namespaces.invoice_export]
id = 7
form = "bigint"

[namespaces."period.rollup"]
id = 4200
resource = ["tenant:int", "period:text"]
values = [[73, "2026-11"]]
expected_resources = 5000

[known]
with_advisory_lock = ["import_feed"]
with_advisory_lock_prefix = 3
"""

OTHER = """\
[namespaces.someone_elses]
id = 4102
"""


@pytest.fixture
def taken(cluster: Cluster, sessions: Sessions, tmp_path: Path) -> Path:
    """A snapshot of a lock in tenant_summary, taken with the registry in another folder."""
    team = tmp_path / "team"
    team.mkdir()
    (team / "lockdiag.toml").write_text(REGISTRY)
    sessions.open("billing-worker").run("SELECT pg_advisory_lock(4102, 74)")
    path = tmp_path / "incident.json"
    result = run("snapshot", "--dsn", cluster.dsn(), "--registry", str(team / "lockdiag.toml"),
                 "-o", str(path))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return path


def test_a_snapshot_read_without_its_registry_keeps_its_names(taken: Path) -> None:
    result = run("list", "--from", str(taken), "--format", "json")
    assert result.exit_code == 0, result.stderr
    (lock,) = json.loads(result.stdout)["locks"]
    assert (lock["namespace"], lock["resource"]) == ("tenant_summary", 74)
    assert "unregistered" not in result.stdout
    assert "names from the registry saved in" in result.stderr
    assert "team/lockdiag.toml" in result.stderr


def test_the_saved_registry_is_the_one_read(taken: Path) -> None:
    saved = snapshot_file.load_with_registry(taken)[1]
    assert saved is not None
    original, _ = parse_registry(REGISTRY)
    assert original is not None
    assert saved[0].namespaces == original.namespaces
    assert saved[0].candidates == original.candidates
    assert saved[1] is not None and saved[1].endswith("team/lockdiag.toml")
    assert "poolers" not in json.loads(taken.read_text())["registry"]["text"]


def test_an_explicit_registry_wins_and_says_so(taken: Path, tmp_path: Path) -> None:
    (tmp_path / "other.toml").write_text(OTHER)
    result = run("list", "--from", str(taken), "--registry", "other.toml", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (lock,) = json.loads(result.stdout)["locks"]
    assert lock["namespace"] == "someone_elses"
    assert "names from other.toml, not from the registry saved in" in result.stderr


def test_a_found_registry_gives_way_to_the_saved_one(taken: Path, tmp_path: Path) -> None:
    (tmp_path / "lockdiag.toml").write_text(OTHER)  # the current folder's
    result = run("who-holds", "tenant_summary", "74", "--from", str(taken))
    assert result.exit_code == 0, result.stderr


def test_an_older_snapshot_without_a_registry_still_loads(taken: Path) -> None:
    document = json.loads(taken.read_text())
    del document["registry"]
    taken.write_text(json.dumps(document))
    result = run("list", "--from", str(taken), "--format", "json")
    assert result.exit_code == 0, result.stderr
    (lock,) = json.loads(result.stdout)["locks"]
    assert lock["namespace"] is None
    assert "registry" not in result.stderr


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ("[]", "registry: expected an object"),
        ({"text": 5}, "registry.text: expected a string"),
        ({"text": "[namespaces.x]\nid = 'one'\n"}, "id must be an integer"),
        ({"text": "x" * (1 << 20) + "y"}, "registry: larger than 1 MiB"),
        ({"text": "a = [" * 70}, "nested more than 64 levels deep"),
    ],
)
def test_a_bad_saved_registry_is_one_error_line(taken: Path, saved: object, message: str) -> None:
    document = json.loads(taken.read_text())
    document["registry"] = saved
    taken.write_text(json.dumps(document))
    result = run("list", "--from", str(taken))
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
