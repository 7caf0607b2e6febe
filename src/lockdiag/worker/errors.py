"""What the helpers raise, besides the driver's own errors."""

from __future__ import annotations

from lockdiag.errors import InputError, LockdiagError


class LockTimeout(LockdiagError):
    """A waiting lock was not granted within its timeout; nothing is held."""


class NotInTransaction(InputError):
    """A transaction-level lock asked for outside a transaction: it would end at once."""


class UnsupportedConnection(InputError):
    """An object that is not a connection of a driver the helpers know (or the wrong API)."""


class PooledSession(InputError):
    """A session lock asked for through a pooler that hands the session to other clients."""
