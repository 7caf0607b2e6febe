"""Rows by name: every query file's columns, as the server names them in cursor.description,
are the names of the row type the code reads them into (a NamedTuple made with ``_make``), or,
for the snapshot's hot path read by position, the named positions of pg/capture.py. Run on the
suite's server, whichever version it is (scripts/matrix.py runs the suite on each)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lockdiag.core import ahead
from lockdiag.core.catalogue import KeyRow
from lockdiag.core.model import Aggregated, LockRow
from lockdiag.core.pacing import Backend
from lockdiag.demo.cluster import Cluster
from lockdiag.pg import capture, queries
from lockdiag.pg.actions import Alive, Signal
from lockdiag.pg.pooltest import Answer, Holders, PoolSide
from lockdiag.pg.raw_text import RelationName
from lockdiag.pg.session import DatabaseName
from lockdiag.pg.trust import Vetted
from lockdiag.registry import Registry

Statement = Callable[[int], tuple[str | sql.Composed, dict[str, Any]]]


def snapshot(scope: Any) -> Statement:
    """The snapshot query as capture() sends it, with every parameter it binds."""

    def statement(version: int) -> tuple[str, dict[str, Any]]:
        text, params = capture._snapshot_query(version, scope, Registry())
        return text, {**params, "names": ["x"], **ahead.probe_params()}

    return statement


def plain(name: str, **params: Any) -> Statement:
    return lambda version: (queries.query(name, version), params)


def lock_function(version: int) -> tuple[sql.Composed, dict[str, Any]]:
    text = sql.SQL(queries.query("pooltest_lock", version)).format(
        function=sql.Identifier("pg_try_advisory_xact_lock")
    )
    return text, {"a": 1818977383, "b": 7}


NO_LOCKS = json.dumps([])
# each query: how it is sent, and the names of what its rows are read into
ROWS: dict[str, tuple[Statement, tuple[str, ...]]] = {
    "snapshot": (snapshot("all"), capture.SNAPSHOT_COLUMNS),
    "snapshot_aggregated": (snapshot(Aggregated()), capture.SNAPSHOT_COLUMNS),
    "probe_activity": (plain("probe_activity", own="lockdiag"), Backend._fields),
    "database_names": (plain("database_names"), DatabaseName._fields),
    "relation_names": (plain("relation_names", oids=[1259]), RelationName._fields),
    "enrich_hashtext": (plain("enrich_hashtext", strings=["x"]), KeyRow._fields),
    "trust_tables": (plain("trust_tables", tables=NO_LOCKS), Vetted._fields),
    "signal_backend": (
        # pid 0 is no backend: nothing is signalled, the row says so
        plain("signal_backend", pid=0, backend_start=None, locks=NO_LOCKS, cancel=True),
        Signal._fields,
    ),
    "backend_alive": (plain("backend_alive", pid=0), Alive._fields),
    "pooltest_holders": (
        plain("pooltest_holders", classid=1818977383, objid=7, objsubid=2),
        Holders._fields,
    ),
    "pooltest_lock": (lock_function, Answer._fields),
    "pooltest_probe": (plain("pooltest_probe"), PoolSide._fields),
}


def test_every_query_declares_its_rows() -> None:
    assert set(ROWS) == set(queries.VERSIONS)


def test_the_snapshots_positions_are_the_lock_rows_fields() -> None:
    """capture() reads a lock by position: a slice of the row becomes a LockRow."""
    columns = capture.SNAPSHOT_COLUMNS
    assert columns[capture.LOCK] == LockRow._fields[: len(columns[capture.LOCK])]
    assert columns[capture.LOCK][-1] == "blocked_by"
    assert (columns[capture.KIND], columns[capture.RELATION]) == ("kind", "relation")
    assert (columns[capture.RELATION_NAME], columns[capture.DETAIL]) == ("relation_name", "detail")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_querys_columns_are_its_rows_names(cluster: Cluster, name: str) -> None:
    statement, declared = ROWS[name]
    with psycopg.connect(cluster.dsn(), autocommit=True) as connection:
        text, params = statement(connection.info.server_version)
        query = text.encode() if isinstance(text, str) else text
        cursor = connection.execute(query, params)
        assert cursor.description is not None
        assert [column.name for column in cursor.description] == list(declared), (
            connection.info.server_version
        )
