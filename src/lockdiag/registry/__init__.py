"""The registry file: the team's names for advisory-lock numbers, shared by workers and the CLI.

Workers import this package to take locks by name, so it stays light (no psycopg, no click)::

    from lockdiag.registry import load_registry

    registry = load_registry()                      # --registry rules, see find_registry()
    key = registry.key("tenant_summary", 73)
    cursor.execute(f"SELECT pg_try_advisory_xact_lock({key.placeholders})", key.args)

Its rooms: :mod:`.model` (what a registry holds), :mod:`.discovery` (where the file is, and
loading it), :mod:`.validation` (reading and checking the file).
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
    UNREGISTERED_LEVELS,
    AdvisoryKey,
    Candidates,
    Expect,
    Namespace,
    Poolers,
    Registry,
    UnknownNamespace,
    Unregistered,
)
from lockdiag.registry.validation import (
    MAX_DEPTH,
    MAX_SIZE,
    BinaryData,
    Collisions,
    Problem,
    check_file,
    contradictions,
    nesting_depth,
    parse_registry,
    read_bounded,
    resource_collisions,
    size_text,
)

__all__ = [
    "ENV_VAR",
    "FILE_NAME",
    "MAX_DEPTH",
    "MAX_SIZE",
    "UNREGISTERED_LEVELS",
    "AdvisoryKey",
    "BinaryData",
    "Candidates",
    "Collisions",
    "Expect",
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
    "find_registry",
    "load_registry",
    "nesting_depth",
    "parse_registry",
    "read_bounded",
    "resource_collisions",
    "size_text",
]
