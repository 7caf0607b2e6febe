"""Connection poolers: which backends are PgBouncer server connections, in which pool, and
whether a client is attached to them right now.

PgBouncer's admin console (the ``pgbouncer`` database) answers ``SHOW SERVERS``, ``SHOW CLIENTS``
and ``SHOW POOLS``. Columns were added over releases (1.21, 1.23, 1.24): rows are read by column
name. A server's ``remote_pid`` is the backend pid, and its ``local_addr:local_port`` equals the
backend's ``client_addr:client_port`` (used when remote_pid is not a real pid, e.g. behind a
second PgBouncer). ``link`` is the attached client's ``ptr``, empty when no client is attached.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockdiag.core.model import PoolLink, Session
from lockdiag.errors import ServerError
from lockdiag.pg import deadline
from lockdiag.pg.connection import one_line, scrub
from lockdiag.pg.timeout import DEFAULT_TIMEOUT, Timeout


@dataclass(frozen=True)
class Console:
    """What one PgBouncer's admin console said, rows as dicts keyed by column name."""

    label: str
    servers: list[dict[str, Any]]
    clients: list[dict[str, Any]]
    pools: list[dict[str, Any]]


def read_console(dsn: str, timeout: Timeout = DEFAULT_TIMEOUT) -> Console:
    """SHOW SERVERS, CLIENTS and POOLS on one admin console (plain protocol, no options), each
    under the client-side deadline of ``timeout``."""
    try:
        info = make_conninfo(dsn, dbname="pgbouncer")
        connection = deadline.connect(info, timeout, peer="PgBouncer", autocommit=True)
    except psycopg.Error as error:
        raise ServerError(
            f"cannot read PgBouncer console: {one_line(scrub(str(error), dsn))}"
        ) from None
    try:
        return Console(
            console_label(info),
            *(_show(connection, what) for what in ("SERVERS", "CLIENTS", "POOLS")),
        )
    except deadline.NoAnswer as error:
        raise ServerError(f"cannot read PgBouncer console: {error}", hint=error.hint) from None
    except psycopg.Error as error:
        raise ServerError(
            f"PgBouncer console refused SHOW: {one_line(str(error))}",
            hint="the user must be in admin_users or stats_users of pgbouncer.ini",
        ) from None
    finally:
        connection.close()


def console_label(dsn: str) -> str:
    """How a console is named in output and in a PoolLink: its host:port."""
    params = conninfo_to_dict(dsn)
    return f"{params.get('host') or 'localhost'}:{params.get('port') or 6432}"


def link_now(
    dsns: Iterable[str], link: PoolLink, session: Session, timeout: Timeout
) -> PoolLink | None:
    """``session``'s link as ``link``'s console tells it now (read again), or None when that
    console no longer lists it as a server connection."""
    for dsn in dsns:
        if console_label(dsn) == link.pooler:
            return links([read_console(dsn, timeout)], {session.pid: session}).get(session.pid)
    raise ServerError(f"PgBouncer console {link.pooler} is no longer given (--pgbouncer)")


def _show(connection: psycopg.Connection[Any], what: str) -> list[dict[str, Any]]:
    cursor = connection.execute(f"SHOW {what}")
    names = [column.name for column in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def links(consoles: Iterable[Console], sessions: dict[int, Session]) -> dict[int, PoolLink]:
    """Each backend that is a pooler's server connection, with its pool and attached client."""
    by_address = {(s.client_addr, s.client_port): pid for pid, s in sessions.items()}
    found: dict[int, PoolLink] = {}
    for console in consoles:
        clients = {str(c.get("ptr")): c for c in console.clients}
        modes = {(p.get("database"), p.get("user")): p.get("pool_mode") for p in console.pools}
        for server in console.servers:
            address = (str(server.get("local_addr")), server.get("local_port"))
            pid = by_address.get(address)
            if pid is None and server.get("remote_pid") in sessions:
                pid = int(server["remote_pid"])
            if pid is None:
                continue
            client = clients.get(str(server.get("link") or "")) if server.get("link") else None
            found[pid] = PoolLink(
                pooler=console.label,
                pool=f"{server.get('database')}/{server.get('user')}",
                pool_mode=str(modes.get((server.get("database"), server.get("user"))) or ""),
                server_state=str(server.get("state") or ""),
                client=f"{client.get('addr')}:{client.get('port')}" if client else None,
                client_application=(str(client.get("application_name") or "") or None)
                if client
                else None,
                via="console",
            )
    return found


def address_links(addresses: Iterable[str], sessions: dict[int, Session]) -> dict[int, PoolLink]:
    """Without console access: backends whose client address is a known pooler."""
    wanted = set(addresses)
    found = {}
    for pid, session in sessions.items():
        if session.client_addr is None:
            continue
        port = f"{session.client_addr}:{session.client_port}"
        if session.client_addr in wanted or port in wanted:
            found[pid] = PoolLink(
                pooler=session.client_addr,
                pool="",
                pool_mode="",
                server_state="",
                client=None,
                client_application=None,
                via="address",
            )
    return found
