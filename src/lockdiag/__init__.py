"""lockdiag: who holds that PostgreSQL advisory lock, and who waits behind it.

Workers take locks by name through :mod:`lockdiag.registry`; the CLI lives in :mod:`lockdiag.cli`.
"""

__version__ = "0.1.0"
