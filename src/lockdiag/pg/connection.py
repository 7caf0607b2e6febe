"""Connection parameters and messages shared by every connection lockdiag opens: the
diagnostic session's settings, libpq's connect timeout, and password-free one-line errors.

A database's owner may attach settings to every session of it (ALTER DATABASE ... SET, checked
on PostgreSQL 15), and some would change what lockdiag reads or whether it can read:
``client_encoding = 'SQL_ASCII'`` makes psycopg return bytes (every row dropped), ``LATIN1``
fails on any character it lacks, ``DateStyle = 'SQL, DMY'`` leaves psycopg unable to parse a
timestamp, serializable deferrable transactions wait for a safe snapshot behind any serializable
writer, ``idle_session_timeout = '1ms'`` ends the session between two statements,
``jit_above_cost = 0`` (and its inlining's and optimisation's) compiles every statement, six
times slower, ``role = 'x'`` turns a superuser's session into a role that cannot see other
sessions' state. So lockdiag
pins each of them for its own session: settings a client sends when connecting win over the
database's and the role's (PGC_S_CLIENT). ``client_encoding`` goes as libpq's own parameter
(poolers pass it on: PgBouncer tracks it per client), the others in ``options``; the session
verifies them all after connecting (:mod:`lockdiag.pg.session`).
"""

from __future__ import annotations

import os
import re

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockdiag.errors import InputError
from lockdiag.pg.timeout import Timeout

APPLICATION_NAME = "lockdiag"
# psycopg encodes queries and decodes text in the session's client_encoding, from the first
# statement on: it cannot be SET LOCAL meaningfully (the transaction's own statements would be
# encoded before the change), so it is only sent when connecting, and verified
CLIENT_ENCODING = "UTF8"
# work_mem, in kB as pg_settings shows it: a read's copies of the lock table (pg_locks' own and
# the aggregated read's) stay in memory up to 32 MB each, some 200,000 locks; at the default
# 4 MB a read of 100k locks wrote and read back 14 MB of temp files, which a temp_file_limit
# could refuse (the aggregated read then reads in full); a database's 64kB or 1GB is not ours
WORK_MEM_KB = 32768


def session_settings(timeout: Timeout, server_version: int = 0) -> dict[str, str]:
    """lockdiag's settings for its own session, as pg_settings shows them when in force: those
    of ``server_version`` (0: not known yet, only the settings every supported version has)."""
    milliseconds = timeout.milliseconds
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
        # a database's jit_*_above_cost = 0 compiled (inlined, optimised) every statement of
        # lockdiag's: `check` at 100k locks took 3 s instead of 0.5 (PostgreSQL 15)
        "jit": "off",
        "work_mem": str(WORK_MEM_KB),
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


def session_options(timeout: Timeout, server_version: int = 0) -> str:
    """Server settings sent in the startup packet, so they bind the very first statement."""
    settings = session_settings(timeout, server_version).items()
    # libpq's options: a backslash escapes a space or itself
    return " ".join(f"-c {name}={_escaped(value)}" for name, value in settings)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def conninfo(dsn: str | None, timeout: Timeout, server_version: int = 0) -> str:
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
        connect_timeout=timeout.connect,
        options=f"{user_options} {session_options(timeout, server_version)}".strip(),
    )


def dsn_label(dsn: str) -> str:
    """``host:port/dbname`` (or ``service=name``) for a DSN, never its password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # an invalid DSN still needs a name in the report
        return "invalid DSN"
    if parts.get("service") and not parts.get("host"):
        return f"service={parts['service']}"
    host = parts.get("host") or "localhost"
    where = f"{host}:{parts['port']}" if parts.get("port") else str(host)
    return f"{where}/{parts['dbname']}" if parts.get("dbname") else where


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
