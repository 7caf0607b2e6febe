"""The CLI reference (docs/cli.md), generated from the click commands themselves.

Regenerate with ``python -m lockdiag.cli.reference > docs/cli.md``; a test fails when the file is
not current, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect

import click

from lockdiag.cli import cli


def commands(group: click.Group = cli, prefix: str = "lockdiag") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    context = click.Context(group, info_name=prefix)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None:
            continue
        path = f"{prefix} {name}"
        found.append((path, command))
        if isinstance(command, click.Group):
            found.extend(commands(command, path))
    return found


def _option_row(parameter: click.Parameter) -> str:
    if isinstance(parameter, click.Argument):
        return f"| `{parameter.human_readable_name}` | argument |"
    assert isinstance(parameter, click.Option)
    names = ", ".join(f"`{opt}`" for opt in parameter.opts + parameter.secondary_opts)
    text = (parameter.help or "").replace("|", "\\|").replace("\n", " ")
    if parameter.show_default and parameter.default not in (None, False, ()):
        text += f" (default: `{parameter.default}`)"
    if isinstance(parameter.type, click.Choice):
        text += " Choices: " + ", ".join(f"`{c}`" for c in parameter.type.choices) + "."
    return f"| {names} | {text.strip()} |"


def reference() -> str:
    lines = [
        "# lockdiag command reference",
        "",
        "Generated from the code by `python -m lockdiag.cli.reference > docs/cli.md`; do not edit.",
        "",
    ]
    for path, command in commands():
        lines += [f"## `{path}`", "", "```text"]
        context = click.Context(command, info_name=path, terminal_width=100, max_content_width=100)
        text = inspect.cleandoc(command.help or "").replace("\b\n", "")
        lines += [command.get_usage(context), "", text, "```", ""]
        parameters = [p for p in command.params if p.name != "help"]
        if parameters:
            lines += ["| option | meaning |", "|---|---|"]
            lines += [_option_row(p) for p in parameters]
            lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
