"""`lockdiag sample`'s input built by hand: sessions and advisory locks at each sample's instant,
a step apart from START, analysed as the sampler reads them, so timing is exact."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from lockdiag.core.analysis import LockEntry
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.model import LockRow, ServerInfo, Session, Snapshot
from lockdiag.core.observe import Sampler

from helpers.registry import parsed_registry

START = datetime(2026, 12, 1, 3, 0, 0, tzinfo=timezone.utc)  # the first sample's server time
STEP = timedelta(milliseconds=250)

REGISTRY = parsed_registry(
    "[namespaces.tenant_summary]\nid = 4102\n\n[namespaces.jobs]\nid = 4300\n\n"
    "[namespaces.invoice_pdf_export]\nid = 4200\n"
)


def lock(
    pid: int, namespace: int, key: int, waiting_since: datetime | None = None, by: int = 0
) -> LockRow:
    """An exclusive advisory lock (namespace, key) held by ``pid``, or waited for since
    ``waiting_since`` behind ``by``."""
    granted = waiting_since is None
    return LockRow(
        "advisory", 5, None, None, None, None, None, namespace, key, 2, f"{pid}/0", pid,
        "ExclusiveLock", granted, waiting_since, None if granted else (by,),
    )  # fmt: skip


def session(pid: int, state: str, since: datetime, name: str = "app") -> Session:
    """A client backend named ``name`` in ``state`` since ``since`` (its query too)."""
    return Session(
        pid, "app", "worker", name, backend_start=START - timedelta(hours=1),
        query_start=since, state_change=since, state=state, backend_type="client backend",
        query="q",
    )  # fmt: skip


def entries(now: datetime, sessions: list[Session], locks: list[LockRow]) -> list[LockEntry]:
    """The advisory lock entries of a snapshot taken at ``now``, analysed with REGISTRY."""
    server = ServerInfo(150000, now, "postgres", 1, False, True, {5: "app"}, "app")
    snapshot = Snapshot(server, "test", "advisory", {s.pid: s for s in sessions}, locks)
    return Diagnosis(snapshot, REGISTRY).advisory


def sampled(snapshots: list[tuple[list[Session], list[LockRow]]]) -> Sampler:
    """A sampler fed ``snapshots`` in order, one STEP apart from START."""
    sampler = Sampler()
    for number, (people, locks) in enumerate(snapshots):
        now = START + number * STEP
        sampler.add(entries(now, people, locks), now, 0.001)
    return sampler


def stuck_owner(samples: int = 8) -> list[tuple[list[Session], list[LockRow]]]:
    """tenant_summary 2, the namespace's only key: its holder idle for a minute, three
    sessions waiting behind it for 5s."""
    since = START - timedelta(seconds=5)
    people = [session(10, "idle", START - timedelta(minutes=1), "owner")]
    people += [session(pid, "active", since, f"waiter-{pid}") for pid in (11, 12, 13)]
    locks = [lock(10, 4102, 2)] + [lock(pid, 4102, 2, since, by=10) for pid in (11, 12, 13)]
    return [(people, locks)] * samples
