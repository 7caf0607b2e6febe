"""A one-shot command's end without its teardown: what a dump was made of is not freed object
by object.

A dump of a hundred thousand locks is some million small objects (the snapshot's rows, the
analysis's entries and keys). Freed at the end, when the command returns and then when the
interpreter clears its modules, they took 0.1 s at 100k locks (0.2 to 0.4 s at 300k) after
the last byte was written: a fourth of what `psql -At` takes to print the same locks. A
command that reads keeps its readings here (:func:`keep`, by ``cli.common.get_readings``:
list, who-holds, blockers, check, snapshot), so that nothing is freed when it returns, and
:func:`end` leaves the process at once, its standard streams flushed, when nothing else can
want the usual exit (a thread that is no daemon, an exit that is not a number). A read has
closed its connection by then (``evidence.read_once``). Light on purpose: ``main`` loads it
for every command.
"""

from __future__ import annotations

import os
import sys

# the answer of the command under way, the last one kept: never a growing list (the tests run
# hundreds of commands in one process, and a command may read more than once)
KEPT: list[object] = []


def keep(answer: object) -> None:
    """Keep ``answer`` (a command's readings) until the process ends, in place of any kept
    before."""
    KEPT[:] = [answer]


def forget() -> None:
    """A new command begins: the last one's answer is freed as usual."""
    KEPT.clear()


def end(done: SystemExit) -> None:
    """Leave now with ``done``'s exit code, when a command kept an answer and the usual exit
    has nothing more to do: no other thread to wait for, an exit code that is a number (a
    message is printed by the usual exit), standard output and error flushed without an
    error (one that fails is left to the usual exit, which says so). Otherwise return, and
    the caller exits as usual."""
    code = done.code
    if KEPT and (code is None or isinstance(code, int)) and _alone():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        else:
            os._exit(code or 0)
    # the usual exit: the answer freed now, as a command's locals are when it returns (kept
    # until the interpreter's last collection, its million objects would all be traversed)
    forget()


def _alone() -> bool:
    """No thread the usual exit would wait for: the deadline's (a daemon) may be there."""
    import threading  # loaded already: the driver and logging import it

    main = threading.main_thread()
    return all(thread.daemon for thread in threading.enumerate() if thread is not main)
