"""A one-off read sends its query before it imports the catalogue (lockdiag.core.ahead): the
table it sends from is what the catalogue computes, the query's parameters are the same either
way, and on a real server the keys the catalogue lists inside a backend's run of keys still come
as rows of their own. Where the table cannot know (a registry's [known] lists, an installed
plugin, the catalogue loaded) the catalogue answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockdiag import plugins
from lockdiag.core import ahead, ahead_table
from lockdiag.demo.cluster import Cluster
from lockdiag.registry import Namespace, Registry, parse_registry

from helpers.plugins import install
from helpers.servers import Sessions

SCRIPT = "scripts/write_ahead_table.py"

# the query's parameters and the hashed names as a one-off read builds them (nothing imported
# but what a command imports), then whether the catalogue was loaded meanwhile
PARAMETERS = """
import json, sys
{first}
from lockdiag.core import ahead
from lockdiag.core.model import Aggregated
from lockdiag.keys import from_bigint
from lockdiag.pg import capture
from lockdiag.registry import Namespace, Registry
registry = Registry.of([Namespace(name="tenant_summary", id=7, form="pair")])
_, params = capture._snapshot_query(150000, Aggregated(key=from_bigint(5)), registry)
loaded = "lockdiag.core.catalogue" in sys.modules
print(json.dumps({{**params, **ahead.probe_params(), "names": ahead.hashed_names(registry),
                  "loaded": loaded}}))
"""

# an aggregated read's snapshot through the documented API, its lock rows as the test sees them
SNAPSHOT = """
import json, sys
{first}
from lockdiag.core.model import Aggregated
from lockdiag.evidence import take_snapshot
from lockdiag.registry import Registry
taken = take_snapshot(sys.argv[1], 10.0, Aggregated(), Registry())
rows = sorted([lock.classid or 0, lock.objid or 0, lock.objsubid or 0, lock.keys]
              for lock in taken.locks if lock.locktype == "advisory")
print(json.dumps(rows))
"""


def run_python(code: str, *arguments: str, env: dict[str, str] | None = None) -> object:
    result = subprocess.run(
        [sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=60,
        check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_table_is_what_the_catalogue_computes() -> None:
    written = Path(ahead_table.__file__).read_text(encoding="utf-8")
    assert written == ahead.render(), f"the catalogue changed: run python {SCRIPT}"


def test_a_one_off_read_builds_its_query_without_the_catalogue_and_the_same_as_with_it() -> None:
    table = run_python(PARAMETERS.format(first=""))
    live = run_python(PARAMETERS.format(first="import lockdiag.core.catalogue"))
    assert isinstance(table, dict) and isinstance(live, dict)
    assert table.pop("loaded") is False and live.pop("loaded") is True
    assert table == live
    # the key asked for comes last; the registry's space is not sent singly
    assert table["key_objids"][-1] == 5 and 7 not in table["key_classids"]
    assert table["space_classids"], table


def test_keys_the_catalogue_lists_inside_a_run_of_keys_come_as_rows_on_a_real_server(
    cluster: Cluster, sessions: Sessions
) -> None:
    """A backend holding bigint keys 1..300 (more than a span's smallest group) holds Airflow's
    1 and 2: they come as rows of their own, the rest as spans, the catalogue imported or not."""
    sessions.open("bulk").run("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 300) g")
    table = run_python(SNAPSHOT.format(first=""), cluster.dsn())
    live = run_python(SNAPSHOT.format(first="import lockdiag.core.catalogue"), cluster.dsn())
    assert table == live
    assert isinstance(table, list)
    assert [0, 1, 1, 1] in table and [0, 2, 1, 1] in table, table
    assert any(row[3] > 1 for row in table), table  # the rest in spans: an aggregated read
    assert sum(row[3] for row in table if row[:3] != [0, 0, 0]) >= 300


def test_the_table_stands_aside_where_it_cannot_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "lockdiag.core.catalogue")
    monkeypatch.setattr(plugins, "installed", lambda: False)
    assert ahead.from_table(Registry())
    assert ahead.from_table(None)
    listing, problems = parse_registry('[known]\npgmq_queues = ["orders"]\n')
    assert listing is not None and not problems
    assert not ahead.from_table(listing)  # a team's [known] lists: keys the table lacks
    monkeypatch.setattr(plugins, "installed", lambda: True)
    assert not ahead.from_table(Registry())  # a plugin's keys
    assert ahead.from_table(None)  # no registry, no plugin keys asked for
    monkeypatch.undo()  # the catalogue loaded again: it answers
    assert not ahead.from_table(Registry()) and not ahead.from_table(None)


def test_the_registry_keeps_its_spaces_out_of_the_table_as_out_of_the_catalogue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bigint = Registry.of([Namespace(name="all_bigint", id=0, form="bigint")])
    live = ahead.singles(bigint)
    monkeypatch.delitem(sys.modules, "lockdiag.core.catalogue")
    table = ahead.singles(bigint)
    assert table == live
    assert all(objsubid != 1 or classid != 0 for classid, _, objsubid in table[0]), table


def test_with_a_plugin_installed_a_one_off_read_asks_the_catalogue(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A plugin's key space is sent whole: the catalogue (which adds the plugin's keys) builds
    the query, not the table."""
    site = tmp_path / "site"
    install(site, "acme_ahead", PLUGIN, {"acme": "acme_ahead:entries"})
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    found = run_python(PARAMETERS.format(first=""), env=env)
    assert isinstance(found, dict)
    assert found["loaded"] is True
    assert 4711 in found["space_classids"], found


PLUGIN = """\
from lockdiag.plugins import Entry, Key

def entries():
    return [Entry(software="Acme Tenants", kind="queue", function="pg_advisory_lock",
                  normal="held while a tenant's job runs", keys=(Key.space(4711, "tenant"),))]
"""
