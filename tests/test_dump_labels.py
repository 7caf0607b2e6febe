"""A dump's labels made once per key space (views.common.Labels) are lock_label()'s, every one:
namespaces plain and of several parts, keys of well-known software, unregistered keys of both
forms with negative numbers, spans; and the plain dump of such a lock table is unchanged."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import LockRow
from lockdiag.registry import Registry, load_registry
from lockdiag.render import plain
from lockdiag.views.common import Labels, lock_label
from lockdiag.views.listing import list_output

from helpers.snapshots import session, snapshot

REGISTRY = Path(__file__).resolve().parent.parent / "examples" / "lockdiag.toml"
IDLE = timedelta(minutes=-10)  # idle since ten minutes before the snapshot


def _lock(pid: int, classid: int, objid: int, objsubid: int, keys: int = 1) -> LockRow:
    last = objid + keys - 1 if keys > 1 else None
    return LockRow(
        "advisory", 5, None, None, None, None, None, classid, objid, objsubid, f"{pid}/0", pid,
        "ExclusiveLock", True, None, None, keys, last,
    )  # fmt: skip


KEYS = [
    (4102, 73, 2),  # tenant_summary 73
    (4102, 2**32 - 5, 2),  # tenant_summary -5
    (7, 12, 1),  # invoice_export 12, bigint form
    (4103, 9, 2),  # tenant_period: a resource of parts
    (1, 1, 2),  # leader 1
    (0, 1, 1),  # a well-known key (a guess)
    (0, 123456, 1),  # unregistered bigint
    (2**32 - 1, 2**32 - 2, 1),  # unregistered bigint -2
    (2**31, 5, 1),  # unregistered bigint, the lowest word of the most negative
    (99, 2**32 - 1, 2),  # unregistered pair (99, -1)
    (2**32 - 7, 2**31, 2),  # unregistered pair (-7, -2147483648)
]


def test_labels_are_lock_labels() -> None:
    registry = load_registry(str(REGISTRY))
    locks = [_lock(10 + n % 3, *key) for n, key in enumerate(KEYS)]
    locks.append(_lock(11, 4102, 100, 2, keys=50))  # a span of an aggregated read
    taken = snapshot([session(pid, "idle", IDLE) for pid in (10, 11, 12)], locks)
    for names in (registry, Registry()):
        diagnosis = Diagnosis(taken, names)
        labels = Labels()
        assert len(diagnosis.entries) == len(locks)
        for entry in diagnosis.entries:
            assert labels.of(entry, taken.server) == lock_label(entry, taken.server)
            assert labels.of(entry, taken.server) == lock_label(entry, taken.server)  # cached


def test_plain_dump_of_many_keys() -> None:
    """The text around the numbers, made once, gives every line its whole label."""
    registry = load_registry(str(REGISTRY))
    locks = [_lock(10, 4102, n, 2) for n in range(2**32 - 300, 2**32)]
    locks += [_lock(10, 0, 2**32 - n, 1) for n in range(1, 300)]
    locks += [_lock(11, 7, n, 1) for n in range(300)]
    taken = snapshot([session(10, "idle", IDLE), session(11, "active", IDLE)], locks)
    text = plain(list_output(Diagnosis(taken, registry).listing()).blocks())
    assert "tenant_summary -300 " in text and "tenant_summary -1 " in text
    assert "unregistered bigint 4294967295 " in text  # classid 0: a positive bigint
    assert "invoice_export 299 " in text
    rows = text.splitlines()[1 : 1 + len(locks)]
    assert len({row.split("  ")[0] for row in rows}) == len(locks)
