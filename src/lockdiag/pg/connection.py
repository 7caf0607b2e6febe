"""Connection parameters and messages shared by every connection lockdiag opens: the
diagnostic session's settings, libpq's connect timeout, and password-free one-line errors.

A database's owner may attach settings to every session of it (ALTER DATABASE ... SET, checked
on PostgreSQL 15), and some would change what lockdiag reads or whether it can read:
``client_encoding = 'SQL_ASCII'`` makes psycopg return bytes (every row dropped), ``LATIN1``
fails on any character it lacks, ``DateStyle = 'SQL, DMY'`` leaves psycopg unable to parse a
timestamp, serializable deferrable transactions wait for a safe snapshot behind any serializable
writer, ``idle_session_timeout = '1ms'`` ends the session between two statements, ``role = 'x'``
turns a superuser's session into a role that cannot see other sessions' state. So lockdiag
pins each of them for its own session: settings a client sends when connecting win over the
database's and the role's (PGC_S_CLIENT). ``client_encoding`` goes as libpq's own parameter
(poolers pass it on: PgBouncer tracks it per client), the others in ``options``; the session
verifies them all after connecting (:mod:`lockdiag.pg.session`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.adapt import Buffer, Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockdiag.errors import InputError

if TYPE_CHECKING:
    from lockdiag.core.model import Session, Snapshot

APPLICATION_NAME = "lockdiag"
# psycopg encodes queries and decodes text in the session's client_encoding, from the first
# statement on: it cannot be SET LOCAL meaningfully (the transaction's own statements would be
# encoded before the change), so it is only sent when connecting, and verified
CLIENT_ENCODING = "UTF8"


def connect_timeout(timeout: float) -> str:
    """libpq's connect_timeout (whole seconds, at least 2: libpq treats 1 as 2 anyway)."""
    return str(max(2, math.ceil(timeout)))


def session_settings(timeout: float, server_version: int = 0) -> dict[str, str]:
    """lockdiag's settings for its own session, as pg_settings shows them when in force: those
    of ``server_version`` (0: not known yet, only the settings every supported version has)."""
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
        # what psycopg parses timestamps in (the order is pg_settings' full value)
        "DateStyle": "ISO, MDY",
        # a serializable deferrable read-only transaction waits for a safe snapshot
        "default_transaction_isolation": "read committed",
        "default_transaction_deferrable": "off",
        "idle_session_timeout": "0",
        # a database's or role's `SET role = 'x'` makes a superuser's session that role's,
        # blind to other sessions' state: checked after connecting as current_user =
        # session_user (pg_settings does not list role)
        "role": "none",
        **version_settings(server_version),
    }


def version_settings(server_version: int) -> dict[str, str]:
    """lockdiag's settings that only newer servers have. An older server refuses an unknown
    setting in the startup packet, so these go in it once a connection has told the version."""
    # a database's or role's transaction_timeout (17 and later) ends the session, FATAL, in
    # the middle of a read; lockdiag's own deadline and statement_timeout bound its reads
    return {"transaction_timeout": "0"} if server_version >= 170000 else {}


def session_options(timeout: float, server_version: int = 0) -> str:
    """Server settings sent in the startup packet, so they bind the very first statement."""
    settings = session_settings(timeout, server_version).items()
    # libpq's options: a backslash escapes a space or itself
    return " ".join(f"-c {name}={_escaped(value)}" for name, value in settings)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def conninfo(dsn: str | None, timeout: float, server_version: int = 0) -> str:
    """The user's DSN (or libpq's environment) with lockdiag's safety settings added (those of
    ``server_version``, when a connection has told it)."""
    try:
        given = conninfo_to_dict(dsn or "")
    except psycopg.ProgrammingError as error:  # raised by libpq's parser
        raise InputError(f"invalid connection string: {scrub(str(error), dsn)}") from None
    user_options = str(given.get("options") or "")
    return make_conninfo(
        dsn or "",
        application_name=APPLICATION_NAME,
        client_encoding=CLIENT_ENCODING,
        connect_timeout=connect_timeout(timeout),
        options=f"{user_options} {session_options(timeout, server_version)}".strip(),
    )


@dataclass
class Undecodable:
    """How many text values from the server were not valid UTF-8 (shown with U+FFFD)."""

    values: int = 0


def tolerate_undecodable(connection: psycopg.Connection[Any], seen: Undecodable) -> None:
    """Text that is not valid UTF-8 is decoded with replacement characters instead of raising,
    and counted in ``seen``. The server converts text from the database's encoding to the
    session's, or, from a SQL_ASCII database, validates it (an error, not bytes), so all text
    is valid UTF-8 except, in a UTF8 database, what it holds unconverted: other databases'
    strings in pg_stat_activity (a query...: lockdiag reads them as JSON) and the shared
    catalogs' names (of type name, in the encoding of the database they were created from). A
    LATIN1 database's 'é' is one byte that UTF-8 refuses.

    So only JSON and name go through these loaders (JSON's is Python anyway): text keeps
    psycopg's C loader, and the snapshot's lock rows their speed (a Python text loader made
    the client's part half as slow again at 20k locks)."""

    def text(data: Buffer) -> str:
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError:
            seen.values += 1
            return str(data, "utf-8", "replace")

    class Text(Loader):
        def load(self, data: Buffer) -> str:
            return text(data)

    class Json(Loader):
        def load(self, data: Buffer) -> Any:
            return json.loads(text(data))

    connection.adapters.register_loader("json", Json)
    connection.adapters.register_loader("name", Text)


def undecodable_note(snapshot: Snapshot) -> str:
    """The note for a snapshot some of whose text was not valid UTF-8, naming the databases
    of the sessions it came from (once each)."""
    databases = sorted(
        {
            session.database or "?"
            for session in snapshot.sessions.values()
            if any(REPLACED in (text or "") for text in _texts(session))
        }
    )
    where = "the server"
    if databases:
        where = f"database{'s' if len(databases) > 1 else ''} {', '.join(databases)}"
    return (
        f"text from {where} is not valid UTF-8 (another encoding): shown with replacement "
        f"characters ({REPLACED}, U+FFFD)"
    )


REPLACED = "\ufffd"


def _texts(session: Session) -> tuple[str | None, ...]:
    return (session.query, session.application_name, session.user, session.database)


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
