"""The registry file: the team's names for advisory-lock numbers, shared by workers and the CLI.

Workers import this package to take locks by name, so it stays light (no psycopg, no click)::

    from lockdiag.registry import load_registry

    registry = load_registry()                      # --registry rules, see find_registry()
    key = registry.key("tenant_summary", 73)
    cursor.execute(f"SELECT pg_try_advisory_xact_lock({key.placeholders})", key.args)

Its rooms, each importing only those before it: :mod:`.model` (what a registry holds),
:mod:`.reading` (reading a file that may come from anywhere, with bounds: shared by every file
reader of lockdiag), :mod:`.namespaces` (one namespace's table), :mod:`.validation` (the file
as a whole: its TOML, its top-level tables, the checks between namespaces, each problem on its
line), :mod:`.discovery` (where the file is, and loading it). It imports only ``keys``,
``durations`` and ``errors``.
"""

from lockdiag.registry.discovery import (
    ENV_VAR,
    RegistryError,
    config_dir,
    find_registry,
    load_registry,
)
from lockdiag.registry.model import (
    FILE_NAME,
    KNOWN_LISTS,
    UNREGISTERED_LEVELS,
    AdvisoryKey,
    Candidates,
    Expect,
    KnownList,
    Namespace,
    Poolers,
    Registry,
    UnknownNamespace,
    Unregistered,
    declare_list,
    withdraw_list,
)
from lockdiag.registry.reading import (
    MAX_DEPTH,
    BinaryData,
    nesting_depth,
    read_bounded,
    size_text,
)
from lockdiag.registry.validation import (
    MAX_SIZE,
    Collisions,
    Problem,
    check_file,
    contradictions,
    parse_registry,
    resource_collisions,
)

__all__ = [
    "ENV_VAR",
    "FILE_NAME",
    "KNOWN_LISTS",
    "MAX_DEPTH",
    "MAX_SIZE",
    "UNREGISTERED_LEVELS",
    "AdvisoryKey",
    "BinaryData",
    "Candidates",
    "Collisions",
    "Expect",
    "KnownList",
    "Namespace",
    "Poolers",
    "Problem",
    "Registry",
    "RegistryError",
    "UnknownNamespace",
    "Unregistered",
    "check_file",
    "config_dir",
    "contradictions",
    "declare_list",
    "find_registry",
    "load_registry",
    "nesting_depth",
    "parse_registry",
    "read_bounded",
    "resource_collisions",
    "size_text",
    "withdraw_list",
]
