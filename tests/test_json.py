"""The fast JSON path (orjson, fields shared per backend encoded once) gives exactly the
document the plain encoder gives: the same keys in the same order and the same values, on the
bundled incident and on a generated lock table of 10,000 locks."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import Snapshot
from lockdiag.registry import Registry, load_registry
from lockdiag.render import render
from lockdiag.views.common import entry_data
from lockdiag.views.listing import list_output

from helpers.snapshots import generated

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)


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
