"""The helpers for a blocking connection: the rules' steps performed one by one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from lockdiag.registry import Registry
from lockdiag.worker.drivers import Adapter, adapter
from lockdiag.worker.events import Events
from lockdiag.worker.rules import Check, Request, Run, Step, Steps, take_session, take_xact, unlock

T = TypeVar("T")


def _perform(connection: Adapter, step: Step) -> object:
    if isinstance(step, Run):
        if not step.savepoint:
            return connection.run(step.statement)
        with connection.savepoint():
            return connection.run(step.statement)
    if isinstance(step, Check):
        step.call()
    elif step == "state":
        return connection.state()
    elif step == "commit":
        connection.commit()
    else:
        connection.rollback()
    return None


def execute(connection: Adapter, steps: Steps[T]) -> T:
    """Perform a rule's STEPS until it returns: each step's value is sent back to the rule, or
    its error thrown in, where the rule handles it as if it had made the call."""
    value: object = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, error = _perform(connection, step), None
        except BaseException as failed:  # the rule decides, as with a call of its own
            value, error = None, failed


def xact_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """Take NAMESPACE RESOURCE's transaction-level lock; True when taken, False when busy.

    It must run inside a transaction (``with conn.transaction():``, ``with conn.begin():``,
    ``with transaction.atomic():``, or a connection not in autocommit mode): outside one it
    raises NotInTransaction rather than take a lock that would vanish at once. With
    ``wait=True`` it waits, at most ``timeout`` seconds when given (LockTimeout, and the
    caller's transaction goes on). The lock ends with the transaction; run the protected
    statements on this connection, in this transaction.
    """
    connection = adapter(conn, "xact_lock")
    request = Request.of(namespace, resource, wait, timeout, registry, events)
    return execute(connection, take_xact(connection, "xact_lock", request))


@contextmanager
def session_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> Iterator[bool]:
    """A session-level lock for the block: yields whether it was taken.

    On the way out (normally, by an exception, by a cancellation) it is unlocked exactly once
    if it was taken, and an unlock that finds no lock held is logged and counted, not
    ignored. Taken inside a transaction, it stays held after a rollback (PostgreSQL's rule:
    session locks ignore transactions), and it is still released on the way out: inside a
    transaction the block runs in a savepoint, so a failed statement in it cannot leave the
    unlock unable to run. Refused (PooledSession) through a PgBouncer of the registry's
    ``[poolers]`` in transaction or statement pooling.
    """
    connection = adapter(conn, "session_lock")
    request = Request.of(namespace, resource, wait, timeout, registry, events)
    held = execute(connection, take_session(connection, request))
    try:
        if held.in_savepoint:
            with connection.savepoint():
                yield held.taken
        else:
            yield held.taken
    finally:
        if held.taken:
            execute(connection, unlock(connection, request, held))
