"""One entry per program: a program declared here, in the test, and nowhere else, is named
everywhere lockdiag names programs. Its exact key; its table in the snapshot's probe and in
the list pg.trust vets; its enrichment part assembled and run on a real server (its table
created, a key of its rows held, the lock named); its ``[known]`` list accepted by the registry
and its keys computed from the names listed; its key space warned about; its hashed name
computed by the server. Withdrawn, it is gone from each of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lockdiag.core import catalogue
from lockdiag.core.ahead import probe_params
from lockdiag.core.catalogue import (
    FIXED,
    SOFTWARE,
    Known,
    Program,
    Software,
    build_catalogue,
    candidate_keys,
    collisions,
)
from lockdiag.core.catalogue.entry import Hashed, Hold, Rows, Space, withdraw
from lockdiag.demo.cluster import Cluster
from lockdiag.keys import LockTriple, from_bigint, from_pair
from lockdiag.registry import Candidates, KnownList, Namespace, parse_registry

from helpers.cli import list_json
from helpers.servers import Sessions

EXACT = 8_102_030_405  # Acme Jobs' deploy lock: high word 1, low word 3807063109
SPACE = 91_000  # the first number of every pair Acme Jobs takes for a listed name


def acme_listed(candidates: Candidates) -> dict[LockTriple, Known]:
    """A listed name's key: (91000, its length), as Acme's own code computes it."""
    return {
        from_pair(SPACE, len(name)): Known("Acme Jobs", f"queue {name!r}", "derived")
        for name in candidates.names("acme_queues")
    }


# Acme's workers lock each running job by its id plus 7 * 10^9
ACME_ROWS = """
SELECT id::text, id + 7000000000 FROM ONLY acme.jobs
WHERE id + 7000000000 = ANY(%(keys)s::bigint[]) AND state = 'running'
LIMIT %(row_limit)s
"""


def declare() -> Program:
    return Program(
        "Acme Jobs",
        Software("queue", "pg_try_advisory_lock", "held while an Acme job runs"),
        exact={from_bigint(EXACT): "deploy lock"},
        holds=(Hold("work", ("pg_try_advisory_lock",), "skips"),),
        lists=(KnownList("acme_queues", "Acme queue names"),),
        listed_keys=acme_listed,
        hashed=(Hashed("acme maintenance", "maintenance lock"),),
        rows=(
            Rows(
                "acme.jobs",
                {"id": ("int8",), "state": ("text",)},
                ACME_ROWS,
                "job {name}",
            ),
        ),
        spaces=(Space("pair", range(SPACE, SPACE + 1), "queue locks"),),
    )


@pytest.fixture
def acme() -> Iterator[Program]:
    program = declare()
    try:
        yield program
    finally:
        withdraw(program)


def test_a_declared_program_is_named_without_touching_another_file(acme: Program) -> None:
    assert FIXED[from_bigint(EXACT)] == Known("Acme Jobs", "deploy lock", "exact")
    assert SOFTWARE["Acme Jobs"] is acme.software
    found = build_catalogue(Candidates()).lookup(from_bigint(EXACT), "any")
    assert found is not None and found.label == "Acme Jobs: deploy lock"
    # its table: probed by the snapshot query, vetted by pg.trust with its columns
    probe = probe_params()
    assert ("acme", "jobs") in zip(probe["row_schemas"], probe["row_names"], strict=True)
    assert catalogue.row_tables()["acme.jobs"] == {"id": ("int8",), "state": ("text",)}
    # its [known] list: accepted, and its keys computed from the names listed
    registry, problems = parse_registry('[known]\nacme_queues = ["orders", "mail"]\n')
    assert registry is not None and not problems, problems
    keys = candidate_keys(registry.candidates)
    assert keys[from_pair(SPACE, 6)].label == "Acme Jobs: queue 'orders'"
    assert keys[from_pair(SPACE, 4)].label == "Acme Jobs: queue 'mail'"
    # its hashed name is sent to the server
    assert "acme maintenance" in catalogue.hashed_names(Candidates())
    # its key space: a namespace inside it is warned about
    (warning,) = collisions(Namespace("mine", SPACE, "pair"))
    assert warning == (
        "namespace 'mine' covers the keys of Acme Jobs's queue locks (first number 91000)"
    )


def test_withdrawn_it_is_gone_everywhere() -> None:
    program = declare()
    withdraw(program)
    assert from_bigint(EXACT) not in FIXED and "Acme Jobs" not in SOFTWARE
    assert "acme.jobs" not in catalogue.row_tables()
    assert "acme maintenance" not in catalogue.hashed_names(Candidates())
    registry, problems = parse_registry('[known]\nacme_queues = ["orders"]\n')
    assert registry is None
    assert "[known]: unknown key 'acme_queues'" in problems[0].message
    assert not collisions(Namespace("mine", SPACE, "pair"))
    declare_again = declare()  # and it can be declared again
    withdraw(declare_again)


def test_a_key_claimed_twice_or_a_list_declared_twice_is_refused(acme: Program) -> None:
    with pytest.raises(ValueError, match=r"is both Acme Jobs's and Copycat's"):
        Program("Copycat", acme.software, exact={from_bigint(EXACT): "the same number"})
    with pytest.raises(ValueError, match=r"\[known\] acme_queues is declared twice"):
        Program("Copycat", acme.software, lists=(KnownList("acme_queues", "again"),))
    with pytest.raises(ValueError, match=r"hashtext\('acme maintenance'\) is both"):
        Program("Copycat", acme.software, hashed=(Hashed("acme maintenance", "the same"),))
    with pytest.raises(ValueError, match=r"acme.jobs.id is declared with two sets of types"):
        Program("Copycat", acme.software, rows=(Rows("acme.jobs", {"id": ("int4",)}, "x"),))
    assert "Copycat" not in SOFTWARE  # a refused program is not declared


def listed(cluster: Cluster, dbname: str, registry: Path | None = None) -> list[dict[str, Any]]:
    more = ["--registry", str(registry)] if registry is not None else []
    locks: list[dict[str, Any]] = list_json(cluster, *more, dbname=dbname)["locks"]
    return locks


def test_its_locks_are_named_on_a_real_server(
    acme: Program, cluster: Cluster, sessions: Sessions, tmp_path: Path
) -> None:
    """Its table created, a key of its rows held, its exact key, a listed name's key and its
    hashed name held: lockdiag names each (the rows by the part its entry declares)."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE acme_db")
    with psycopg.connect(cluster.dsn(dbname="acme_db"), autocommit=True) as setup:
        setup.execute("CREATE SCHEMA acme")
        setup.execute("CREATE TABLE acme.jobs (id bigint PRIMARY KEY, state text)")
        setup.execute("INSERT INTO acme.jobs VALUES (42, 'running'), (43, 'done')")
    worker = sessions.open("acme-worker", dbname="acme_db")
    worker.run("SELECT pg_try_advisory_lock(id + 7000000000) FROM acme.jobs")  # 42 and 43
    worker.run(f"SELECT pg_advisory_lock({EXACT}), pg_advisory_lock({SPACE}, 6)")
    worker.run("SELECT pg_advisory_lock(hashtext('acme maintenance'))")
    registry = tmp_path / "lockdiag.toml"
    registry.write_text('[known]\nacme_queues = ["orders"]\n')
    named = {
        (lock["key"][0] if len(lock["key"]) == 1 else tuple(lock["key"])): lock["known"]
        for lock in listed(cluster, "acme_db", registry)
    }
    assert named[7000000042] == {
        "software": "Acme Jobs",
        "meaning": "job 42",
        "confidence": "derived",
    }
    assert named[7000000043] is None  # its row says it is done: not one of its keys
    assert named[EXACT]["meaning"] == "deploy lock"
    assert named[(SPACE, 6)]["meaning"] == "queue 'orders'"
    assert [v["meaning"] for k, v in named.items() if v and v["software"] == "Acme Jobs"].count(
        "maintenance lock"
    ) == 1


