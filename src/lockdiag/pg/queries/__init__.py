"""Every SQL text lockdiag sends, one query per file, chosen by server version.

``VERSIONS`` maps a query name to ``(minimum server_version_num, file)`` pairs; the newest file
whose minimum the server meets is used. Comparisons use ``>=`` only. Each file opens with a
comment saying which versions it serves and why. A test checks that every file is listed and
every listed file exists.

It may import ``lockdiag.core.model`` (version numbers) and ``lockdiag.errors``; the SQL
files are package data.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from lockdiag.core.model import OLDEST_SUPPORTED, format_version
from lockdiag.errors import ServerError

# the names grouped a line a purpose (enrichment, names, actions, pooltest): kept as grouped
# fmt: off
_SAME_FOR_ALL = (
    "enrich_hashtext",
    "relation_names", "database_names",
    "signal_backend", "backend_alive", "trust_tables", "probe_activity",
    "pooltest_holders", "pooltest_lock", "pooltest_probe",
)
# fmt: on

VERSIONS: dict[str, list[tuple[int, str]]] = {
    "snapshot": [(140000, "snapshot_post_140000.sql")],
    "snapshot_aggregated": [(140000, "snapshot_aggregated_post_140000.sql")],
    **{name: [(OLDEST_SUPPORTED, f"{name}.sql")] for name in _SAME_FOR_ALL},
}


def query_file(name: str, server_version_num: int) -> str:
    """The file serving ``name`` on that server version."""
    candidates = [f for minimum, f in sorted(VERSIONS[name]) if server_version_num >= minimum]
    if not candidates:
        raise ServerError(
            f"PostgreSQL {format_version(server_version_num)} is not supported: "
            f"lockdiag needs PostgreSQL {format_version(OLDEST_SUPPORTED)} or later"
        )
    return candidates[-1]


# where the files are, found at load: the first files() imports importlib's readers, which a
# read would otherwise import while another thread imports (lockdiag.evidence.overlap)
HERE = files(__package__)


@cache
def load(file_name: str) -> str:
    return (HERE / file_name).read_text(encoding="utf-8")


def query(name: str, server_version_num: int = OLDEST_SUPPORTED) -> str:
    return load(query_file(name, server_version_num))
