"""The group class of every lockdiag command group: lockdiag's own errors and Ctrl-C become one
message and a documented exit code, never a traceback. Light on purpose: the root group loads
it for ``--help``."""

from __future__ import annotations

from typing import Any

import click

from lockdiag.errors import EXIT_INTERRUPTED, LockdiagError


class LockdiagGroup(click.Group):
    """Turns lockdiag's own errors and Ctrl-C into one message and a documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LockdiagError as error:
            for line in str(error).splitlines() or [type(error).__name__]:
                click.echo(f"lockdiag: error: {line}", err=True)
            if error.hint:
                click.echo(f"lockdiag: hint: {error.hint}", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("lockdiag: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
