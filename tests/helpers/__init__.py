"""What the tests share, written once: each module below serves the tests of every file, and a
test imports it from here (``from helpers.cli import run``), never from ``conftest`` or from
another test module. The fixtures themselves are in ``tests/conftest.py``.

- ``servers``: the test cluster's roles and databases, real sessions that hold and wait for
  locks (``Sessions``, ``Worker``), and what ``pg_locks`` shows of them.
- ``cli``: lockdiag run in this process (click's runner) or as a process of its own.
- ``terminal``: lockdiag on a real pseudo-terminal, the screen a person sees.
- ``snapshots``: snapshots built by hand, no server.
- ``freezer``: a TCP proxy that stops answering.
"""
