"""A TCP proxy in front of a test server that can stop answering, the way a SIGSTOPped cluster
or a frozen network path does: connections stay open, bytes sent are accepted by the kernel,
and nothing comes back.

``FreezingProxy(port)`` listens on 127.0.0.1 on a free port and relays to 127.0.0.1:``port``.
``freeze()`` stops relaying on every connection (new ones are still accepted: the TCP handshake
succeeds, as it does against a stopped server), ``thaw()`` resumes. ``freeze_after_queries(n)``
relays the startup and authentication and the first ``n`` queries of each new connection
(a simple 'Q', or an extended-protocol run from its Parse or Bind to its Sync), then freezes
that connection: "the server stops
answering right after the handshake" when ``n`` is 0. ``delay(seconds)`` holds every message the
client sends that long before relaying it: each round trip (the handshake's too) takes at least
``seconds``, as over a slow link or to an overloaded server.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

_SSL_OR_GSS_REQUEST = (80877103, 80877104)


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    queries_left: int | None  # None: never freeze by count
    frozen: bool = False
    startup_done: bool = False
    extended: bool = False  # inside an extended-protocol query (after P or B, before Sync)
    pending: bytearray = field(default_factory=bytearray)  # client bytes not yet parsed
    held: deque[tuple[float, bytes]] = field(default_factory=deque)  # delayed: (when due, bytes)


class FreezingProxy:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.frozen = False
        self.queries_before_freeze: int | None = None
        self.delay_seconds = 0.0
        self.first_accepted: float | None = None  # time.monotonic() of the first connection
        self.links: list[_Link] = []
        self.lock = threading.Lock()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True, name="freezing-proxy")
        self.thread.start()

    def dsn(self, base: str) -> str:
        """``base`` (a cluster's key=value DSN on 127.0.0.1) pointed at the proxy instead."""
        return f"{base} port={self.port}"

    def freeze(self) -> None:
        with self.lock:
            self.frozen = True

    def thaw(self) -> None:
        with self.lock:
            self.frozen = False
            self.queries_before_freeze = None
            for link in self.links:
                link.frozen, link.queries_left = False, None

    def freeze_after_queries(self, count: int) -> None:
        with self.lock:
            self.queries_before_freeze = count

    def delay(self, seconds: float) -> None:
        with self.lock:
            self.delay_seconds = seconds

    def close(self) -> None:
        self.running = False
        self.thread.join(5)
        for link in self.links:
            link.client.close()
            link.server.close()
        self.listener.close()
        self.selector.close()

    def __enter__(self) -> FreezingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the relay ---------------------------------------------------------------------------

    def _loop(self) -> None:
        parked: dict[socket.socket, tuple[_Link, bool]] = {}  # frozen: not watched meanwhile
        while self.running:
            for key, _ in self.selector.select(timeout=0.01 if self.delay_seconds else 0.05):
                if key.data is None:
                    self._accept()
                    continue
                link, from_client = key.data
                with self.lock:
                    frozen = self.frozen or link.frozen
                if frozen:  # leave the bytes in the kernel: nothing comes back; and stop
                    # watching the socket, which stays readable (a loop that spun a core)
                    self.selector.unregister(key.fileobj)
                    parked[key.fileobj] = key.data  # type: ignore[index]
                    continue
                self._relay(link, from_client)
            self._release_due()
            self._unpark(parked)

    def _unpark(self, parked: dict[socket.socket, tuple[_Link, bool]]) -> None:
        """Watch again the sockets of links thawed since they were parked (or drop them)."""
        with self.lock:
            thawed = [s for s, (link, _) in parked.items() if not (self.frozen or link.frozen)]
        for sock in thawed:
            data = parked.pop(sock)
            if sock.fileno() < 0:
                continue  # closed meanwhile
            self.selector.register(sock, selectors.EVENT_READ, data)

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        with self.lock:
            link = _Link(client, server, self.queries_before_freeze)
            self.links.append(link)
            if self.first_accepted is None:
                self.first_accepted = time.monotonic()
        self.selector.register(client, selectors.EVENT_READ, (link, True))
        self.selector.register(server, selectors.EVENT_READ, (link, False))

    def _relay(self, link: _Link, from_client: bool) -> None:
        source, sink = (link.client, link.server) if from_client else (link.server, link.client)
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(link)
            return
        if from_client and link.queries_left is not None:
            data = self._count_queries(link, data)
        elif from_client and link.pending:  # held back before a thaw
            data, link.pending = bytes(link.pending) + data, bytearray()
        if from_client and (self.delay_seconds or link.held):  # in order, behind the held
            link.held.append((time.monotonic() + self.delay_seconds, data))
            return
        try:
            sink.sendall(data)
        except OSError:
            self._drop(link)

    def _release_due(self) -> None:
        """Relay the delayed client bytes whose time has come."""
        now = time.monotonic()
        for link in list(self.links):
            while link.held and link.held[0][0] <= now:
                _, data = link.held.popleft()
                try:
                    link.server.sendall(data)
                except OSError:
                    self._drop(link)
                    break

    def _count_queries(self, link: _Link, data: bytes) -> bytes:
        """Relay whole messages until the query that freezes the link; hold back the rest."""
        link.pending += data
        out = bytearray()
        while True:
            if not link.startup_done:  # startup and SSL/GSS requests: length, then a code
                if len(link.pending) < 8:
                    break
                length, code = struct.unpack("!ii", link.pending[:8])
                if len(link.pending) < length:
                    break
                out += link.pending[:length]
                del link.pending[:length]
                link.startup_done = code not in _SSL_OR_GSS_REQUEST
                continue
            if len(link.pending) < 5:
                break
            kind = bytes(link.pending[:1])
            (length,) = struct.unpack("!i", link.pending[1:5])
            if len(link.pending) < length + 1:
                break
            # a query begins with Q, or with the P or B that opens an extended-protocol run (a
            # statement psycopg has prepared is sent as Bind ... Sync, without Parse)
            if kind == b"Q" or (kind in (b"P", b"B") and not link.extended):
                if link.queries_left == 0:
                    link.frozen = True
                    break
                assert link.queries_left is not None
                link.queries_left -= 1
            if kind in (b"P", b"B"):
                link.extended = True
            elif kind == b"S":
                link.extended = False
            out += link.pending[: length + 1]
            del link.pending[: length + 1]
        return bytes(out)

    def _drop(self, link: _Link) -> None:
        for sock in (link.client, link.server):  # parked ones are skipped when unparked
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
        with self.lock:
            if link in self.links:
                self.links.remove(link)
