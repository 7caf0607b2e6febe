"""The thresholds a snapshot is judged by: :class:`Policy`, what the analysis flags, and
:class:`CheckPolicy`, what `check` reports and how severely.

A room of their own, light (no catalogue, no graph, no detector): a command reads its
thresholds from its options before the server is asked, and the modules that apply them are
imported while the server works (:mod:`lockdiag.evidence.overlap`). ``core.analysis`` and
``core.findings`` say them again, where they were first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lockdiag.registry import Unregistered

# "info": reported in every format, never changes the exit code (hygiene, not an incident)
Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True)
class Policy:
    session_age: float = 300.0  # seconds; flag certain session locks held at least this long


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Threshold:
    """A warning level and an optional critical level (seconds, or a count)."""

    warning: float
    critical: float | None = None

    def severity(self, value: float | None) -> Severity | None:
        if value is None:
            return None
        if self.critical is not None and value >= self.critical:
            return "critical"
        return "warning" if value >= self.warning else None


@dataclass(frozen=True)
class CheckPolicy:
    session_age: Threshold = Threshold(300, 3600)  # certain session lock held this long
    wait_age: Threshold = Threshold(30, 300)  # a session waiting for a lock
    idle_age: Threshold = Threshold(60, 600)  # holder idle in transaction while others wait
    max_blocked: Threshold = Threshold(5, 20)  # sessions behind one root blocker (more than N)
    unregistered: Unregistered = "report"  # keys no registry names: hygiene, not paging

    def analysis_policy(self) -> Policy:
        """The analysis flags certain session locks from the warning level on, so the
        session-lock detector can read the flag."""
        return Policy(session_age=self.session_age.warning)
