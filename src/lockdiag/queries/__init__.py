"""SQL files, one query per file, chosen by server version.

``VERSIONS`` maps a query name to ``(minimum server_version_num, file)`` pairs; the newest file
whose minimum the server meets is used. Comparisons use ``>=`` only.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from lockdiag.errors import ServerError

OLDEST_SUPPORTED = 140000

VERSIONS: dict[str, list[tuple[int, str]]] = {
    "snapshot": [(140000, "snapshot_post_140000.sql")],
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


@cache
def load(file_name: str) -> str:
    return (files(__package__) / file_name).read_text(encoding="utf-8")


def query(name: str, server_version_num: int) -> str:
    return load(query_file(name, server_version_num))


def format_version(server_version_num: int) -> str:
    major, minor = divmod(server_version_num, 10000)
    return f"{major}.{minor}" if major >= 10 else f"{major}.{minor // 100}.{minor % 100}"
