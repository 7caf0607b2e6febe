"""Every example in every --help runs (issue 37).

Each command's "Examples:" block is read from its help (click), and each line is run by bash
(``-o pipefail``, so a pipe's lockdiag counts) on a real pseudo-terminal, as a person would
paste it, in a sandbox folder that holds what the examples name:

- ``incident.json`` and ``./lockdiag.toml`` (where lockdiag looks first) are the shipped
  examples/incident.json and examples/lockdiag.toml, ``ops/lockdiag.toml`` a copy of it;
- the server is the test cluster: libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE)
  points at it, and each DSN an example spells (``postgresql://monitor@db1/app``...) becomes
  its DSN, as does each line of ``fleet.txt``;
- HOME and XDG_CONFIG_HOME are in the sandbox (zsh's completion folder exists there), EDITOR is
  ``true``; files written outside it (``/var/lib/node_exporter``, zsh's ``${fpath[1]}``) are
  written into it; the server logs the log examples name are copies of the cluster's log;
- ADAPTED says what else changes for each example and which exit codes it may end with (those
  its command documents; 130 where a person would press Ctrl-C).

``demo --stop`` runs while ``demo --keep`` keeps running (STOPS), as its comment says.

A new example that no line of ADAPTED describes fails the test: say how it runs.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pexpect
import pytest
from psycopg.conninfo import conninfo_to_dict

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster, free_port

from conftest import Sessions, ctrl_c_reaches_child

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BIN = Path(sys.executable).parent  # where pip put the lockdiag script

# example: (what changes in it, or "" for nothing; exit codes; Ctrl-C after this output)
Adapted = tuple[dict[str, str], frozenset[int], str | None]
OK = frozenset({0})
LONG = {"--duration 60s": "--duration 1s", "--duration 10m": "--duration 1s"}
ADAPTED: dict[str, Adapted] = {
    "lockdiag list --dsn postgresql://monitor@db1/app": ({}, OK, None),
    "lockdiag who-holds tenant_summary 73": ({}, frozenset({0, 1}), None),
    "lockdiag snapshot -o incident.json && lockdiag list --from incident.json": ({}, OK, None),
    "lockdiag key tenant_summary 73        lockdiag decode 4102 73 2": (
        {"73        lockdiag": "73 && lockdiag"},  # two examples side by side
        OK,
        None,
    ),
    "lockdiag blockers": ({}, OK, None),
    "lockdiag blockers --format json | jq '.roots[0]'": ({}, OK, None),
    "lockdiag check": ({}, frozenset({0, 1, 2}), None),  # OK, WARNING, CRITICAL
    "lockdiag check --wait-age 10s,1m --format nagios": ({}, frozenset({0, 1, 2}), None),
    "lockdiag check --format prometheus > /var/lib/node_exporter/lockdiag.prom": (
        {"/var/lib/node_exporter/": ""},
        frozenset({0, 1, 2}),
        None,
    ),
    'eval "$(lockdiag completion bash)"    # in ~/.bashrc': ({}, OK, None),
    "mkdir -p ~/.config/fish/completions": ({}, OK, None),
    'lockdiag completion zsh > "${fpath[1]}/_lockdiag"': ({"${fpath[1]}": "$HOME/zfunc"}, OK, None),
    "lockdiag completion fish > ~/.config/fish/completions/lockdiag.fish": ({}, OK, None),
    "lockdiag decode 4102 73 2": ({}, OK, None),
    "lockdiag decode 4102 73": ({}, OK, None),
    "lockdiag decode -55037190": ({}, OK, None),
    "lockdiag decode 204970145 1222811995 1 --database shop_test": ({}, OK, None),
    "lockdiag decode -1738207498 --dsn postgresql://monitor@db1/app": ({}, OK, None),
    "lockdiag demo": ({}, OK, None),
    # kept until `demo --stop`, run from another terminal once it keeps running (STOPS)
    "lockdiag demo --keep          # then try every command; Ctrl-C to end": (
        {},
        OK,
        "The demo keeps running",
    ),
    "lockdiag demo --stop          # from another terminal": ({}, OK, None),
    "lockdiag demo --offline       # no server needed": ({}, OK, None),
    "lockdiag exporter --dsn postgresql://db1/app --dsn postgresql://db2/app": (
        {"db2/app": "db2/app --listen 127.0.0.1:{port}"},
        frozenset({130}),
        "/metrics for 2 target(s)",
    ),
    "lockdiag exporter --targets fleet.txt --listen 0.0.0.0:9714": (
        {"0.0.0.0:9714": "127.0.0.1:{port}"},  # a free port, not beyond this machine
        frozenset({130}),
        "/metrics for 1 target(s)",
    ),
    "lockdiag key tenant_summary 73": ({}, OK, None),
    "lockdiag key tenant_summary 73 --function pg_advisory_lock": ({}, OK, None),
    "lockdiag key tenant_period 73 2026-11      # a resource of two parts": ({}, OK, None),
    "lockdiag list": ({}, OK, None),
    "lockdiag list --waiting --format json": ({}, OK, None),
    "lockdiag list --namespace tenant_summary --min-age 5m": ({}, OK, None),
    "lockdiag log /var/log/postgresql/postgresql-16-main.log": (
        {"/var/log/postgresql/": ""},
        OK,
        None,
    ),
    "lockdiag log postgresql.csv.1.gz postgresql.csv --since '2026-05-01 03:00'": ({}, OK, None),
    "zcat postgresql-*.log.gz | lockdiag log - --key 'tenant_summary 73'": ({}, OK, None),
    "lockdiag log postgresql.json --format markdown > incident.md": ({}, OK, None),
    'lockdiag pooltest --pooled "port=6432 dbname=app" --direct "dbname=app"': (
        {},
        OK,
        None,
    ),  # both servers the test cluster: no pooler in between
    "lockdiag registry check": ({}, OK, None),
    "lockdiag registry show --registry ops/lockdiag.toml": ({}, OK, None),
    "lockdiag registry check --registry ops/lockdiag.toml": ({}, OK, None),
    "lockdiag registry show --format json": ({}, OK, None),
    "lockdiag sample --duration 60s --interval 250ms": (LONG, OK, None),
    "lockdiag sample --duration 10m --format prometheus > lockdiag-sample.prom": (LONG, OK, None),
    "lockdiag settings init": ({}, OK, None),
    "lockdiag settings show": ({}, OK, None),
    "LOCKDIAG_SETTINGS= lockdiag list      # without the settings file": ({}, OK, None),
    "lockdiag settings init && $EDITOR ~/.config/lockdiag/settings.toml": (
        {
            "lockdiag settings init": "rm -f $XDG_CONFIG_HOME/lockdiag/settings.toml && "
            "lockdiag settings init"
        },  # the example before wrote it: init keeps an existing file
        OK,
        None,
    ),
    "lockdiag settings show --format json": ({}, OK, None),
    "lockdiag snapshot -o incident-$(date +%F-%H%M).json": ({}, OK, None),
    "lockdiag list --from incident.json": ({}, OK, None),
    # 812: the test's idle session holding tenant_summary 73 ({holder}); the first is asked
    # and answered "n" (nothing done: exit 1), the second has no query to cancel (exit 1)
    "lockdiag terminate 812": ({"812": "{holder}"}, frozenset({1}), None),
    "lockdiag terminate 812 --cancel --yes": ({"812": "{holder}"}, frozenset({1}), None),
    # no session of that pid (others' examples read the holder): refused, nothing done
    "lockdiag terminate 812 --yes --force   # a lock whose work runs elsewhere": (
        {"812": "2147483646"},
        frozenset({2}),
        None,
    ),
    "lockdiag watch": ({}, frozenset({0}), "q quit"),
    "lockdiag watch --interval 5s --record incident.jsonl": ({}, frozenset({0}), "q quit"),
    "lockdiag watch --from incident.jsonl": ({}, frozenset({0}), "q quit"),
    "lockdiag watch --once": ({}, OK, None),
    "lockdiag who-holds --key 4102,73": ({}, frozenset({0, 1}), None),
    "lockdiag who-holds tenant_summary 73 --from incident.json --format json": (
        {},
        frozenset({0, 1}),
        None,
    ),
}


STOPS = {"lockdiag demo --keep": "lockdiag demo --stop"}


def examples() -> list[tuple[str, str]]:
    """(command, example line) of every command's help, in the order shown."""
    found: list[tuple[str, str]] = []

    def walk(command: click.Command, path: str) -> None:
        lines = (command.help or "").splitlines()
        starts = [i for i, line in enumerate(lines) if line.strip() in ("Examples:", "Example:")]
        for line in lines[starts[0] + 1 :] if starts else []:
            if not line.strip():
                break
            if line.strip() != "\b":
                found.append((path, line.strip()))
        if isinstance(command, click.Group):
            context = click.Context(command, info_name=path)
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                assert sub is not None
                walk(sub, f"{path} {name}")

    walk(cli, "lockdiag")
    return found


