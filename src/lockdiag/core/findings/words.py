"""How findings name what they are about: a holder, a lock's label, a backend's locks as one
group and how many locks it stands for, and durations claiming no more than was seen."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from lockdiag.core.analysis import LockEntry
from lockdiag.core.model import ServerInfo, describe_lock
from lockdiag.durations import format_duration


def who(entry: LockEntry) -> str:
    session = entry.session
    name = f" ({session.application_name})" if session and session.application_name else ""
    return f"pid {entry.lock.pid}{name}"


def label(entry: LockEntry, server: ServerInfo | None = None) -> str:
    """The lock's name: decoded for an advisory lock; a relation by name where the snapshot
    can tell it (``server``), else in pg_locks' own terms."""
    if entry.decoded is not None:  # a span's: its lowest key's, as the full read's first
        return entry.decoded.first_keys(1)[0].label
    tag = entry.lock.advisory_tag  # an extension's: its numbers (a span's: its lowest's)
    if tag is not None:
        return tag.label
    return describe_lock(entry.lock, server) if server is not None else entry.lock.locktype


def by_backend(entries: Iterable[LockEntry], by_namespace: bool = False) -> list[list[LockEntry]]:
    """Locks grouped by backend (and namespace), in order. A backend holding thousands of
    locks is one finding, not thousands: its locks share the lower bound of their age."""
    groups: dict[tuple[object, ...], list[LockEntry]] = {}
    for entry in entries:
        namespace = entry.decoded.namespace if by_namespace and entry.decoded else None
        groups.setdefault((entry.lock.pid, id(namespace)), []).append(entry)
    # the locks others wait for first (most waiters first): a group is named by its first
    return [sorted(group, key=lambda e: -len(e.blocks)) for group in groups.values()]


def locks_in(group: list[LockEntry]) -> int:
    """How many locks a group's entries stand for: a span (LockRow.keys) counts its every
    lock, so an aggregated read counts as the full read does."""
    return sum(map(_KEYS, group))  # in C: a dump counts a hundred thousand entries


_KEYS = attrgetter("lock.keys")


def labels(group: list[LockEntry]) -> str:
    """The first lock's label, and how many more."""
    more = locks_in(group) - group[0].lock.keys
    return label(group[0]) + (f" (+{more} more)" if more else "")


def listed(group: list[LockEntry], shown: int = 3) -> str:
    """For evidence: the first few labels of a group of more than one lock."""
    if len(group) == 1 and group[0].lock.keys == 1:
        return ""
    names: list[str] = []
    for entry in group:  # a span's keys as the full read's rows (Decoded.first_keys)
        if len(names) == shown:
            break
        if entry.decoded is None:
            names.append(label(entry))
        else:
            names += [d.label for d in entry.decoded.first_keys(shown - len(names))]
    more = locks_in(group) - len(names)
    return f": {', '.join(names)}" + (f" and {more} more" if more else "")


def held_words(entry: LockEntry) -> str:
    """How long a lock has been held at least, and which bound that is, claiming no more than
    was seen: ``5m (seen held at every look since 10:02:07)``, or the state bound's figure."""
    seen, held = entry.seen, entry.held_for
    if held is None:
        return "a time not known"
    if seen is None or held != seen.seconds or held == entry.held_at_least:
        return format_duration(held)
    busy = "; it ran statements between looks: maybe released and retaken" if seen.busy else ""
    return f"{format_duration(held)} (seen held at every look since {seen.since:%H:%M:%S}{busy})"


def figures(held: float | None, waited: float | None) -> str | None:
    """Where a holder's lower bound is far below its oldest waiter's wait, what each figure
    means: both are true, and side by side without a word they read as a contradiction. The
    holder is not dated by the queue: a session queued ahead of a waiter may have been granted
    after that waiter began to wait (A holds, B and C wait; A ends: B's lock is younger than
    C's wait)."""
    if held is None or waited is None or waited < 2 * held + 1.0:
        return None
    return (
        f"held ≥ {format_duration(held)} counts from the holder's last change of state, "
        f"as PostgreSQL records no lock time; its oldest waiter has waited "
        f"{format_duration(waited)}: the lock has been taken that long, by this session or "
        "by one before it"
    )
