"""Snapshot files' numbers: every integer field within its real range (the server's column:
oids 32 bits unsigned, pids int4, objsubid a lock tag's 16-bit field...), a number outside
refused with one line naming the field, exit 2 (check: 3), never a traceback (orjson refuses
an integer past 64 bits; json.loads one past int()'s 4300 digits)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lockdiag.cli import cli
from lockdiag.core import snapshot_file
from lockdiag.errors import InputError

from helpers.cli import refused
from helpers.paths import INCIDENT

FAST = settings(max_examples=40)

# an advisory lock of examples/incident.json and its holder: (section, field, lowest, highest)
RANGES = [
    ("locks", "pid", 0, 2**31 - 1),
    ("locks", "database", 0, 2**32 - 1),
    ("locks", "relation", 0, 2**32 - 1),
    ("locks", "classid", 0, 2**32 - 1),
    ("locks", "objid", 0, 2**32 - 1),
    ("locks", "objid_last", 0, 2**32 - 1),
    ("locks", "objsubid", -(2**15), 2**16 - 1),
    ("locks", "page", -(2**31), 2**31 - 1),
    ("locks", "tuple", -(2**15), 2**15 - 1),
    ("locks", "keys", 1, 2**31 - 1),
    ("locks", "blocked_by", 0, 2**31 - 1),
    ("sessions", "pid", 0, 2**31 - 1),
    ("sessions", "leader_pid", 0, 2**31 - 1),
    ("sessions", "client_port", -1, 2**16 - 1),
    ("sessions", "backend_xid", 0, 2**32 - 1),
    ("server", "backend_pid", 0, 2**31 - 1),
    ("server", "version_num", 0, 2**31 - 1),
    ("derived", "key", -(2**63), 2**63 - 1),
    ("pool", "pid", 0, 2**31 - 1),
]


def _with(section: str, field: str, value: Any) -> str:
    """examples/incident.json with one integer field of its first advisory lock (or its first
    session, its server, a derived key, a pool link) set to ``value``."""
    document = json.loads(INCIDENT.read_text())
    if section == "server":
        document["server"][field] = value
        return json.dumps(document)
    if section == "derived":
        document["derived"] = [{"database": None, "key": value, "form": "bigint",
                                "software": "x", "meaning": "y"}]  # fmt: skip
    elif section == "pool":
        document["pool"] = [{"pid": value, "pooler": "p:6432", "pool": "shop/app",
                             "pool_mode": "transaction", "server_state": "idle", "client": None,
                             "client_application": None, "via": "console"}]  # fmt: skip
    else:
        items = document[section]
        item = next(i for i in items if section != "locks" or i["locktype"] == "advisory")
        item[field] = [value] if field == "blocked_by" else value
        if field == "objid_last":
            item["keys"] = 2
    return json.dumps(document)


@pytest.mark.parametrize(("section", "field", "low", "high"), RANGES)
def test_an_integer_outside_its_field_s_range_is_refused_by_name(
    section: str, field: str, low: int, high: int
) -> None:
    """Each integer field of a snapshot file within its real range (the server's column:
    oids 0..2^32-1, pids int4, objsubid a 16-bit field...), its ends accepted, the next
    numbers refused naming the field; a number past 64 bits reached orjson, a TypeError."""
    for value in (low, high):
        snapshot_file.loads(_with(section, field, value), "f.json")
    where = f"{section}[0].{field}" if section in ("pool", "derived") else field
    for value in (low - 1, high + 1, 2**64, -(2**70)):
        with pytest.raises(InputError, match=re.escape(where)) as refusal:
            snapshot_file.loads(_with(section, field, value), "f.json")
        assert f"is outside {low}..{high}" in str(refusal.value)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("pid", 2**64, "locks[9].pid: 18446744073709551616 is outside 0..2147483647"),
        ("classid", 2**70, "classid: 1180591620717411303424 is outside 0..4294967295"),
        ("keys", 0, "keys: 0 is outside 1..2147483647"),
        ("objid", 10**60, "objid: 10000000000000000000... (61 digits) is outside"),
    ],
)
def test_the_commands_refuse_a_number_out_of_range_with_one_line(
    tmp_path: Path, field: str, value: int, reason: str
) -> None:
    """list, blockers and check --format json: a pid past 64 bits was a TypeError traceback
    from orjson (check: exit 3 'internal error')."""
    path = tmp_path / "f.json"
    path.write_text(_with("locks", field, value))
    for command in ("list --format json", "blockers --format json", "check --format json"):
        refused(
            CliRunner().invoke(cli, [*command.split(), "--from", str(path)]),
            str(path),
            reason,
            3 if command.startswith("check") else 2,
        )


def test_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    """json.loads refuses an integer past int()'s 4300 digits with a ValueError: a traceback
    before (list, blockers, who-holds; check: 'internal error'), in a snapshot file and in a
    recording."""
    path = tmp_path / "f.json"
    path.write_text(_with("locks", "objid", 0).replace('"objid": 0', '"objid": ' + "9" * 5000))
    for command in ("list", "check"):
        refused(
            CliRunner().invoke(cli, [command, "--from", str(path)]),
            str(path),
            "not a snapshot file: an integer of more than 4300 digits",
            3 if command == "check" else 2,
        )
    recording = tmp_path / "watch.jsonl"
    line = json.dumps(json.loads(_with("locks", "pid", 7)), separators=(",", ":"))
    recording.write_text(line.replace('"pid":7,', '"pid":' + "1" * 5000 + ",", 1) + "\n")
    refused(
        CliRunner().invoke(cli, ["watch", "--once", "--from", str(recording)]),
        f"{recording}:1",
        "an integer of more than 4300 digits",
    )


@FAST
@given(st.sampled_from(RANGES), st.integers())
def test_any_integer_in_any_field_is_read_or_refused_with_one_line(
    where: tuple[str, str, int, int], value: int
) -> None:
    section, field, low, high = where
    try:
        snapshot_file.loads(_with(section, field, value), "f.json")
    except InputError as error:
        assert "\n" not in str(error) and not low <= value <= high
    else:
        assert low <= value <= high
