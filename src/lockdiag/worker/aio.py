"""The helpers for an asyncio connection: the same rules' steps, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

from lockdiag.registry import Registry
from lockdiag.worker.drivers import AsyncAdapter, async_adapter
from lockdiag.worker.events import Events
from lockdiag.worker.rules import Check, Request, Run, Step, Steps, take_session, take_xact, unlock

T = TypeVar("T")


async def _perform(connection: AsyncAdapter, step: Step) -> object:
    if isinstance(step, Run):
        if not step.savepoint:
            return await connection.run(step.statement)
        async with connection.savepoint():
            return await connection.run(step.statement)
    if isinstance(step, Check):
        await asyncio.to_thread(step.call)  # a console read must not stall the event loop
    elif step == "state":
        return await connection.state()
    elif step == "commit":
        await connection.commit()
    else:
        await connection.rollback()
    return None


async def execute(connection: AsyncAdapter, steps: Steps[T]) -> T:
    """:func:`lockdiag.worker.sync.execute`, each step awaited (a cancellation is thrown into
    the rule like any other error)."""
    value: object = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, error = await _perform(connection, step), None
        except BaseException as failed:  # the rule decides, as with a call of its own
            value, error = None, failed


async def axact_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> bool:
    """:func:`xact_lock` for an asyncio connection."""
    connection = async_adapter(conn, "axact_lock")
    request = Request.of(namespace, resource, wait, timeout, registry, events)
    return await execute(connection, take_xact(connection, "axact_lock", request))


@asynccontextmanager
async def asession_lock(
    conn: object,
    namespace: str,
    *resource: object,
    wait: bool = False,
    timeout: float | None = None,
    registry: Registry | None = None,
    events: Events | None = None,
) -> AsyncIterator[bool]:
    """:func:`session_lock` for an asyncio connection (a cancelled task unlocks too)."""
    connection = async_adapter(conn, "asession_lock")
    request = Request.of(namespace, resource, wait, timeout, registry, events)
    held = await execute(connection, take_session(connection, request))
    try:
        if held.in_savepoint:
            async with connection.savepoint():
                yield held.taken
        else:
            yield held.taken
    finally:
        if held.taken:
            await execute(connection, unlock(connection, request, held))
