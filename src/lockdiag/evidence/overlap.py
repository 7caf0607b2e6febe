"""Imports made while the server works: the modules an answer needs only once its snapshot is
read (the analysis, the findings, the views), imported on a thread of their own while the main
thread waits for the server (libpq waits with the GIL released): at 100k locks the server
works some 150 to 175 ms, the imports take some 40.

The thread starts when the query has gone out (:meth:`Overlap.sent`), not before: until then
the main thread has the critical path to itself (building and sending the query, connecting),
and a thread importing beside it would take turns with it for the interpreter (this cost some
20 ms at 100k locks). No two threads import at once: the main thread's read needs no module it
has not loaded before (a test says so), and it waits for the thread before it analyses. A
module that fails to import here is left to the main thread, whose own import of it raises the
error where it always did: nothing is lost, nothing waits for it. A read that never sends its
query (the connection failed) imports nothing here. A read made on a thread of its own (a
fleet's, the exporter's) imports them itself before it reads, one such thread at a time.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# while both threads run: the main thread, its answer come, waits this long at most for the
# importing thread to let go of the interpreter (Python's default, 5 ms, at each of the
# connection's round trips, would cost more than the imports save)
SWITCH_INTERVAL = 0.0005
_ONE_AT_A_TIME = threading.Lock()  # the import thread, or a reader's thread


class Overlap:
    """The imports of one read, made on a thread of their own once its query has gone out."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.thread: threading.Thread | None = None
        self.interval = sys.getswitchinterval()

    def sent(self) -> None:
        """The query has gone out: the main thread has nothing to do until its rows come.
        Starts the imports (once: a read that is made again starts none)."""
        if self.thread is not None or not self.names:
            return
        self.thread = threading.Thread(
            target=_import, args=(self.names,), name="lockdiag-imports", daemon=True
        )
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            sys.setswitchinterval(self.interval)


@contextmanager
def importing(names: tuple[str, ...]) -> Iterator[Overlap]:
    """``names`` imported on a thread of their own from the moment the body calls the
    overlap's :meth:`~Overlap.sent`; the thread joined at the body's end, whatever happened."""
    names = tuple(name for name in names if name not in sys.modules)
    if names and threading.current_thread() is not threading.main_thread():
        import_now(names)  # a reader's thread (a fleet's, the exporter's): now, before it reads
        names = ()
    overlap = Overlap(names)  # nothing to import: sent() does nothing
    try:
        yield overlap
    finally:
        overlap.join()


def _import(names: tuple[str, ...]) -> None:
    with _ONE_AT_A_TIME:
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:  # the main thread's own import says what went wrong
                return


def import_now(names: tuple[str, ...]) -> None:
    """``names`` imported here and now, by one thread at a time."""
    with _ONE_AT_A_TIME:
        for name in names:
            importlib.import_module(name)