def test_every_example_is_adapted() -> None:
    """No example goes untested, and no adaptation outlives its example."""
    assert sorted({line for _, line in examples()}) == sorted(ADAPTED)


@pytest.fixture
def sandbox(tmp_path: Path, cluster: Cluster) -> dict[str, str]:
    """The folder the examples run in, and their environment."""
    for name in ("incident.json", "lockdiag.toml"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "ops").mkdir()
    shutil.copy(EXAMPLES / "lockdiag.toml", tmp_path / "ops" / "lockdiag.toml")
    (tmp_path / "fleet.txt").write_text(cluster.dsn() + "\n")
    log = cluster.log.read_bytes()
    for name in ("postgresql-16-main.log", "postgresql.csv", "postgresql.json"):
        (tmp_path / name).write_bytes(log)
    for name in ("postgresql.csv.1.gz", "postgresql-1.log.gz"):
        (tmp_path / name).write_bytes(gzip.compress(log))
    home = tmp_path / "home"
    (home / "zfunc").mkdir(parents=True)  # zsh's ${fpath[1]}: the others make their folder
    server = conninfo_to_dict(cluster.dsn())
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PG", "LOCKDIAG_"))},
        "LOCKDIAG_PG_BIN": os.environ.get("LOCKDIAG_PG_BIN", ""),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "EDITOR": "true",
        "TERM": "xterm-256color",
        **{f"PG{key.upper()}": str(server[key]) for key in ("host", "port", "user")},
        "PGDATABASE": str(server["dbname"]),
    }


