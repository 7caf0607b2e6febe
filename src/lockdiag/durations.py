"""Durations as people write them (``250ms``, ``90s``, ``5m``, ``1h30m``) and as shown."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Seconds in ``text``; a bare number means seconds. Raises ValueError with the reason."""
    cleaned = text.strip().lower().replace(" ", "")
    if not cleaned:
        raise ValueError("empty duration")
    try:
        seconds = float(cleaned)
    except ValueError:
        pass
    else:
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"{text!r} is not a finite duration of zero or more")
        return seconds
    position, total = 0, 0.0
    for match in _PART.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(cleaned) or position == 0:
        raise ValueError(f"{text!r} is not a duration (examples: 250ms, 90s, 5m, 1h30m, 2d)")
    return total


def format_duration(seconds: float) -> str:
    """Two units at most, the largest first: ``850ms``, ``45s``, ``12m05s``, ``3h12m``, ``2d4h``."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"
