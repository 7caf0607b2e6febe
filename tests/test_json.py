"""The fast JSON path (orjson, fields shared per backend encoded once) gives exactly the
document the plain encoder gives: the same keys in the same order and the same values, on the
bundled incident and on a generated lock table of 10,000 locks."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import LockRow, ServerInfo, Session, Snapshot
from lockdiag.registry import Registry, load_registry
from lockdiag.render import render
from lockdiag.views.common import entry_data
from lockdiag.views.listing import list_output

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)


def generated(locks: int = 10_000) -> Snapshot:
    sessions = [
        Session(
            pid,
            "app",
            "worker",
            f"w{pid}" if pid % 2 else "50% \\u0000 done",  # a template's marks, as text
            "10.0.0.1",
            5000 + pid,
            NOW - timedelta(hours=1),
            None,
            None,
            NOW - timedelta(minutes=pid),
            "idle",
            None,
            None,
            "client backend",
            None,
            "select 1",
        )
        for pid in range(100, 140)
    ]
    rows = [
        LockRow(
            "advisory",
            5,
            None,
            None,
            None,
            None,
            None,
            4102 if n % 2 else 0,
            n,
            2 if n % 2 else 1,
            f"{100 + n % 40}/0",
            100 + n % 40,
            "ExclusiveLock",
            True,
        )
        for n in range(locks)
    ]
    waiter = Session(200, "app", "worker", "waiting \u00e9", None, None, NOW, NOW, NOW, NOW,
                     "active", "Lock", "advisory", "client backend", None, "select 2")  # fmt: skip
    rows.append(LockRow("advisory", 5, None, None, None, None, None, 4102, 1, 2, "7/1", 200,
                        "ExclusiveLock", False, NOW - timedelta(seconds=3), (101,)))  # fmt: skip
    server = ServerInfo(150000, NOW, "postgres", 1, False, True, {5: "app"}, "app")
    return Snapshot(server, "generated", "advisory",
                    {s.pid: s for s in [*sessions, waiter]}, rows)  # fmt: skip


def both(snapshot: Snapshot, registry: Registry) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    listing = Diagnosis(snapshot, registry).listing()
    reference = [json.loads(json.dumps(entry_data(e), ensure_ascii=False)) for e in listing.entries]
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    render(list_output(listing), "json", out)
    out.flush()
    document: dict[str, Any] = json.loads(out.buffer.getvalue())
    return reference, document


def test_the_bundled_incident() -> None:
    registry = load_registry(str(ROOT / "examples" / "lockdiag.toml"))
    reference, document = both(snapshot_file.load(ROOT / "examples" / "incident.json"), registry)
    assert document["locks"] == reference
    assert [list(item) for item in document["locks"]] == [list(item) for item in reference]


def test_a_generated_table_of_ten_thousand_locks() -> None:
    for registry in (Registry(), load_registry(str(ROOT / "examples" / "lockdiag.toml"))):
        reference, document = both(generated(), registry)
        assert len(reference) == 10_001
        assert document["locks"] == reference
        assert [list(item) for item in document["locks"]] == [list(item) for item in reference]
    assert {lock["namespace"] for lock in document["locks"]} == {None, "tenant_summary"}
    assert '"50% \\\\u0000 done"' in json.dumps([lock["application_name"] for lock in reference])
