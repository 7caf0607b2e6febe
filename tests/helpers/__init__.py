"""What the tests share, written once: a test imports it from here (``from helpers.cli import
run``), never from ``conftest`` or from another test module. The fixtures themselves are in
``tests/conftest.py``; no module here imports a test module or ``conftest``. Its modules:

- ``servers``: the test cluster's roles and databases, real sessions that hold and wait for
  locks (``Sessions``, ``Worker``), and what ``pg_locks`` shows of them.
- ``polling``: waiting until a condition holds, never for a fixed time.
- ``cli``: lockdiag run in this process (click's runner) or as a process of its own, and what
  its answers say (its JSON, its one-line refusals).
- ``terminal``: lockdiag on a real pseudo-terminal, the screen a person sees.
- ``snapshots``, ``samples``: snapshots and samples built by hand, no server.
- ``registry``: registry files written and registry texts parsed.
- ``pooler``: a lock leaked through a real PgBouncer.
- ``exporter``: the exporter served and scraped, and a real Prometheus.
- ``freezer``: a TCP proxy that stops answering.
- ``browser``: a real headless Chromium.
- ``npm``, ``plugins``: Node.js programs and lockdiag plugins installed for a test.
- ``paths``: the repository's bundled incident and registry.
"""
