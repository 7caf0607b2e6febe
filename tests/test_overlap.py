"""The imports an answer needs only after its query (the catalogue, the analysis, the findings,
the views) are made on a thread of their own while the server works
(lockdiag.evidence.overlap): the command modules do not load them, the main thread imports
nothing while that thread does, and a module that fails to import there fails where it always
did."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lockdiag.core.model import Aggregated
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import overlap
from lockdiag.pg.connection import APPLICATION_NAME
from lockdiag.pg.session import DiagnosticSession

from helpers.servers import Sessions

# what check, blockers and who-holds need only once the snapshot is read (the catalogue too:
# the query is built from lockdiag.core.ahead's table)
AFTER_THE_QUERY = (
    "lockdiag.core.analysis",
    "lockdiag.core.catalogue",
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
    assert "'lockdiag.core.catalogue.entry'" in said, said  # the catalogue, after the query


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


def test_the_thread_starts_when_the_query_has_gone_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the query is sent the main thread has the interpreter to itself (an importing
    thread beside it made connecting and sending some 20 ms slower at 100k locks)."""
    (tmp_path / "overlap_sent_module.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with overlap.importing(("overlap_sent_module",)) as imports:
        assert not [t for t in threading.enumerate() if t.name == "lockdiag-imports"]
        assert "overlap_sent_module" not in sys.modules
        imports.sent()
        first = imports.thread
        imports.sent()  # a read made again (the full read after an aggregated one): one thread
        assert imports.thread is first is not None
    assert "overlap_sent_module" in sys.modules
    monkeypatch.delitem(sys.modules, "overlap_sent_module")


def test_a_read_that_never_sends_imports_nothing_on_the_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "overlap_unsent_module.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with overlap.importing(("overlap_unsent_module",)) as imports:
        pass  # the connection failed: no query went out
    assert imports.thread is None
    assert "overlap_unsent_module" not in sys.modules


def test_the_session_says_sent_once_connected_and_waits_once_the_rows_are_in(
    cluster: Cluster, sessions: Sessions
) -> None:
    sessions.open("holder").run("SELECT pg_advisory_lock(5)")
    watcher = sessions.open("watcher")
    seen: list[tuple[str, str]] = []
    joined: list[int] = []

    class Meanwhile:
        def sent(self) -> None:  # lockdiag's backend is there, idle: connected, settings checked
            seen.extend(watcher.run(
                "SELECT state, query FROM pg_stat_activity "
                f"WHERE application_name = '{APPLICATION_NAME}'"
            ))  # fmt: skip

        def join(self) -> None:  # the rows are in
            joined.append(len(seen))

    with DiagnosticSession(cluster.dsn()) as session:
        taken = session.snapshot(Aggregated(), meanwhile=Meanwhile())
    assert len(seen) == 1 and joined == [1], (seen, joined)
    state, query = seen[0]
    assert state == "idle" and "pg_settings" in query, seen
    assert any(lock.objid == 5 for lock in taken.locks)
