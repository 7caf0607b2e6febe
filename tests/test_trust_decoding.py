"""Text in another encoding never costs a lock: a LATIN1 database's sessions whose queries hold
an 'é' (one byte, which UTF-8 refuses) reach lockdiag as their bytes, whatever database it
reads from, and are decoded as LATIN1; a SQL_ASCII database holds whatever bytes its clients
sent, and those no encoding explains are shown with U+FFFD and a note naming the database,
read from it or from another one. Never a traceback (tests/test_database_encodings.py: every
encoding, from each database)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from lockdiag.demo.cluster import Cluster

from helpers.cli import run_without_traceback
from helpers.servers import Sessions

LATIN1 = "latin_app"
SQL_ASCII = "ascii_app"
KEY = 5550123
NOTE = "is not valid UTF-8 (another encoding)"


@pytest.fixture(scope="module")
def encodings(cluster: Cluster) -> Cluster:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        for database, encoding in ((LATIN1, "LATIN1"), (SQL_ASCII, "SQL_ASCII")):
            admin.execute(
                f"CREATE DATABASE {database} ENCODING '{encoding}' LC_COLLATE 'C' "
                "LC_CTYPE 'C' TEMPLATE template0"
            )
    # a table whose name is the byte 0xE9 in a SQL_ASCII database (a LATIN1 client wrote it)
    with psycopg.connect(
        cluster.dsn(dbname=SQL_ASCII, client_encoding="LATIN1"), autocommit=True
    ) as owner:
        owner.execute('CREATE TABLE public."café" (id int)')
    return cluster


@pytest.fixture
def latin1_waits(encodings: Cluster, sessions: Sessions) -> Iterator[tuple[int, int]]:
    """In the LATIN1 database: a holder idle after a query with 'é', a waiter whose waiting
    query has one; (holder pid, waiter pid)."""
    holder = sessions.open("holder", dbname=LATIN1)
    # the helpers send UTF-8 bytes: the server converts them to LATIN1 for the database
    holder.run("SET client_encoding = 'UTF8'")
    holder.run(f"SELECT pg_advisory_lock({KEY}), 'café' AS note")
    waiter = sessions.open("waiter", dbname=LATIN1)
    waiter.run("SET client_encoding = 'UTF8'")
    waiter.start(f"SELECT pg_advisory_lock({KEY}) /* déjà */")
    sessions.waiting(waiter)
    yield holder.pid, waiter.pid


def test_every_command_shows_another_databases_text_in_its_encoding(
    encodings: Cluster, latin1_waits: tuple[int, int], tmp_path: Path
) -> None:
    holder, waiter = latin1_waits
    dsn = encodings.dsn()  # the postgres database: the LATIN1 text comes through pg_stat_activity

    result = run_without_traceback("list", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "2 lock(s), 1 waiting" in result.stdout
    assert f"waits for {holder}" in result.stdout
    assert NOTE not in result.stdout, result.stdout  # LATIN1 explains every byte

    result = run_without_traceback("who-holds", "--key", str(KEY), "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "'café' AS note" in result.stdout
    assert str(waiter) in result.stdout

    result = run_without_traceback("blockers", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert str(holder) in result.stdout and str(waiter) in result.stdout

    result = run_without_traceback(
        "check", "--wait-age", "1ms,1h", "--format", "nagios", "--dsn", dsn
    )
    assert result.exit_code == 1, result.output  # the wait, as a WARNING: not UNKNOWN, not OK

    saved = tmp_path / "snapshot.json"
    result = run_without_traceback("snapshot", "-o", str(saved), "--dsn", dsn)
    assert result.exit_code == 0, result.output
    document = json.loads(saved.read_text(encoding="utf-8"))
    queries = json.dumps(document, ensure_ascii=False)
    assert "SELECT pg_advisory_lock(5550123) /* déjà */" in queries
    assert NOTE not in queries


def test_a_sql_ascii_databases_bytes(encodings: Cluster, sessions: Sessions) -> None:
    """A SQL_ASCII database's bytes that are not UTF-8 (a LATIN1 client's 'é'): U+FFFD and
    one note, read from another database or from inside it (where the server validated them
    as UTF-8 and refused the whole read, exit 3, before they were read as bytes), the name of
    the table locked included."""
    holder = sessions.open("holder", dbname=SQL_ASCII, autocommit=False)
    holder.run(f"SELECT pg_advisory_xact_lock({KEY})")
    holder.run("SET client_encoding = 'LATIN1'")
    # psycopg encodes a str query in the session's encoding: 'é' goes as the byte 0xE9
    holder.connection.execute('LOCK TABLE public."café" IN ACCESS SHARE MODE')

    result = run_without_traceback("who-holds", "--key", str(KEY), "--dsn", encodings.dsn())
    assert result.exit_code == 0, result.output
    assert 'LOCK TABLE public."caf\ufffd"' in result.stdout
    note = f"note: text from database {SQL_ASCII} is not valid UTF-8 (another encoding)"
    assert result.stdout.count(note) == 1, result.stdout

    result = run_without_traceback("list", "--all", "--dsn", encodings.dsn(dbname=SQL_ASCII))
    assert result.exit_code == 0, result.output
    assert 'relation public."caf\ufffd"' in result.stdout
    assert result.stdout.count(note) == 1, result.stdout
