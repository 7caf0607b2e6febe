"""The imports an answer needs only after its query (the analysis, the findings, the views) are
made on a thread of their own while the server works (lockdiag.evidence.overlap): the command
modules do not load them, the main thread imports nothing while that thread does, and a module
that fails to import there fails where it always did."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import overlap

from helpers.servers import Sessions

# what check, blockers and who-holds need only once the snapshot is read
AFTER_THE_QUERY = (
    "lockdiag.core.analysis",
    "lockdiag.core.diagnosis",
    "lockdiag.core.findings",
    "lockdiag.core.graph",
    "lockdiag.core.incident",
    "lockdiag.render",
    "lockdiag.views",
)


def test_the_command_modules_do_not_import_what_the_answer_needs_after_its_query() -> None:
    probe = (
        "import sys, lockdiag.cli.alerts, lockdiag.cli.read, lockdiag.cli.common\n"
        f"print('LOADED', sorted(m for m in sys.modules if m.startswith({AFTER_THE_QUERY!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert "LOADED []" in result.stdout


# every import, by thread: the main thread's while the import thread is alive, and that thread's
WATCHED = """
import sys, threading
meanwhile, imported = [], []
def watch(event, args):
    if event != "import":
        return
    if threading.current_thread().name == "lockdiag-imports":
        imported.append(args[0])
    elif any(t.name == "lockdiag-imports" for t in threading.enumerate()):
        meanwhile.append(args[0])
sys.addaudithook(watch)
import os
leave = os._exit  # how a command that read leaves (lockdiag.cli.ending): no exit handler runs
def said_and_left(code):
    print("MEANWHILE", meanwhile, "IMPORTED", imported, file=sys.stderr, flush=True)
    leave(code)
os._exit = said_and_left
sys.argv = ["lockdiag", *sys.argv[1:]]
from lockdiag.cli import main
main()
"""


@pytest.mark.parametrize(
    "arguments",
    [["check", "--format", "json"], ["blockers", "--format", "json"], ["who-holds", "--key", "5"]],
    ids=lambda arguments: arguments[0],
)
def test_the_answers_modules_are_imported_while_the_server_works_and_only_there(
    cluster: Cluster, sessions: Sessions, arguments: list[str]
) -> None:
    sessions.open("holder").run("SELECT pg_advisory_lock(5)")
    result = subprocess.run(
        [sys.executable, "-c", WATCHED, *arguments, "--dsn", cluster.dsn()],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1, 2), result.stderr
    assert result.stderr, "the command did not leave by os._exit"
    said = result.stderr.splitlines()[-1]
    assert said.startswith("MEANWHILE [] IMPORTED ["), said
    # (importlib.import_module raises no audit event: the modules the thread names are not
    # listed, those they import are)
    assert "'lockdiag.core.findings'" in said, said


def test_a_module_that_fails_to_import_on_the_thread_is_left_to_the_main_thread() -> None:
    interval = sys.getswitchinterval()
    with overlap.importing(("lockdiag.no_such_module", "lockdiag.views.keys")):
        pass
    assert not [t for t in threading.enumerate() if t.name == "lockdiag-imports"]  # joined
    assert "lockdiag.no_such_module" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match=r"lockdiag\.no_such_module"):
        overlap.import_now(("lockdiag.no_such_module",))  # where the main thread meets it
    assert sys.getswitchinterval() == interval


def test_the_reads_error_goes_through_and_the_thread_is_joined() -> None:
    interval = sys.getswitchinterval()
    with (
        pytest.raises(RuntimeError, match="the server went away"),
        overlap.importing(("lockdiag.no_such_module",)),
    ):
        raise RuntimeError("the server went away")
    assert not [t for t in threading.enumerate() if t.name == "lockdiag-imports"]
    assert sys.getswitchinterval() == interval


def test_a_read_on_a_thread_of_its_own_imports_before_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's readers and the exporter's scrapes read on threads: no second importing thread
    beside them, the modules imported before the read."""
    (tmp_path / "overlap_probe_module.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[object] = []

    def read() -> None:
        with overlap.importing(("overlap_probe_module",)):
            seen.append("overlap_probe_module" in sys.modules)
            seen.extend(t.name for t in threading.enumerate() if t.name == "lockdiag-imports")

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    assert seen == [True]
    monkeypatch.delitem(sys.modules, "overlap_probe_module")
