"""lockdiag as a library: the names its Python API documents (docs/reference/python-api.md).

One import for a script or a notebook, as sqlite-utils documents its library beside its CLI.
The names re-exported here are the documented ones; the modules they come from are lockdiag's
layout and may move.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockdiag.core import snapshot_file
from lockdiag.core.analysis import Decoded, Filters, Flag, LockEntry, Policy
from lockdiag.core.catalogue import Known, Software
from lockdiag.core.diagnosis import Diagnosis, ListReport, WhoHolds
from lockdiag.core.findings import CheckPolicy, Finding, Threshold
from lockdiag.core.incident import Cause, Contended, Incident
from lockdiag.core.model import LockRow, ServerInfo, Session, Snapshot
from lockdiag.core.ownership import Ownership
from lockdiag.errors import InputError, LockdiagError, ServerError
from lockdiag.evidence import take_snapshot
from lockdiag.keys import AdvisoryTag, LockTriple, from_bigint, from_pair
from lockdiag.pg.session import DiagnosticSession
from lockdiag.registry import Namespace, Registry, RegistryError, load_registry

__all__ = [
    "AdvisoryTag",
    "Cause",
    "CheckPolicy",
    "Contended",
    "Decoded",
    "Diagnosis",
    "DiagnosticSession",
    "Filters",
    "Finding",
    "Flag",
    "Incident",
    "InputError",
    "Known",
    "ListReport",
    "LockEntry",
    "LockRow",
    "LockTriple",
    "LockdiagError",
    "Namespace",
    "Ownership",
    "Policy",
    "Registry",
    "RegistryError",
    "ServerError",
    "ServerInfo",
    "Session",
    "Snapshot",
    "Software",
    "Threshold",
    "WhoHolds",
    "from_bigint",
    "from_pair",
    "load_registry",
    "load_snapshot",
    "save_snapshot",
    "take_snapshot",
]


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """A snapshot file saved by ``lockdiag snapshot`` (or :func:`save_snapshot`); any problem
    is an InputError naming the file and the place."""
    return snapshot_file.load(Path(path))


def save_snapshot(snapshot: Snapshot, path: str | os.PathLike[str]) -> None:
    """Write a snapshot file that ``lockdiag ... --from`` and :func:`load_snapshot` read."""
    snapshot_file.save(snapshot, Path(path))
