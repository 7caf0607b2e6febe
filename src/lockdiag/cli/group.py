"""The group class of every lockdiag command group: lockdiag's own errors and Ctrl-C become one
message and a documented exit code, never a traceback; a mistyped command gets a "did you
mean". Light on purpose: the root group loads it for ``--help``."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Any

import click
from click.exceptions import NoSuchCommand

from lockdiag.cli.ending import forget
from lockdiag.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, LockdiagError


class LockdiagGroup(click.Group):
    """Turns lockdiag's own errors and Ctrl-C into one message and a documented exit code.
    A command typed with underscores (``who_holds``) is the command (``who-holds``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        typed = args[0]
        names = self.list_commands(ctx)
        if typed not in names and typed.replace("_", "-") in names:
            args = [typed.replace("_", "-"), *args[1:]]
        try:
            return super().resolve_command(ctx, args)
        except NoSuchCommand as error:  # click's suggestions look in self.commands: empty when lazy
            raise NoSuchCommand(typed, possibilities=names, ctx=ctx) from error

    def main(self, *args: Any, **kwargs: Any) -> Any:
        forget()  # the answer a run before this one kept (the tests run many in a process)
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone before the last bytes: said here, as below
            return result
        except LockdiagError as error:
            for line in str(error).splitlines() or [type(error).__name__]:
                click.echo(f"lockdiag: error: {line}", err=True)
            if error.hint:
                click.echo(f"lockdiag: hint: {error.hint}", err=True)
            ctx.exit(error.exit_code)
        except (KeyboardInterrupt, click.Abort):  # click's prompts turn Ctrl-C into Abort
            click.echo("lockdiag: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise
            stopped_reading()
            ctx.exit(EXIT_BROKEN_PIPE)


def stopped_reading() -> None:
    """The reader of standard output went away (``lockdiag list | head``): nothing more is
    written, silently, and what Python would still flush at exit goes nowhere. The exit code
    is a process's killed by SIGPIPE (141), whatever was being written: the output is cut
    short, and a pipeline with pipefail says so, as it does for ``yes | head``."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
