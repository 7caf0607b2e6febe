"""Catalogue plugins through real entry points: a distribution made in tmp_path, put on the
PYTHONPATH of ``python -m lockdiag``, and real sessions holding the keys it declares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from lockdiag.core.catalogue import Known, Software
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import from_bigint, from_pair
from lockdiag.plugins import Entry, Key, cause

from helpers.cli import lockdiag
from helpers.plugins import install
from helpers.servers import Sessions

DEPLOY_KEY = 4711000001  # high word 1, low word 416032705
TENANT_SPACE = 4712
CRON_SPACE = 4713

ACME = """
import zlib

from lockdiag.plugins import Entry, Key

CALLS = []


def entries():
    CALLS.append(1)
    return [
        Entry(
            software="Acme Deploy",
            kind="deploy",
            function="pg_try_advisory_lock",
            normal="held for the whole acme deploy",
            keys=(Key.bigint(4711000001, "deploy lock"), Key.space(4712, "tenant job")),
        ),
        Entry(
            software="Acme Cron",
            kind="scheduler",
            function="pg_advisory_lock",
            normal="held by one cron run",
            check="see the run in acme-cron's dashboard before acting",
            per_database=lambda database: [
                Key.pair(4713, zlib.crc32(database.encode()) & 0x7FFFFFFF, f"cron of {database}")
            ],
        ),
    ]
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    found = tmp_path / "site"
    install(found, "acme_lockdiag", ACME, {"acme": "acme_lockdiag:entries"})
    return found


