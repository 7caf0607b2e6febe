"""HTTP that holds up, for the exporter: bursts of scrapes and slow or half-sent requests.

A deep listen backlog; a waiting room (one thread, a selector) where a connection stays,
costing no thread, until its request head has arrived whole within a few seconds, or until its
keep-alive ends; a bounded pool of workers behind a bounded queue; when both are full a request
is answered 503 at once. The handler is an ordinary BaseHTTPRequestHandler subclass of
:class:`OneRequestHandler`.
"""

from __future__ import annotations

import contextlib
import io
import queue
import re
import selectors
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

# the HTTP side
LISTEN_BACKLOG = 256  # connections the kernel holds before the exporter accepts them
WORKERS = 16  # threads that answer requests
QUEUE = 256  # complete requests waiting for a worker; beyond them: 503 at once
MAX_WAITING = 512  # connections waiting for their request (or kept alive); the oldest go first
REQUEST_TIMEOUT = 5.0  # a request's head must arrive whole this soon (after the connection
# opens, or after its first byte on a kept-alive one): else 408, closed, no worker ever held
IDLE_TIMEOUT = 15.0  # a kept-alive connection with no new request is closed after this
QUEUE_TIMEOUT = 10.0  # a request that waited this long for a worker gets 503 (its client gave up)
WRITE_TIMEOUT = 10.0  # a client that does not take its whole answer this soon loses it
MAX_HEAD = 65536  # request line and headers

_HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclass(eq=False)
class _Connection:
    """A client's connection: in the waiting room until its request head is whole, then with
    a worker for one request, then back in the waiting room if it is kept alive."""

    sock: socket.socket
    address: Any
    deadline: float  # time.monotonic() when it is closed if no whole request came
    buffer: bytearray = field(default_factory=bytearray)  # received, not yet answered
    head: bytes = b""  # the request being answered
    queued: float = 0.0  # time.monotonic() when it was queued for a worker


def _plain(status: int, reason: str, text: str) -> bytes:
    body = text.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


_BUSY = _plain(503, "Service Unavailable", "busy: too many requests at once, retry\n")
_SLOW = _plain(408, "Request Timeout", "the request did not arrive in time\n")
_LARGE = _plain(431, "Request Header Fields Too Large", "request head too large\n")


class OneRequestHandler(BaseHTTPRequestHandler):
    """Answers the one request whose head the waiting room read: it never waits for a
    client's bytes, only (WRITE_TIMEOUT at most) for the client to take its answer."""

    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection

    def setup(self) -> None:
        connection: _Connection = self.request
        self.connection = connection.sock
        self.rfile = io.BytesIO(connection.head)
        self.wfile = _Writer(connection.sock, time.monotonic() + WRITE_TIMEOUT)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        headers = getattr(self, "headers", None)
        if headers is not None and (
            headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in headers
        ):
            self.close_connection = True  # a body we never read: the next request is unclear

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the terminal


