"""The layout's rules, checked: layers import one way, the worker-facing modules stay light,
and the root group's help lines agree with the commands they load lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click
import pytest

from lockdiag.cli import COMMANDS, cli
from lockdiag.pg import queries

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "lockdiag"


def imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def files_importing(prefix: str) -> set[str]:
    return {
        str(path.relative_to(PACKAGE).parent)
        for path in PACKAGE.rglob("*.py")
        if any(name == prefix or name.startswith(prefix + ".") for name in imported(path))
    }


def test_psycopg_only_in_the_server_layer_the_demo_and_the_worker_drivers() -> None:
    # worker/drivers: the adapters of the connections workers call the helpers with
    assert files_importing("psycopg") <= {"pg", "demo", "worker/drivers"}


WORKER_MAY_IMPORT = ("lockdiag.errors", "lockdiag.keys", "lockdiag.registry", "lockdiag.worker")
DRIVERS = {"psycopg", "psycopg2", "sqlalchemy", "asyncpg", "django"}


def test_the_worker_package_stays_worker_facing() -> None:
    """The rules, events and executors import no driver, each driver module only its own
    family's, and the package reaches below the worker-facing modules only to read a PgBouncer
    console (poolers)."""
    modules = sorted((PACKAGE / "worker").rglob("*.py"))
    assert len(modules) > 5, "the worker package has moved"
    for path in modules:
        names = imported(path)
        below = {
            n for n in names if n.startswith("lockdiag.") and not n.startswith(WORKER_MAY_IMPORT)
        }
        assert below <= ({"lockdiag.pg.pgbouncer"} if path.name == "poolers.py" else set()), path
        family = {path.stem} if path.parent.name == "drivers" else set()
        assert {n.split(".")[0] for n in names} & DRIVERS <= family, path


CATALOGUE_MAY_IMPORT = ("lockdiag.keys", "lockdiag.registry", "lockdiag.plugins")
FAMILIES = ("migrations", "queues", "schedulers", "libraries", "extensions")


def test_the_catalogues_entries_stand_apart_from_its_decoder() -> None:
    """The catalogue is pure (keys, registry, plugins, the snapshot's model); a family module
    holds entries and their formulas, and imports only what an entry is written in."""
    room = PACKAGE / "core" / "catalogue"
    assert {p.stem for p in room.glob("*.py")} >= set(FAMILIES), "the catalogue has moved"
    for path in room.glob("*.py"):
        ours = {n for n in imported(path) if n.startswith("lockdiag.")}
        inside = {n.removeprefix("lockdiag.core.catalogue.") for n in ours if "catalogue." in n}
        outside = ours - {f"lockdiag.core.catalogue.{n}" for n in inside}
        assert all(n.startswith(CATALOGUE_MAY_IMPORT) for n in outside - {"lockdiag.core.model"})
        if path.stem in FAMILIES:
            assert inside <= {"entry", "formulas"}, path
            assert "lockdiag.core.model" not in outside, path


def test_a_program_is_declared_once() -> None:
    from lockdiag.core.catalogue import SOFTWARE, Program, Software

    sqitch = SOFTWARE["Sqitch"]
    with pytest.raises(ValueError, match="named 'Sqitch'"):
        Program("Sqitch", Software("deploy", "pg_advisory_lock", "a second Sqitch"))
    assert SOFTWARE["Sqitch"] is sqitch


# modules others are still splitting into rooms (issue 38): the lead empties this list
OVER_600_FOR_NOW: set[str] = set()
# files whose '# fmt: skip' lines are still to be formatted or explained (issue 38)
FMT_SKIP_FOR_NOW: set[str] = set()


def test_no_module_over_600_lines_and_no_unexplained_fmt_skip() -> None:
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).as_posix()
        lines = path.read_text().splitlines()
        assert len(lines) <= 600 or name in OVER_600_FOR_NOW, name
        if name in FMT_SKIP_FOR_NOW:
            continue
        for number, line in enumerate(lines):
            # kept only where a comment just above says why (a block: above its '# fmt: off')
            if "# fmt: skip" in line or line.strip() == "# fmt: off":
                assert lines[number - 1].lstrip().startswith("#"), f"{name}:{number + 1}"
    for name in OVER_600_FOR_NOW:  # an allowance no longer needed goes
        assert len((PACKAGE / name).read_text().splitlines()) > 600, f"{name}: drop its allowance"


# findings' modules in the order they may import each other: no cycle, no arrow back
FINDINGS_ROOM = ("model", "words", "programs", "waits", "holders", "names", "stalled", "report")


def test_the_findings_are_a_room_that_imports_one_way() -> None:
    room = PACKAGE / "core" / "findings"
    assert {p.stem for p in room.glob("*.py")} == {"__init__", *FINDINGS_ROOM}, "findings moved"
    for position, stem in enumerate(FINDINGS_ROOM):
        ours = {n for n in imported(room / f"{stem}.py") if n.startswith("lockdiag.core.findings")}
        before = {f"lockdiag.core.findings.{name}" for name in FINDINGS_ROOM[:position]}
        assert ours <= before, (stem, ours - before)


def test_the_registry_reads_one_way() -> None:
    """model, reading, namespaces, validation, discovery: each imports only those before it,
    and the registry only keys, durations and errors besides (workers import it)."""
    order = ("model", "reading", "namespaces", "validation", "discovery")
    for position, stem in enumerate(order):
        ours = {n for n in imported(PACKAGE / "registry" / f"{stem}.py") if "lockdiag" in n}
        before = {f"lockdiag.registry.{name}" for name in order[:position]}
        allowed = {"lockdiag.keys", "lockdiag.durations", "lockdiag.errors", *before}
        assert ours <= allowed, (stem, ours - allowed)


LOG_ROOM = ("lines", "messages", "formats", "events", "tally", "report")  # the order data moves


def test_the_log_reader_is_a_room_of_its_own() -> None:
    """Each module of logs imports only those before it (no cycle, no arrow back), besides
    errors and keys; only report reads core (the catalogue and analysis) and the registry; and
    core, the pure layer, does not read logs."""
    room = PACKAGE / "logs"
    assert {p.stem for p in room.glob("*.py")} == {"__init__", *LOG_ROOM}, "the log room moved"
    for position, stem in enumerate(LOG_ROOM):
        ours = {n for n in imported(room / f"{stem}.py") if n.startswith("lockdiag.")}
        before = {f"lockdiag.logs.{name}" for name in LOG_ROOM[:position]}
        allowed = {"lockdiag.errors", "lockdiag.keys", *before}
        if stem == "report":
            allowed |= {"lockdiag.core.analysis", "lockdiag.core.catalogue", "lockdiag.registry"}
        assert ours <= allowed, (stem, ours - allowed)
    assert not {n for n in imported(room / "lines.py") if n.startswith("lockdiag")}
    assert not files_importing("lockdiag.logs") & {"core", "pg", "worker", "registry"}


# the order data moves (overlap: the imports made while a read waits for the server)
EVIDENCE_ROOM = ("target", "reading", "overlap", "reader", "source", "paced")
EVIDENCE_MAY_IMPORT = (
    "lockdiag.core",
    "lockdiag.pg",
    "lockdiag.errors",
    "lockdiag.durations",
    "lockdiag.keys",
    "lockdiag.registry",
)


def test_the_evidence_room_sits_between_the_server_and_the_commands() -> None:
    """Each module of evidence imports only those before it, besides core, pg and the
    worker-facing modules; only the commands, the exporter and the Python API import it (pg,
    core and views are below it)."""
    room = PACKAGE / "evidence"
    assert {p.stem for p in room.glob("*.py")} == {"__init__", *EVIDENCE_ROOM}, "evidence moved"
    for position, stem in enumerate(EVIDENCE_ROOM):
        ours = {n for n in imported(room / f"{stem}.py") if n.startswith("lockdiag.")}
        before = {f"lockdiag.evidence.{name}" for name in EVIDENCE_ROOM[:position]}
        outside = {n for n in ours - before if not n.startswith(EVIDENCE_MAY_IMPORT)}
        assert not outside, (stem, outside)
    assert files_importing("lockdiag.evidence") <= {".", "cli", "exporter", "evidence"}


def constructed(path: Path, names: set[str]) -> list[str]:
    """Where a file calls one of these classes by name (``Name(...)`` or ``module.Name(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)
            if name in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    return found


def test_only_the_evidence_room_opens_a_session_or_builds_a_diagnosis() -> None:
    """One way from a target to a diagnosis: outside evidence/, nothing constructs a
    DiagnosticSession (evidence.reader.open_session does) or a Diagnosis (evidence.reading's
    diagnose does)."""
    wanted = {"DiagnosticSession", "Diagnosis"}
    outside = [
        site
        for path in sorted(PACKAGE.rglob("*.py"))
        if "evidence" not in path.relative_to(PACKAGE).parts
        for site in constructed(path, wanted)
    ]
    assert outside == []
    inside = [
        site for path in (PACKAGE / "evidence").glob("*.py") for site in constructed(path, wanted)
    ]
    assert sorted(site.split()[-1] for site in inside) == [
        "Diagnosis",
        "Diagnosis",
        "Diagnosis",
        "DiagnosticSession",
    ], inside


def test_click_only_in_the_cli() -> None:
    assert files_importing("click") == {"cli"}


def test_rich_only_where_things_are_drawn() -> None:
    users = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(name.split(".")[0] == "rich" for name in imported(path))
    }
    assert users <= {"render/terminal.py", "cli/screen.py"}


RENDER_ROOM = ("model", "inert", "text", "json", "screen", "terminal")


def test_the_renderers_are_a_room_that_imports_one_way() -> None:
    """Each module of render imports only those before it, and nothing else of lockdiag."""
    room = PACKAGE / "render"
    assert {p.stem for p in room.glob("*.py")} == {"__init__", *RENDER_ROOM}, "render moved"
    for position, stem in enumerate(RENDER_ROOM):
        ours = {n for n in imported(room / f"{stem}.py") if n.startswith("lockdiag")}
        before = {f"lockdiag.render.{name}" for name in RENDER_ROOM[:position]}
        assert ours <= before, (stem, ours - before)


@pytest.mark.parametrize("layer", ["core", "views"])
def test_core_and_views_never_talk_to_a_server_or_the_cli(layer: str) -> None:
    for path in (PACKAGE / layer).rglob("*.py"):
        names = imported(path)
        assert not any(n.startswith(("lockdiag.pg", "lockdiag.cli", "psycopg")) for n in names), (
            path
        )


WORKER_FACING = {"lockdiag.errors", "lockdiag.durations", "lockdiag.keys", "lockdiag.registry"}


def test_the_worker_facing_modules_import_nothing_below_them() -> None:
    modules = [PACKAGE / name for name in ("errors.py", "durations.py", "keys.py")]
    registry = sorted((PACKAGE / "registry").glob("*.py"))
    assert registry, "the registry package has moved"
    for path in modules + registry:
        outside = {
            n
            for n in imported(path)
            if n.startswith("lockdiag.")
            and n not in WORKER_FACING
            and not n.startswith("lockdiag.registry.")
        }
        assert not outside, path


def test_importing_the_registry_loads_no_heavy_module() -> None:
    probe = (
        "import sys, lockdiag.registry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'click', 'rich') "
        "or m.startswith(('lockdiag.core', 'lockdiag.pg', 'lockdiag.views', 'lockdiag.cli'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_help_loads_no_command_module() -> None:
    probe = (
        "import sys; from lockdiag.cli import main; sys.argv = ['lockdiag', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'"
        " or m.startswith(('lockdiag.pg', 'lockdiag.core', 'lockdiag.views'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert "LOADED []" in result.stdout


# psycopg made unimportable (None in sys.modules: `import psycopg` raises ImportError)
NO_DRIVER = (
    "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_binary'] = None\n"
    "from lockdiag.cli import main; sys.argv = ['lockdiag', *sys.argv[1:]]; main()"
)
INCIDENT = str(Path(__file__).parents[1] / "examples" / "incident.json")


@pytest.mark.parametrize(
    "arguments",
    [
        ["list", "--from", INCIDENT],
        ["list", "--from", INCIDENT, "--format", "json"],
        ["who-holds", "--from", INCIDENT, "--key", "1"],
        ["blockers", "--from", INCIDENT],
        ["check", "--from", INCIDENT],
        ["watch", "--from", INCIDENT, "--once"],
        ["--help"],
        ["--version"],
    ],
    ids=lambda arguments: " ".join(a for a in arguments if a != INCIDENT),
)
def test_reading_a_file_needs_no_database_driver(arguments: list[str]) -> None:
    """psycopg is imported only where a server is contacted: without it, every command that
    reads a file answers as usual (check's exit codes 1 and 2 are its verdicts)."""
    result = subprocess.run(
        [sys.executable, "-c", NO_DRIVER, *arguments], capture_output=True, text=True, check=False
    )
    assert result.returncode in (0, 1, 2), result.stderr
    assert "Traceback" not in result.stderr and "psycopg" not in result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("fmt", ["json", "prometheus"])
def test_check_imports_prometheus_client_only_to_write_series(fmt: str) -> None:
    """prometheus_client and its http.server cost 25 ms of a check's start: loaded for
    --format prometheus only. What is loaded is looked at as the process ends: a command
    that read leaves through os._exit (lockdiag.cli.ending), after its output."""
    probe = (
        "import os, sys; from lockdiag.cli import main\n"
        f"sys.argv = ['lockdiag', 'check', '--from', {INCIDENT!r}, '--format', {fmt!r}]\n"
        "def loaded():\n    print('LOADED', 'prometheus_client' in sys.modules, flush=True)\n"
        "leave = os._exit\n"
        "os._exit = lambda code: (loaded(), leave(0))\n"
        "try:\n    main()\nexcept SystemExit:\n    loaded()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert f"LOADED {fmt == 'prometheus'}" in result.stdout


def test_lazy_help_lines_are_the_commands_own() -> None:
    context = click.Context(cli)
    for name, (_, line) in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=1000) == line, name


def test_every_query_file_is_listed_and_every_listed_file_exists() -> None:
    on_disk = {path.name for path in (PACKAGE / "pg" / "queries").glob("*.sql")}
    listed = {file for versions in queries.VERSIONS.values() for _, file in versions}
    assert on_disk == listed
    used = "".join(path.read_text() for path in (PACKAGE / "pg").rglob("*.py"))
    for name in queries.VERSIONS:
        assert f'"{name}"' in used, f"query {name} is never used"


def test_every_data_file_is_packaged() -> None:
    """A non-editable install (pip install .) carries only what package-data names: every
    query file must match one of its patterns."""
    import fnmatch

    import tomllib

    patterns = tomllib.loads((PACKAGE.parent.parent / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-data"]["lockdiag"]
    for path in PACKAGE.rglob("*.sql"):
        relative = str(path.relative_to(PACKAGE))
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


def test_every_package_says_what_it_holds_and_may_import() -> None:
    """A newcomer opens a package's __init__ first: its docstring says what the package holds
    and what it may import."""
    for init in [PACKAGE / "__init__.py", *PACKAGE.glob("**/__init__.py")]:
        if "__pycache__" in init.parts:
            continue
        words = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
        assert "may import" in words.lower() or "imports only" in words, init
    for directory in PACKAGE.rglob("*"):
        if directory.is_dir() and any(directory.glob("*.py")):
            assert (directory / "__init__.py").exists(), f"{directory}: a package without __init__"


TESTS = Path(__file__).resolve().parent


def test_tests_share_their_helpers_from_one_place() -> None:
    """A test module imports what it shares from ``tests/helpers/``, never ``conftest`` nor
    another test module (each helper is written once, and says what it is)."""
    modules = {path.stem for path in TESTS.glob("*.py")}  # conftest and the test modules
    helpers = sorted((TESTS / "helpers").glob("*.py"))
    assert len(helpers) > 5, "the helpers package has moved"
    for path in [*TESTS.glob("*.py"), *helpers]:
        wrong = {name.split(".")[0] for name in imported(path)} & modules
        assert not wrong, f"{path.name} imports {sorted(wrong)}: share it from tests/helpers/"
    for path in helpers:
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), path.name
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                assert ast.get_docstring(node), f"{path.name}: {node.name} says nothing"
