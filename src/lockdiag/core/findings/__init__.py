"""The findings of `lockdiag check`: what deserves an alert, with evidence and a next step.

Each detector reads one analysed snapshot. Durations are the certain lower bounds of analysis
(an idle holder has held its locks at least since it went idle); nothing is extrapolated.

Modules, in the order they may import each other (none imports one after it): ``model`` (kinds,
severities, the policy, Finding, Census, CheckReport), ``words`` (how a finding names locks,
holders and durations), ``programs`` (advice in a well-known program's terms, which terminate's
preview says too), the detectors by family (``waits``, ``holders``, ``names``, ``stalled``),
then ``report`` (check and by_cause). They import only the rest of ``core``,
``keys``, ``durations`` and ``registry``: nothing that reads a server or prints.
"""

from lockdiag.core.findings.model import (
    LOWER_BOUND_KINDS,
    SEVERITIES,
    Census,
    CheckReport,
    Finding,
    Kind,
    census,
)
from lockdiag.core.findings.names import exact_entry, key_shape, unregistered_step
from lockdiag.core.findings.programs import program_owner, software_step
from lockdiag.core.findings.report import CAUSES, WAITS, by_cause, check
from lockdiag.core.findings.waits import queue_evidence, queue_step
from lockdiag.core.findings.words import figures, held_words, locks_in
from lockdiag.core.policy import CheckPolicy, Severity, Threshold

__all__ = [
    "CAUSES",
    "LOWER_BOUND_KINDS",
    "SEVERITIES",
    "WAITS",
    "Census",
    "CheckPolicy",
    "CheckReport",
    "Finding",
    "Kind",
    "Severity",
    "Threshold",
    "by_cause",
    "census",
    "check",
    "exact_entry",
    "figures",
    "held_words",
    "key_shape",
    "locks_in",
    "program_owner",
    "queue_evidence",
    "queue_step",
    "software_step",
    "unregistered_step",
]
