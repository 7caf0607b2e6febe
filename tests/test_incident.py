"""The incident model: one ranking of causes, named by the lock others wait for, and every
output of `check` (text, JSON, Nagios, Prometheus) saying the same thing first."""

from __future__ import annotations

import json

from lockdiag.core import snapshot_file
from lockdiag.core.diagnosis import Diagnosis
from lockdiag.core.findings import SEVERITIES, CheckPolicy
from lockdiag.core.incident import Incident
from lockdiag.registry import load_registry

from helpers.cli import run
from helpers.paths import BUNDLED_REGISTRY as REGISTRY
from helpers.paths import INCIDENT

RANK = {severity: place for place, severity in enumerate(SEVERITIES)}  # critical highest


def bundled() -> Incident:
    policy = CheckPolicy()
    snapshot = snapshot_file.load(INCIDENT)
    registry = load_registry(str(REGISTRY))
    return Diagnosis(snapshot, registry, policy.analysis_policy()).incident(policy)


def check(*args: str) -> str:
    result = run("check", "--from", str(INCIDENT), "--registry", str(REGISTRY), *args)
    assert result.exit_code == 2, result.output  # CRITICAL
    return result.stdout


def test_the_worst_cause_is_named_by_the_lock_others_wait_for() -> None:
    incident = bundled()
    first = incident.causes[0]
    # pid 4163 holds invoice_export 2041 (first in sort order, nobody waits) and
    # tenant_summary 73, which two sessions wait for
    assert (first.pid, first.label, first.locks) == (4163, "tenant_summary 73", 2)
    assert [(c.label, c.queue) for c in first.contended] == [("tenant_summary 73", 2)]
    assert (first.blocked, first.blocked_directly) == (2, 2)
    assert incident.counts() == (2, 3) and incident.waiting == 3


def test_a_cause_is_never_less_severe_than_what_it_causes() -> None:
    for cause in bundled().causes:
        below = [f.severity for f in (*cause.findings, *cause.symptoms)]
        if below:
            assert cause.severity is not None
            assert RANK[cause.severity] == max(RANK[s] for s in below), cause
    # the leaked root: its own finding is a warning, the wait it causes is critical
    first = bundled().causes[0]
    assert first.findings[0].kind.value == "session-lock"
    assert first.severity == "critical"


def test_the_order_is_impact_then_severity_then_age() -> None:
    causes = bundled().causes
    keys = [(-c.blocked, -(c.longest_wait or 0.0)) for c in causes]
    assert keys == sorted(keys)
    quiet = [c for c in causes if not c.blocked]
    ranks = [RANK[c.severity] if c.severity else -1 for c in quiet]
    assert ranks == sorted(ranks, reverse=True)


def test_text_json_nagios_and_prometheus_agree() -> None:
    incident = bundled()
    first = incident.causes[0]
    text = check().splitlines()
    assert text[0] == "CRITICAL: 2 critical, 3 warning cause(s); 3 session(s) waiting"
    assert (
        text[1] == "CRITICAL session-lock: tenant_summary 73 (+1 more)  pid 4163 (billing-worker)"
    )
    headings = [line for line in text[1:] if line.startswith(("CRITICAL ", "WARNING "))]
    assert len(headings) == sum(incident.counts())

    document = json.loads(check("--format", "json"))
    assert document["summary"] == {"critical": 2, "warning": 3, "waiting": 3}
    assert [(c["pid"], c["lock"], c["severity"]) for c in document["causes"]] == [
        (c.pid, c.label, c.severity) for c in incident.alerting
    ]
    assert document["causes"][0]["contended"] == [
        {"lock": "tenant_summary 73", "waiting": 2, "longest_wait": first.longest_wait}
    ]

    nagios = check("--format", "nagios")
    assert nagios.startswith(
        "LOCKDIAG CRITICAL - 2 critical, 3 warning cause(s); 3 session(s) waiting; "
        "session-lock: tenant_summary 73 (+1 more) pid 4163 (billing-worker), blocks 2"
    )

    exposition = check("--format", "prometheus").splitlines()
    assert 'lockdiag_causes{severity="critical"} 2.0' in exposition
    assert 'lockdiag_causes{severity="warning"} 3.0' in exposition