def test_every_rows_part_reads_its_own_table_alone() -> None:
    """Each table part of the enrichment query reads only the table its entry declares (with
    ONLY: no child), and otherwise only subqueries and pg_catalog's functions: what pg.trust
    vetted is what is read."""
    sources = list(catalogue.row_sources())
    assert len(sources) >= 7
    for program, rows in sources:
        sql = re.sub(r"--[^\n]*", "", rows.sql)
        targets = re.findall(r"\b(?:FROM|JOIN)\s+(?!\()(ONLY\s+)?([\w.]+)", sql, re.IGNORECASE)
        for only, target in targets:
            if target.startswith("pg_catalog.") or target.upper() == "LATERAL":
                continue
            assert only and target == rows.table, (program.name, target)
        assert "%(keys)s" in sql or "%(row_limit)s" in sql, program.name


def test_a_worker_that_imports_the_registry_alone_keeps_known_unchecked() -> None:
    """A worker never loads the catalogue (it imports the registry alone): the team's
    ``[known]`` lists, which it never uses, do not stop it from loading the registry; with the
    catalogue loaded, a list no program declares is an error on its line."""
    import subprocess
    import sys

    text = '[namespaces.jobs]\nid = 7\n[known]\ndjango_pglocks = ["a"]\nnot_a_list = ["b"]\n'
    probe = (
        "import sys, lockdiag.registry as r\n"
        f"names, problems = r.parse_registry({text!r})\n"
        "print(names is not None, [p.message for p in problems], 'lockdiag.core' in "
        "' '.join(sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.stdout.strip() == "True [] False", result.stderr
    names, problems = parse_registry(text)
    assert names is None
    assert [p.line for p in problems] == [5]
    assert problems[0].message.startswith("[known]: unknown key 'not_a_list' (allowed: ")


def test_the_guide_lists_every_known_list() -> None:
    """The known-locks guide's ``[known]`` example names every list the entries declare."""
    from lockdiag.registry import KNOWN_LISTS

    guide = (Path(__file__).parents[1] / "docs" / "guides" / "known-locks.md").read_text()
    block = guide.split("[known]\n", 1)[1].split("```", 1)[0]
    written = {line.split(" =", 1)[0] for line in block.splitlines() if " = " in line}
    assert written == set(KNOWN_LISTS)