def with_plugins(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``lockdiag ARGS`` as a process with ``site`` (its plugins) on its Python path, on a
    250-column screen."""
    return lockdiag(*args, env={**os.environ, "PYTHONPATH": str(site), "COLUMNS": "250"})


def python(site: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def warnings_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("lockdiag: warning:")]


def cron_key(database: str) -> tuple[int, int]:
    return CRON_SPACE, zlib.crc32(database.encode()) & 0x7FFFFFFF


# -- the API ---------------------------------------------------------------------------------


def test_keys_are_checked_where_they_are_made() -> None:
    assert Key.bigint(-1, "x").triple == from_bigint(-1)
    assert Key.pair(-5, 7, "x").triple == from_pair(-5, 7)
    assert Key.space(4712, "x").describe() == "key space (4712, *)"
    with pytest.raises(ValueError, match="outside"):
        Key.bigint(2**63, "x")
    with pytest.raises(ValueError, match="outside"):
        Key.pair(2**31, 0, "x")
    with pytest.raises(TypeError, match="must be an int"):
        Key.bigint(True, "x")
    with pytest.raises(ValueError, match="printable"):
        Key.bigint(1, "two\nlines")
    with pytest.raises(ValueError, match="not a key"):
        Key("pair", (1,), "x")


def test_entries_are_checked_where_they_are_made() -> None:
    entry = Entry("Acme", "queue", "pg_advisory_xact_lock", "held by one job", [Key.bigint(9, "j")])  # type: ignore[arg-type]
    assert entry.keys == (Key.bigint(9, "j"),)  # a list becomes a tuple: the entry is frozen
    with pytest.raises(ValueError, match="kind 'job' is not one of"):
        Entry("Acme", "job", "pg_advisory_lock", "held")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an advisory lock function"):
        Entry("Acme", "queue", "pg_lock", "held")
    with pytest.raises(TypeError, match=r"a key must be a lockdiag\.plugins\.Key"):
        Entry("Acme", "queue", "pg_advisory_lock", "held", (9,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="software is empty"):
        Entry("", "queue", "pg_advisory_lock", "held")


def test_a_plugin_key_has_a_confidence_of_its_own() -> None:
    software = Software("queue", "pg_advisory_lock", "held by one job")
    known = Known("Acme", "job lock", "plugin", "acme", software)
    assert known.label == "Acme: job lock (declared by plugin acme)"
    assert known.behaviour is software
    assert cause(ValueError("a\n  b\x1b[31m")) == "ValueError: a b\\x1b[31m"


# -- loading -----------------------------------------------------------------------------------


def test_plugins_load_once_and_only_when_a_catalogue_is_built(site: Path) -> None:
    probe = (
        "import sys\n"
        "import lockdiag.registry, lockdiag.plugins, lockdiag.core.catalogue as c\n"
        "print('acme_lockdiag' in sys.modules)\n"
        "c.build_catalogue(lockdiag.registry.Candidates(), ['shop'])\n"
        "c.build_catalogue(lockdiag.registry.Candidates(), ['other'])\n"
        "import acme_lockdiag\n"
        "print(len(acme_lockdiag.CALLS))\n"
    )
    assert python(site, probe).split() == ["False", "1"]
    key = with_plugins(site, "key", "--help")
    assert key.returncode == 0 and key.stderr == ""


def test_decode_names_a_plugin_key_without_a_server(site: Path) -> None:
    result = with_plugins(site, "decode", str(DEPLOY_KEY), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["known"] == {
        "software": "Acme Deploy",
        "meaning": "deploy lock",
        "confidence": "plugin",
        "plugin": "acme",
    }
    space = with_plugins(site, "decode", str(TENANT_SPACE), "99")
    assert space.stdout.splitlines()[0] == "Acme Deploy: tenant job (declared by plugin acme)"
    assert "SELECT pg_try_advisory_lock(4712, 99) (as Acme Deploy takes it)" in space.stdout
    assert result.stderr == space.stderr == ""


# -- on a real server --------------------------------------------------------------------------


def hold(sessions: Sessions) -> tuple[int, int, int]:
    """A deploy holding the plugin's keys with a session queued behind it, and a cron run
    holding the key the plugin computes for database postgres."""
    deploy = sessions.open("acme-deploy")
    deploy.run(f"SELECT pg_advisory_lock({DEPLOY_KEY}), pg_advisory_lock({TENANT_SPACE}, 99)")
    cron = sessions.open("acme-cron")
    cron.run("SELECT pg_advisory_lock({}, {})".format(*cron_key("postgres")))
    waiter = sessions.open("acme-deploy-2")
    waiter.start(f"SELECT pg_advisory_lock({DEPLOY_KEY})")
    sessions.waiting(waiter)
    return deploy.pid, cron.pid, waiter.pid


def plugin_locks(listed: subprocess.CompletedProcess[str]) -> list[tuple[Any, ...]]:
    assert listed.returncode == 0, listed.stderr
    locks = json.loads(listed.stdout)["locks"]
    return sorted(
        (lock["pid"], *lock["known"].values()) for lock in locks if lock["known"] is not None
    )


def test_list_who_holds_and_check_name_the_plugins_software(
    cluster: Cluster, sessions: Sessions, site: Path
) -> None:
    deploy, cron, waiter = hold(sessions)
    listed = with_plugins(site, "list", "--dsn", cluster.dsn(), "--format", "json")
    assert plugin_locks(listed) == sorted([
        (deploy, "Acme Deploy", "deploy lock", "plugin", "acme"),
        (deploy, "Acme Deploy", "tenant job", "plugin", "acme"),
        (cron, "Acme Cron", "cron of postgres", "plugin", "acme"),
        (waiter, "Acme Deploy", "deploy lock", "plugin", "acme"),
    ])  # fmt: skip
    plain = with_plugins(site, "list", "--dsn", cluster.dsn(), "--format", "plain")
    labels = {line.split("  ")[0] for line in plain.stdout.splitlines()[1:-1]}  # header, total
    assert labels == {
        "Acme Deploy: deploy lock (declared by plugin acme)",
        "Acme Deploy: tenant job (declared by plugin acme)",
        "Acme Cron: cron of postgres (declared by plugin acme)",
    }

    who = with_plugins(site, "who-holds", "--key", str(DEPLOY_KEY), "--dsn", cluster.dsn())
    assert who.returncode == 0, who.stderr
    assert who.stdout.splitlines()[0].startswith(
        f"Acme Deploy: deploy lock (declared by plugin acme) (1, 416032705, 1) is held by pid "
        f"{deploy} (acme-deploy), idle "
    )
    assert (
        ", session lock of Acme Deploy (held for the whole acme deploy); 1 waiting"
        in (who.stdout.splitlines()[0])
    )
    # the holder's own query shows the call: the strongest evidence of how it was taken
    assert "SQL: SELECT pg_advisory_lock(4711000001) (its holder's own query)" in who.stdout

    check = with_plugins(
        site, "check", "--session-age", "0s,1h", "--wait-age", "0s,5m", "--dsn", cluster.dsn(),
        "--format", "json",
    )  # fmt: skip
    steps = {
        (finding["pid"], finding["kind"]): finding["next_step"]
        for finding in json.loads(check.stdout)["findings"]
    }
    assert steps[(deploy, "session-lock")] == (
        "an Acme Deploy is running, or died holding its lock (held for the whole acme "
        "deploy): check that deploy (its process, its log) before acting; ending its session "
        "mid-deploy can leave Acme Deploy's record of applied changes out of step with the schema"
    )
    assert steps[(cron, "session-lock")] == (
        "Acme Cron cron of postgres is held by one cron run: see the run in acme-cron's "
        "dashboard before acting"
    )
    assert warnings_of(listed) == warnings_of(who) == warnings_of(check) == []


BROKEN = {
    "missing": ("acme_missing:entries", None),
    "nothing": ("broken_plugins:nothing", "def nothing():\n    return 42\n"),
    "garbage": ("broken_plugins:garbage", "def garbage():\n    return ['Acme', 1]\n"),
    "raises": ("broken_plugins:raises", "def raises():\n    raise RuntimeError('no\\nconfig')\n"),
}


def test_a_broken_plugin_warns_in_one_line_and_the_command_answers(
    cluster: Cluster, sessions: Sessions, site: Path
) -> None:
    source = "".join(code for _, code in BROKEN.values() if code)
    install(site, "broken_plugins", source, {name: target for name, (target, _) in BROKEN.items()})
    hold(sessions)
    listed = with_plugins(site, "list", "--dsn", cluster.dsn(), "--format", "json")
    assert len(plugin_locks(listed)) == 4  # acme's keys, named as without the broken ones
    assert warnings_of(listed) == [
        "lockdiag: warning: plugin garbage not used: TypeError: it returned a str, not a "
        "lockdiag.plugins.Entry",
        "lockdiag: warning: plugin missing not used: ModuleNotFoundError: No module named "
        "'acme_missing'",
        "lockdiag: warning: plugin nothing not used: TypeError: it returned int, not an "
        "iterable of Entry",
        "lockdiag: warning: plugin raises not used: RuntimeError: no config",
    ]
    assert listed.stderr.count("\n") == 4  # one line each, never a traceback
    check = with_plugins(site, "check", "--dsn", cluster.dsn())
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("OK")
    assert warnings_of(check) == warnings_of(listed)


def test_a_clash_keeps_the_registry_name_then_the_built_in_one(
    cluster: Cluster, sessions: Sessions, site: Path, tmp_path: Path
) -> None:
    """The registry (./lockdiag.toml) names the deploy key's namespace; another plugin declares
    Prisma's key and the deploy key again."""
    (tmp_path / "lockdiag.toml").write_text('[namespaces.deploys]\nid = 1\nform = "bigint"\n')
    clash = """
        from lockdiag.plugins import Entry, Key

        def entries():
            keys = (Key.bigint(72707369, "schema lock"), Key.bigint(4711000001, "other lock"))
            return [Entry("Zeta", "migration", "pg_advisory_lock", "held while it runs", keys)]
    """
    install(site, "zeta_lockdiag", clash, {"zeta": "zeta_lockdiag:entries"})
    deploy, cron, waiter = hold(sessions)
    prisma = sessions.open("prisma")
    prisma.run("SELECT pg_advisory_lock(72707369)")
    listed = with_plugins(site, "list", "--dsn", cluster.dsn(), "--format", "json")
    locks = json.loads(listed.stdout)["locks"]
    names = {
        (lock["pid"], lock["namespace"], (lock["known"] or {}).get("software")) for lock in locks
    }
    assert names == {
        (deploy, "deploys", None),
        (waiter, "deploys", None),
        (deploy, None, "Acme Deploy"),  # the tenant job's space
        (cron, None, "Acme Cron"),
        (prisma.pid, None, "Prisma Migrate"),
    }
    assert warnings_of(listed) == [
        "lockdiag: warning: plugin acme: key 4711000001 of Acme Deploy is in namespace "
        "'deploys' of the registry: the registry's name is used",
        "lockdiag: warning: plugin zeta: key 4711000001 of Zeta is in namespace 'deploys' of "
        "the registry: the registry's name is used",
        "lockdiag: warning: plugin zeta: key 4711000001 of Zeta is Acme Deploy's deploy lock "
        "(declared by plugin acme): that name is used",
        "lockdiag: warning: plugin zeta: key 72707369 of Zeta is Prisma Migrate's migration "
        "lock (built in): that name is used",
    ]


def test_the_guides_example_is_a_working_plugin(tmp_path: Path) -> None:
    import tomllib

    guide = Path(__file__).resolve().parent.parent / "docs" / "guides" / "plugins.md"
    text = guide.read_text()
    stanza = text.split("```toml\n", 1)[1].split("```", 1)[0]
    assert tomllib.loads(stanza)["project"]["entry-points"]["lockdiag.catalogue"] == {
        "acme": "acme_lockdiag:entries"
    }
    module = text.split("The module, complete:\n\n```python\n", 1)[1].split("```", 1)[0]
    site = tmp_path / "guide"
    install(site, "acme_lockdiag", module, {"acme": "acme_lockdiag:entries"})
    deploy = with_plugins(site, "decode", str(DEPLOY_KEY))
    assert deploy.stdout.splitlines()[:2] == [
        "Acme Deploy: deploy lock (declared by plugin acme)",
        "  confidence: plugin",
    ]
    jobs = with_plugins(site, "decode", str(TENANT_SPACE), "5")
    assert jobs.stdout.splitlines()[0] == "Acme Jobs: tenant job (declared by plugin acme)"
    assert deploy.stderr == jobs.stderr == ""
