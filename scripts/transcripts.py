"""Regenerate the README's transcripts from the bundled incident, so the README never drifts.

    python scripts/transcripts.py           # rewrite README.md in place
    python scripts/transcripts.py --check   # exit 1 and show the difference when it drifted

A transcript is a ```text block whose lines starting with "$ lockdiag" are commands that read
a bundled file (--from examples/...); the lines after each are its output, replaced by what
the command prints today (piped: plain text). A section that ends with a line "..." is kept
to the same number of lines.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```text\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def output_of(command: str) -> list[str]:
    args = shlex.split(command.removeprefix("$ ").split("  #")[0])[1:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKDIAG_", "PG"))}
    env.update({"COLUMNS": "200", "NO_COLOR": "1"})
    result = subprocess.run(
        [sys.executable, "-m", "lockdiag", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    return result.stdout.splitlines()


def regenerate(block: str) -> str:
    lines = block.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not (line.startswith("$ lockdiag") and "--from examples/" in line):
            out.append(line)
            continue
        section = []
        while index < len(lines) and not lines[index].startswith("$ "):
            section.append(lines[index])
            index += 1
        fresh = output_of(line)
        if section and section[-1] == "...":
            fresh = [*fresh[: len(section) - 1], "..."]
        out += [line, *fresh]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a drift")
    options = parser.parse_args()
    text = README.read_text()
    fresh = BLOCK.sub(lambda m: f"```text\n{regenerate(m.group(1))}```", text)
    if not options.check:
        README.write_text(fresh)
        return
    if fresh != text:
        diff = difflib.unified_diff(
            text.splitlines(), fresh.splitlines(), "README.md", "regenerated", lineterm=""
        )
        print("\n".join(diff))
        print("the README's transcripts drifted: run python scripts/transcripts.py")
        sys.exit(1)


if __name__ == "__main__":
    main()
