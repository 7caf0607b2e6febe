"""Waiting for what a test needs to see, never for a fixed time: a condition polled until it
holds, and a failure that names what never came."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], object], timeout: float, what: str, every: float = 0.2) -> None:
    """Poll ``condition`` every ``every`` seconds until it is true; after ``timeout`` seconds
    fail with "timed out waiting for WHAT"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
