"""Advisory locks for job workers, taken the way the guidance says, named by the registry.

    from lockdiag.worker import xact_lock, session_lock

    with conn.transaction():
        if not xact_lock(conn, "tenant_summary", 73):
            return "busy"                      # a failed try is not permission to go on
        rebuild_summary(conn, 73)              # same connection, same transaction

    with session_lock(conn, "nightly_export", 1, wait=True, timeout=30) as taken:
        ...                                    # unlocked exactly once on the way out

``conn`` is what the worker already has: a psycopg 3 or psycopg2 connection, a SQLAlchemy
``Connection`` or ORM ``Session``, Django's ``connection``; for the async helpers a psycopg
``AsyncConnection``, a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``, an asyncpg
``Connection`` (a pool's included). The driver is recognised by the module of the object's
type and imported only then: none is imported with this module.

What each helper guarantees: the key comes from the registry (the CLI decodes what workers
take); a transaction lock is only taken inside a transaction; the boolean of a try is
returned, never hidden; a waiting lock gives up after ``timeout`` (LockTimeout) without
aborting the caller's transaction, and leaves the caller's ``lock_timeout`` (the only setting
a helper touches) as it found it, whatever the outcome; a session lock is unlocked exactly
once whatever ends the block (return, exception, cancellation), and an unlock that finds no
lock is logged and counted; a session lock is refused on a connection that goes through a
PgBouncer of the registry's ``[poolers]`` in transaction or statement pooling. What they
cannot guarantee: that an external effect happens once. Durable job state and constraints
still do that; a lock only keeps two workers from doing the same work at the same time.

Where things are, and what each may import:

- ``rules``: the rules, written once for sync and async (which statement, how it runs in each
  connection state, how the caller's ``lock_timeout`` is put back), as generators of steps;
- ``sync`` and ``aio``: the public helpers, each a thin executor of those steps;
- ``drivers``: one adapter per driver family (psycopg 3, psycopg2, SQLAlchemy, asyncpg,
  Django) that says whether a transaction is open, runs one statement, makes a savepoint, and
  commits or rolls back a transaction the helper itself began; each imports its driver only
  when it is given that driver's connection;
- ``events`` (what is reported, and its Prometheus metrics), ``poolers`` (the registry's
  ``[poolers]``), ``errors``.

The package imports the worker-facing modules (``lockdiag.errors``, ``lockdiag.keys``,
``lockdiag.registry``) and, only to read a PgBouncer console, ``lockdiag.pg.pgbouncer``;
nothing of ``core``, ``views`` or ``cli``.

Every attempt, wait, hold and outcome is reported to ``events`` (a callable), or to the default
set with :func:`report_to` (for instance :class:`PrometheusEvents`).
"""

from lockdiag.worker.aio import asession_lock, axact_lock
from lockdiag.worker.errors import (
    LockTimeout,
    NotInTransaction,
    PooledSession,
    UnsupportedConnection,
)
from lockdiag.worker.events import Event, Events, Kind, PrometheusEvents, Result, report_to, work
from lockdiag.worker.rules import LOCK_TIMEOUT, Plan, State
from lockdiag.worker.sync import session_lock, xact_lock

__all__ = [
    "LOCK_TIMEOUT",
    "Event",
    "Events",
    "Kind",
    "LockTimeout",
    "NotInTransaction",
    "Plan",
    "PooledSession",
    "PrometheusEvents",
    "Result",
    "State",
    "UnsupportedConnection",
    "asession_lock",
    "axact_lock",
    "report_to",
    "session_lock",
    "work",
    "xact_lock",
]