def run_example(line: str, cwd: Path, env: dict[str, str], until: str | None) -> tuple[int, str]:
    """Bash runs the line on a terminal; Ctrl-C (or q, for watch) once ``until`` shows."""
    child = pexpect.spawn(
        "bash", ["-o", "pipefail", "-c", line], cwd=str(cwd), env=env, timeout=60,
        dimensions=(40, 120), preexec_fn=ctrl_c_reaches_child, encoding="utf-8",
    )  # fmt: skip
    if until is not None:
        child.expect_exact(until)
        if line in STOPS:
            assert run_example(STOPS[line], cwd, env, None)[0] == 0
        else:
            child.send("q" if "watch" in line else "\x03")
    elif line.startswith("lockdiag terminate") and "--yes" not in line:
        child.expect_exact("?")
        child.sendline("n")
    child.expect(pexpect.EOF)
    child.close()
    code = child.exitstatus if child.exitstatus is not None else 128 + (child.signalstatus or 0)
    return code, child.before or ""


def test_every_example_runs(
    sandbox: dict[str, str], tmp_path: Path, cluster: Cluster, sessions: Sessions
) -> None:
    holder = sessions.open("tenant-worker")
    holder.run("SELECT pg_advisory_lock(4102, 73)")  # who-holds finds it held
    groups: dict[str, list[str]] = {}  # each command's examples, in the order shown
    for command, example in examples():  # a subcommand's with its group's: settings init
        groups.setdefault(" ".join(command.split()[:2]), []).append(example)
    # two commands' examples at a time (each command's in order: watch --record before watch
    # --from); the settings file every command reads is written last, alone
    last = groups.pop("lockdiag settings")

    def run_group(lines: list[str]) -> list[tuple[str, frozenset[int], int, str]]:
        return [run_adapted(example, cluster, holder.pid, tmp_path, sandbox) for example in lines]

    with ThreadPoolExecutor(max_workers=2) as pool:
        ran = [outcome for done in pool.map(run_group, groups.values()) for outcome in done]
    ran += run_group(last)
    for line, codes, code, output in ran:
        assert "Traceback" not in output, (line, output)
        assert code in codes, (line, code, output[-2000:])


def run_adapted(
    example: str, cluster: Cluster, holder: int, cwd: Path, env: dict[str, str]
) -> tuple[str, frozenset[int], int, str]:
    """One example as ADAPTED says: the line run, the exit codes it may end with, its exit
    code and its output (nothing run for the stop of a demo kept running: it ran then)."""
    changes, codes, until = ADAPTED[example]
    line = example.split("  #", maxsplit=1)[0].strip()
    if line in STOPS.values():
        return line, codes, 0, ""  # it ran while its demo kept running
    for old, new in changes.items():
        line = line.replace(old, new)
    for spelled in (
        "postgresql://monitor@db1/app",
        "postgresql://db1/app",
        "postgresql://db2/app",
    ):
        line = line.replace(spelled, f"'{cluster.dsn()}'")
    line = line.replace("{holder}", str(holder)).replace("{port}", str(free_port()))
    if line.startswith("lockdiag pooltest"):
        # no pooler in between; another database than the one whose lock who-holds finds
        direct = f"'{cluster.dsn(dbname='template1')}'"
        line = f"lockdiag pooltest --pooled {direct} --direct {direct}"
    code, output = run_example(line, cwd, env, until)
    return line, codes, code, output
