"""lockdiag: who holds that PostgreSQL advisory lock, and who waits behind it.

Workers take locks by name through :mod:`lockdiag.registry`; the CLI lives in :mod:`lockdiag.cli`.

The packages, from the bottom up: the worker-facing modules (errors, durations, keys,
registry); core (pure); logs; render; pg (the server); views; exporter; cli; demo. Each may
import only those below it (docs/development.md; tests/test_architecture.py checks it); worker
stands beside them and imports the worker-facing modules only (and pg's PgBouncer console
reader). This module imports nothing.
"""

__version__ = "0.1.0"
