"""`lockdiag pooltest`: each scenario, what a safe pool gives, what was observed."""

from __future__ import annotations

from typing import Any

from lockdiag.core.pooltest import ADVICE, Result
from lockdiag.render import Block, Output, Table, Text

# -- pooltest ----------------------------------------------------------------------------------


def pooltest_output(results: list[Result], left: int) -> Output:
    unsafe = [r for r in results if r.verdict == "unsafe"]
    inconclusive = [r for r in results if r.verdict == "inconclusive"]

    def blocks() -> list[Block]:
        rows = [
            [r.scenario, r.safe, r.observed, "ok" if r.ok else r.verdict.upper()] for r in results
        ]
        out: list[Block] = [
            Table(
                ["SCENARIO", "A SAFE SETUP GIVES", "OBSERVED", "VERDICT"],
                rows,
                wide={1, 2},
                essential={0, 3},
            ),
        ]
        if inconclusive:
            note = (
                f"{len(inconclusive)} scenario(s) inconclusive: worker A never got the lock, so "
                "they say nothing about the pool"
            )
            out.append(Text([note], "warning"))
        if unsafe:
            summary = (
                f"{len(unsafe)} unsafe behaviour(s): advisory locks through this pool do not "
                "protect what they should."
            )
            out.append(Text([summary], "error"))
            out.append(Text([f"- {line}" for line in ADVICE]))
        elif not inconclusive:
            out.append(Text(["every scenario behaved safely"], "verdict"))
        if left:
            out.append(Text([f"{left} holder(s) of the test key could not be released"], "error"))
        return out

    def data() -> dict[str, Any]:
        return {
            "safe": not unsafe and not inconclusive and not left,
            "results": [
                {
                    "scenario": r.scenario,
                    "safe": r.safe,
                    "observed": r.observed,
                    "ok": r.ok,
                    "verdict": r.verdict,
                }
                for r in results
            ],
            "left_behind": left,
            "advice": ADVICE if unsafe else [],
        }

    return Output(blocks, data)
