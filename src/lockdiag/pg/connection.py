"""Connection parameters and messages shared by every connection lockdiag opens: the
diagnostic session's settings, libpq's connect timeout, and password-free one-line errors.
"""

from __future__ import annotations

import math
import os
import re

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockdiag.errors import InputError

APPLICATION_NAME = "lockdiag"


def connect_timeout(timeout: float) -> str:
    """libpq's connect_timeout (whole seconds, at least 2: libpq treats 1 as 2 anyway)."""
    return str(max(2, math.ceil(timeout)))


def session_settings(timeout: float) -> dict[str, str]:
    """lockdiag's settings for its own session, as pg_settings shows them when in force."""
    milliseconds = max(1, int(timeout * 1000))
    return {
        "statement_timeout": str(milliseconds),
        "lock_timeout": str(milliseconds),
        "idle_in_transaction_session_timeout": str(max(milliseconds * 2, 10000)),
        "default_transaction_read_only": "on",
        # every name lockdiag uses resolves in pg_catalog, never in a user's schema
        "search_path": "pg_catalog",
        # a table whose row-level security would filter a query makes it fail instead of
        # running a policy's code (a user's function) in lockdiag's session
        "row_security": "off",
    }


def session_options(timeout: float) -> str:
    """Server settings sent in the startup packet, so they bind the very first statement."""
    return " ".join(f"-c {name}={value}" for name, value in session_settings(timeout).items())


def conninfo(dsn: str | None, timeout: float) -> str:
    """The user's DSN (or libpq's environment) with lockdiag's safety settings added."""
    try:
        given = conninfo_to_dict(dsn or "")
    except psycopg.ProgrammingError as error:  # raised by libpq's parser
        raise InputError(f"invalid connection string: {scrub(str(error), dsn)}") from None
    user_options = str(given.get("options") or "")
    return make_conninfo(
        dsn or "",
        application_name=APPLICATION_NAME,
        connect_timeout=connect_timeout(timeout),
        options=f"{user_options} {session_options(timeout)}".strip(),
    )


def one_line(message: str) -> str:
    return "; ".join(part.strip() for part in message.strip().splitlines() if part.strip())


def scrub(message: str, dsn: str | None) -> str:
    """Remove any password that could appear in a libpq message."""
    secrets = [os.environ.get("PGPASSWORD", "")]
    if dsn:
        match = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
        if match:
            secrets.append(match.group(1).strip("'"))
        match = re.search(r"://[^:/@]*:([^@/]*)@", dsn)
        if match:
            secrets.append(match.group(1))
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", message)
