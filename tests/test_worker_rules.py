"""The worker's rules as steps, without a server: what each rule asks of a connection in each
state, and what it does when a step fails (the drivers' tests run the same rules on real
servers)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lockdiag.keys import from_bigint, from_pair
from lockdiag.registry import Registry
from lockdiag.worker import Event, LockTimeout, NotInTransaction, State
from lockdiag.worker.rules import (
    Request,
    lock_statement,
    plan,
    take_session,
    take_xact,
    unlock,
    unlock_statement,
)
from lockdiag.worker.sync import execute


class Failed(Exception):
    def __init__(self, sqlstate: str = "XX000") -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class Scripted:
    """A connection whose state is given, whose statements answer from a script (a value, or
    an error to raise), and which records every step it is asked for."""

    driver, how_to_begin, if_unlock_failed = "scripted", "begin first", ""
    errors: tuple[type[BaseException], ...] = (Failed,)

    def __init__(self, state: State, *answers: object) -> None:
        self.current, self.answers, self.steps = state, list(answers), list[str]()

    def state(self) -> State:
        self.steps.append("state")
        return self.current

    def run(self, statement: str) -> object:
        self.steps.append(statement)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @contextmanager
    def savepoint(self) -> Iterator[object]:
        self.steps.append("savepoint")
        yield None

    def commit(self) -> None:
        self.steps.append("commit")

    def rollback(self) -> None:
        self.steps.append("rollback")


KEY = from_pair(4102, 73)


def request(events: list[Event], wait: bool = False, timeout: float | None = None) -> Request:
    return Request("tenant_summary", KEY, wait, timeout, Registry(), events.append)


def test_the_plan_by_state_and_kind() -> None:
    for kind in ("xact", "session", "unlock"):
        assert plan(kind, State.OPEN) == "savepoint"
        assert plan(kind, State.AUTOCOMMIT) == "alone"
    assert plan("xact", State.IDLE) == "alone, rolled back on failure"
    assert plan("session", State.IDLE) == "own transaction"
    assert plan("unlock", State.IDLE) == "own transaction"


def test_the_statements() -> None:
    assert lock_statement("xact", KEY, False, None) == (
        "SELECT pg_catalog.pg_try_advisory_xact_lock(CAST(4102 AS integer), CAST(73 AS integer))"
    )
    assert lock_statement("session", from_bigint(-5), True, None) == (
        "SELECT pg_catalog.pg_advisory_lock(CAST(-5 AS bigint))"
    )
    waiting = lock_statement("session", from_bigint(7), True, 0.0001)
    assert "'1ms'" in waiting and "OFFSET 0" in waiting  # never 0ms: that is no timeout at all
    assert unlock_statement(KEY).startswith("SELECT pg_catalog.pg_advisory_unlock(CAST(4102 ")


def test_a_transaction_lock_in_autocommit_is_refused_before_any_statement() -> None:
    events: list[Event] = []
    connection = Scripted(State.AUTOCOMMIT)
    with pytest.raises(NotInTransaction, match=r"xact_lock needs a transaction.*begin first"):
        execute(connection, take_xact(connection, "xact_lock", request(events)))
    assert connection.steps == ["state"] and events == []


@pytest.mark.parametrize(
    ("state", "steps"),
    [
        (State.OPEN, ["state", "state", "savepoint", "LOCK"]),
        (State.IDLE, ["state", "state", "LOCK"]),  # the caller's transaction begins: no commit
    ],
)
def test_a_transaction_lock_runs_as_planned(state: State, steps: list[str]) -> None:
    events: list[Event] = []
    connection = Scripted(state, False)
    assert execute(connection, take_xact(connection, "xact_lock", request(events))) is False
    assert [s if s.startswith(("state", "savepoint")) else "LOCK" for s in connection.steps] == (
        steps
    )
    assert [(e.what, e.result) for e in events] == [("attempt", "busy")]


def test_a_failed_lock_that_began_the_transaction_rolls_it_back_and_is_reported() -> None:
    events: list[Event] = []
    connection = Scripted(State.IDLE, Failed())
    with pytest.raises(Failed):
        execute(connection, take_xact(connection, "xact_lock", request(events)))
    assert connection.steps[-1] == "rollback"
    assert [(e.what, e.result) for e in events] == [("attempt", "error")]


def test_a_lock_timeout_is_lock_timeout_and_leaves_the_callers_transaction() -> None:
    events: list[Event] = []
    connection = Scripted(State.OPEN, Failed("55P03"))
    with pytest.raises(LockTimeout, match=r"tenant_summary \(4102, 73\): not granted within 2s"):
        execute(connection, take_xact(connection, "xact_lock", request(events, True, 2)))
    assert "rollback" not in connection.steps and "commit" not in connection.steps
    assert [(e.what, e.result) for e in events] == [("attempt", "timeout")]


def test_a_session_lock_where_a_transaction_would_begin_commits_its_own() -> None:
    events: list[Event] = []
    connection = Scripted(State.IDLE, True)
    held = execute(connection, take_session(connection, request(events)))
    assert held.taken and held.state is State.IDLE and not held.in_savepoint
    assert connection.steps[-2:] == ["commit", "state"]


def test_an_unlock_that_fails_in_a_transaction_the_block_began_rolls_back_and_retries() -> None:
    events: list[Event] = []
    connection = Scripted(State.IDLE, True, Failed(), True)
    held = execute(connection, take_session(connection, request(events)))
    execute(connection, unlock(connection, request(events), held))
    after = connection.steps[connection.steps.index("commit") + 2 :]
    unlocking = unlock_statement(KEY)
    assert after == ["state", unlocking, "rollback", "rollback", "state", unlocking, "commit"]
    assert [(e.what, e.result) for e in events] == [("attempt", "acquired"), ("release", "ok")]


@pytest.mark.parametrize("state", [State.OPEN, State.AUTOCOMMIT])
def test_an_unlock_that_fails_elsewhere_is_reported_not_retried(state: State) -> None:
    events: list[Event] = []
    connection = Scripted(state, True, Failed())
    held = execute(connection, take_session(connection, request(events)))
    assert held.in_savepoint is (state is State.OPEN)
    execute(connection, unlock(connection, request(events), held))
    assert connection.steps.count(unlock_statement(KEY)) == 1
    assert [(e.what, e.result) for e in events][-1] == ("release", "error")


def test_an_unlock_that_finds_nothing_is_counted() -> None:
    events: list[Event] = []
    connection = Scripted(State.AUTOCOMMIT, True, False)
    held = execute(connection, take_session(connection, request(events)))
    execute(connection, unlock(connection, request(events), held))
    assert [(e.what, e.result) for e in events][-1] == ("release", "not-held")


@pytest.mark.parametrize("void", ["", None])  # what a wait returns: psycopg "", asyncpg None
def test_a_wait_that_returns_is_taken(void: object) -> None:
    events: list[Event] = []
    connection = Scripted(State.AUTOCOMMIT, void)
    held = execute(connection, take_session(connection, request(events, wait=True)))
    assert held.taken and [(e.what, e.result) for e in events] == [("attempt", "acquired")]