class PooledHTTPServer(HTTPServer):
    """An HTTPServer whose accept loop (serve_forever) hands each connection to a waiting
    room: one thread with a selector, where a connection costs no thread until its request
    head has arrived whole (within REQUEST_TIMEOUT, else 408 and closed; kept-alive ones are
    closed after IDLE_TIMEOUT idle; beyond MAX_WAITING the oldest is closed). Whole requests
    go to a bounded queue before ``workers`` threads; when the queue is full the request is
    answered 503 at once."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        workers: int = WORKERS,
        queued: int = QUEUE,
    ) -> None:
        self.handler: Callable[[Any, Any, PooledHTTPServer], BaseHTTPRequestHandler] = handler
        self.jobs: queue.Queue[_Connection | None] = queue.Queue(queued)
        self.closing = threading.Event()
        self.waiting: dict[_Connection, None] = {}  # in arrival order: the oldest first
        self.incoming: deque[_Connection] = deque()
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        for end in (self.wake_r, self.wake_w):
            end.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.lobby = threading.Thread(target=self._lobby, daemon=True, name="http waiting room")
        self.workers = [
            threading.Thread(target=self._work, daemon=True, name=f"http worker {n + 1}")
            for n in range(workers)
        ]
        super().__init__(address, handler)  # binds and listens; if it cannot: server_close()
        self.lobby.start()
        for worker in self.workers:
            worker.start()

    # the accept loop's thread, and the workers': into the waiting room

    def process_request(self, request: Any, client_address: Any) -> None:
        self._admit(_Connection(request, client_address, time.monotonic() + REQUEST_TIMEOUT))

    def _admit(self, connection: _Connection) -> None:
        if self.closing.is_set():
            _close(connection)
            return
        self.incoming.append(connection)  # deque: thread-safe
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: it is awake already
            self.wake_w.send(b"x")

    # the waiting room's thread

    def _lobby(self) -> None:
        try:
            while not self.closing.is_set():
                try:
                    for key, _ in self.selector.select(0.25):
                        if key.data is None:
                            self._drain_wakeups()
                        else:
                            self._read(key.data)
                    self._take_incoming()
                    self._expire()
                except Exception:  # a bug: said on stderr, and the room stays open
                    traceback.print_exc()
                    time.sleep(0.1)
        finally:
            for connection in list(self.waiting):
                self._leave(connection)
                _close(connection)
            self.selector.close()

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: all read
            while self.wake_r.recv(4096):
                pass

    def _take_incoming(self) -> None:
        while self.incoming:
            connection = self.incoming.popleft()
            try:
                connection.sock.setblocking(False)
                self.selector.register(connection.sock, selectors.EVENT_READ, connection)
            except (OSError, ValueError):
                _close(connection)
                continue
            self.waiting[connection] = None
            while len(self.waiting) > MAX_WAITING:
                oldest = next(iter(self.waiting))
                self._leave(oldest)
                _close(oldest)
            if connection.buffer:  # a kept-alive client may have sent its next request
                self._dispatch_if_whole(connection)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._leave(connection)
            _close(connection)
            return
        connection.deadline = min(connection.deadline, time.monotonic() + REQUEST_TIMEOUT)
        connection.buffer += data
        self._dispatch_if_whole(connection)

    def _dispatch_if_whole(self, connection: _Connection) -> None:
        buffer = connection.buffer = connection.buffer.lstrip(b"\r\n")
        end = _HEAD_END.search(buffer)
        if end is None:
            if len(buffer) > MAX_HEAD:
                self._refuse(connection, _LARGE)
            return
        connection.head = bytes(buffer[: end.end()])
        del buffer[: end.end()]
        self._leave(connection)
        connection.queued = time.monotonic()
        try:
            self.jobs.put_nowait(connection)
        except queue.Full:
            self._refuse(connection, _BUSY)

    def _expire(self) -> None:
        now = time.monotonic()
        for connection in [c for c in self.waiting if c.deadline <= now]:
            self._refuse(connection, _SLOW if connection.buffer else b"")

    def _refuse(self, connection: _Connection, answer: bytes) -> None:
        self._leave(connection)
        if answer:
            with contextlib.suppress(OSError):  # non-blocking: all of it fits, or never mind
                connection.sock.send(answer)
        _close(connection)

    def _leave(self, connection: _Connection) -> None:
        if connection in self.waiting:
            del self.waiting[connection]
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(connection.sock)

    # the workers' threads

    def _work(self) -> None:
        while (connection := self.jobs.get()) is not None:
            if time.monotonic() - connection.queued > QUEUE_TIMEOUT:
                with contextlib.suppress(OSError):
                    connection.sock.send(_BUSY)
                _close(connection)
                continue
            keep = False
            try:
                keep = not self.handler(connection, connection.address, self).close_connection
            except OSError:
                pass  # the client went away or did not take its answer
            except Exception:
                self.handle_error(connection.sock, connection.address)
            if keep:
                connection.deadline = time.monotonic() + IDLE_TIMEOUT
                self._admit(connection)
            else:
                _close(connection)

    def server_close(self) -> None:
        """Stop listening, close every waiting connection, let the workers go: each ends
        after the request it is answering (threads are daemons: none holds the exit)."""
        super().server_close()
        self.closing.set()
        self._wake()
        if self.lobby.ident is not None:
            self.lobby.join(5)  # it closes the waiting connections and its selector
        else:
            self.selector.close()
        while True:
            try:
                connection = self.jobs.get_nowait()
            except queue.Empty:
                break
            if connection is not None:
                _close(connection)
        for _ in self.workers:
            try:
                self.jobs.put_nowait(None)
            except queue.Full:
                break
        for end in (self.wake_r, self.wake_w):
            end.close()


class _Writer(io.BufferedIOBase):
    """A worker's answer, held until flushed, then sent whole by ``deadline`` or not at all
    (TimeoutError): headers and body in one send, however slowly the client reads."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock, self.deadline = sock, deadline
        self.held = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.held += data
        return len(memoryview(data))

    def flush(self) -> None:
        if self.held:
            self.sock.settimeout(max(0.001, self.deadline - time.monotonic()))
            self.sock.sendall(self.held)
            self.held.clear()


def _close(connection: _Connection) -> None:
    with contextlib.suppress(OSError):
        connection.sock.close()
