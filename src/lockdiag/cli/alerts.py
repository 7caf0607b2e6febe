"""`lockdiag check`: findings against thresholds, with monitoring-plugin exit codes."""

from __future__ import annotations

import itertools
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from lockdiag.cli.common import (
    F,
    formats,
    get_readings,
    get_registry,
    registry_option,
    show,
    source_options,
)
from lockdiag.cli.settings import SETTINGS_ERROR
from lockdiag.core.model import Aggregated
from lockdiag.core.policy import CheckPolicy, Threshold
from lockdiag.durations import parse_duration
from lockdiag.errors import EXIT_UNKNOWN, LockdiagError
from lockdiag.evidence import Analysis
from lockdiag.registry import UNREGISTERED_LEVELS, Unregistered

# the answer's view: imported while the server works (lockdiag.evidence.overlap), not at load
VIEWS = ("lockdiag.views.check",)


def _threshold(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """WARN or WARN,CRIT: durations (``30s,5m``) or, for counts, integers (``5,20``)."""
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",")]
    if len(parts) > 2:
        raise click.BadParameter("give WARN or WARN,CRIT", ctx, param)
    try:
        levels = [parse_duration(part) for part in parts]
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None
    if len(levels) == 2 and levels[1] < levels[0]:
        raise click.BadParameter("the critical level is below the warning level", ctx, param)
    return Threshold(*levels)


class UnknownStatus(LockdiagError):
    """`check` could not decide: the monitoring-plugin UNKNOWN."""

    exit_code = EXIT_UNKNOWN


class CheckCommand(click.Command):
    """Monitoring-plugin exit codes: bad arguments are UNKNOWN (3), not click's usual 2, and
    said in the --format asked for, as every other UNKNOWN is."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        settings = (parent.default_map or {}).get(info_name or "", {}) if parent else {}
        asked = self.format_asked(args, settings.get("fmt", "auto"))  # before click eats args
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            from lockdiag.views.check import unknown_output

            show(unknown_output(error.format_message()), asked)
            raise _UnknownUsage(error.format_message(), error.ctx) from None

    def format_asked(self, args: list[str], default: str) -> str:
        """The last valid --format among arguments that click may not be able to parse."""
        choices = next(p.type for p in self.params if p.name == "fmt")
        assert isinstance(choices, click.Choice)
        asked = default
        for before, arg in itertools.pairwise(["", *args]):
            flag, _, value = arg.partition("=")
            if before == "--format" and arg in choices.choices:
                asked = arg
            elif flag == "--format" and value in choices.choices:
                asked = value
        return asked


class _UnknownUsage(click.UsageError):
    exit_code = EXIT_UNKNOWN


def threshold_option(name: str, default: str, text: str) -> Callable[[F], F]:
    return click.option(
        name,
        callback=_threshold,
        default=default,
        show_default=True,
        metavar="WARN[,CRIT]",
        help=text,
    )


@click.command("check", cls=CheckCommand)
@threshold_option("--session-age", "5m,1h", "A certain session-level advisory lock held this long.")
@threshold_option("--wait-age", "30s,5m", "A session waiting for a lock this long.")
@threshold_option("--idle-age", "1m,10m", "A holder idle in transaction while others wait.")
@threshold_option("--max-blocked", "5,20", "More than N sessions behind one root blocker.")
@click.option(
    "--unregistered",
    type=click.Choice(UNREGISTERED_LEVELS),
    help="A key no registry namespace names: report it (the default: exit 0 for it alone), "
    "warn (exit 1) or ignore it. Default: the registry's unregistered = ..., else report.",
)
@click.option("--no-unregistered", is_flag=True, hidden=True, help="--unregistered ignore.")
@source_options
@registry_option
@formats("markdown", "nagios", "prometheus")
def check_command(
    session_age: Any,
    wait_age: Any,
    idle_age: Any,
    max_blocked: Any,
    unregistered: Unregistered | None,
    no_unregistered: bool,
    registry: str | None,
    fmt: str,
) -> None:
    """Findings against thresholds, for cron and alerting.

    Exit codes follow the monitoring-plugin convention: 0 OK, 1 WARNING, 2 CRITICAL,
    3 UNKNOWN (could not connect, a bad --from, registry or settings file, bad arguments),
    said in every format: the Nagios UNKNOWN line, lockdiag_up 0, a JSON error. Namespaces
    in the registry add their own critical limits (max_hold, max_wait); expect = "session"
    namespaces never raise a session-lock finding.

    \b
    Examples:
      lockdiag check
      lockdiag check --wait-age 10s,1m --format nagios
      lockdiag check --format prometheus > /var/lib/node_exporter/lockdiag.prom
    """
    try:
        if deferred := click.get_current_context().meta.get(SETTINGS_ERROR):
            raise deferred
        names = get_registry(registry, strict=True)  # a verdict without its rules is UNKNOWN
        level = unregistered or ("ignore" if no_unregistered else names.unregistered)
        policy = CheckPolicy(session_age, wait_age, idle_age, max_blocked, level or "report")
        # what the findings need: every lock in a wait, spans of the rest (counted whole)
        analysis = Analysis(policy.analysis_policy(), imports=VIEWS)
        # a single server's error: UNKNOWN below
        readings = get_readings(Aggregated(), names, analysis)
        results = [
            (r.label, r.diagnosis.incident(policy) if r.diagnosis else None, r.reason)
            for r in readings
        ]
        from lockdiag.views.check import STATUS_EXIT, fleet_check_output  # see VIEWS

        output, status = fleet_check_output(results, policy)
        show(output, fmt)
    except LockdiagError as error:
        from lockdiag.views.check import unknown_output

        show(unknown_output(str(error), error.hint), fmt)
        raise UnknownStatus(str(error), error.hint) from None
    except Exception as error:  # a bug: UNKNOWN all the same, the traceback on stderr
        from lockdiag.views.check import unknown_output

        traceback.print_exc()
        message = f"internal error: {type(error).__name__}: {error} (a bug in lockdiag)"
        show(unknown_output(message), fmt)
        raise UnknownStatus(message) from None
    sys.exit(STATUS_EXIT[status])
