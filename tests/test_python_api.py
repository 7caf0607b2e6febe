"""docs/reference/python-api.md runs: every ``python`` block, in order, in one namespace, from
the repository root, prints exactly the ``text`` block that follows it (and nothing when none
follows), so the page cannot drift from the library."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from lockdiag.demo.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "python-api.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def examples(text: str) -> list[tuple[str, str]]:
    """Each python block with the text block right after it ("" when there is none)."""
    fences = list(FENCE.finditer(text))
    found: list[tuple[str, str]] = []
    for index, fence in enumerate(fences):
        if fence.group(1) != "python":
            continue
        after = fences[index + 1] if index + 1 < len(fences) else None
        follows = (
            after is not None
            and after.group(1) == "text"
            and not text[fence.end() : after.start()].strip()
        )
        found.append((fence.group(2), after.group(2) if after is not None and follows else ""))
    return found


def test_the_page_has_examples_and_says_what_each_prints() -> None:
    found = examples(PAGE.read_text())
    assert len(found) >= 8
    assert sum(1 for _, printed in found if printed) == len(found)


def test_every_python_block_prints_what_the_page_says(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    # the live-server block connects with libpq's environment, to the tests' own server
    for name, value in {"PGHOST": "127.0.0.1", "PGPORT": str(cluster.port),
                        "PGUSER": "postgres", "PGDATABASE": "postgres"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    namespace: dict[str, object] = {"__name__": "python_api_page"}
    for number, (code, expected) in enumerate(examples(PAGE.read_text()), start=1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            block = compile(code, f"{PAGE.name} block {number}", "exec")
            exec(block, namespace)  # noqa: S102 - the repository's own page is what is tested
        assert printed.getvalue() == expected, f"block {number}:\n{code}"
