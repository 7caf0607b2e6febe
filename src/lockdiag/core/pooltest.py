"""Judging `lockdiag pooltest`: what a safe pool gives in each scenario, and what was observed.

Pure: the scenarios are run by :mod:`lockdiag.pg.pooltest`, which records an
:class:`Observation` for each; :func:`verdict` compares it with what a safe setup gives. A
scenario whose worker A never got the lock says nothing about the pool: it is inconclusive,
with A's error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LockKind = Literal["session", "xact"]
Verdict = Literal["ok", "unsafe", "inconclusive"]

ENDINGS = {
    "commit": "commits",
    "rollback": "rolls back",
    "exception": "raises an exception",
    "cancel": "is cancelled",
    "disconnect": "disconnects without unlocking",
}

ADVICE = [
    "Use transaction-level locks (pg_advisory_xact_lock, pg_try_advisory_xact_lock) behind a "
    "transaction pooler: they end with the transaction that took them.",
    "Or route lock-taking workers through session pooling (pool_mode = session), where "
    "DISCARD ALL releases session locks when the client leaves.",
    "Or set server_reset_query_always = 1 in transaction pooling: session locks are then "
    "released at every transaction end (so they no longer protect anything beyond one).",
]


@dataclass(frozen=True)
class Result:
    scenario: str
    safe: str  # what a safe setup gives
    observed: str
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


@dataclass(frozen=True)
class Observation:
    """What happened when worker A took the test key and ended one way (see ENDINGS): how
    many backends held it after the ending, what worker B got while A's client was still
    connected, how many held it once A's client had left, and what a new client C got."""

    kind: LockKind
    ending: str
    a_took: bool
    a_error: str | None
    held_after_end: int
    b_got: bool
    held_after_gone: int
    c_got: bool


def verdict(seen: Observation) -> Result:
    scenario = f"{seen.kind} lock, A {ENDINGS[seen.ending]}"
    client_still_there = seen.ending != "disconnect"
    if seen.kind == "session" and client_still_there:
        safe = "B gets false (A's session still owns it); freed once A's client leaves"
    else:
        safe = "B gets true (released); nothing held once A's client leaves"
    if not seen.a_took:
        reason = seen.a_error or "the lock function returned no row"
        return Result(scenario, safe, f"A never got the lock: {reason}", "inconclusive")
    false_success = seen.c_got and seen.held_after_gone > 0
    if seen.kind == "session" and client_still_there:
        ok = not seen.b_got and seen.held_after_gone == 0 and not false_success
    else:
        ok = seen.b_got and seen.held_after_gone == 0 and not false_success
    observed = (
        f"held after A's {seen.ending}: {seen.held_after_end}; B got {str(seen.b_got).lower()}; "
        f"held after A left: {seen.held_after_gone}"
    )
    if seen.a_error:
        observed += f"; A's ending raised: {seen.a_error}"
    if false_success:
        observed += "; new client C got a false success (re-entered the leaked lock)"
    return Result(scenario, safe, observed, "ok" if ok else "unsafe")


def contention_verdict(a_took: bool, b_got: bool, a_error: str | None = None) -> Result:
    """A holds a session lock and stays connected; B tries the same key."""
    scenario = "session lock, A connected: B tries the same key"
    safe = "B gets false (contention seen)"
    if not a_took:
        return Result(scenario, safe, f"A never got the lock: {a_error or 'false'}", "inconclusive")
    observed = f"A got true, B got {str(b_got).lower()}" + (
        " (re-entered A's server connection)" if b_got else ""
    )
    return Result(scenario, safe, observed, "unsafe" if b_got else "ok")


def independent_verdict(a_got: bool, b_got: bool, error: str | None = None) -> Result:
    """Two different keys, both in transactions at once, must both be granted."""
    scenario = "two different keys at once (transaction locks)"
    if error:
        return Result(scenario, "both granted", f"not run: {error}", "inconclusive")
    both = a_got and b_got
    observed = "both granted" if both else f"A {str(a_got).lower()}, B {str(b_got).lower()}"
    return Result(scenario, "both granted", observed, "ok" if both else "unsafe")
