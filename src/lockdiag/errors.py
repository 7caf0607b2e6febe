"""Errors that reach the user as one clear line and a documented exit code.

Nothing here prints; ``cli.py`` turns each error into a message and ``exit_code``.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NEGATIVE = 1  # the answer is "no": who-holds found no holder, registry check found errors
EXIT_INPUT = 2  # bad input: usage, key, namespace, registry file, snapshot file
EXIT_SERVER = 3  # could not connect, or the server refused or cancelled the snapshot
EXIT_UNKNOWN = 3  # `check` only: the monitoring-plugin UNKNOWN
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of standard output went away


class LockdiagError(Exception):
    """Base class: an expected failure with a message meant for the user."""

    exit_code: int = EXIT_INPUT
    hint: str | None = None

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class InputError(LockdiagError, ValueError):
    """Something the user typed or pointed at is wrong; nothing was done."""


class ServerError(LockdiagError):
    """The server could not be reached, refused us, or cancelled the query."""

    exit_code: int = EXIT_SERVER
