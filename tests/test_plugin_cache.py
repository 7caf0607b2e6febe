"""Plugin discovery is cached (issue 36, startup): the entry points are looked up once and read
from a cache file while no directory on sys.path changed; a plugin installed or removed since is
seen at the next run, and a damaged cache is looked up again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.plugins import install

PROBE = (
    "import sys\n"
    "from lockdiag import plugins\n"
    "print([p.name for p in plugins.loaded()], 'importlib.metadata' in sys.modules)\n"
)
PLUGIN = """\
from lockdiag.plugins import Entry, Key

def entries():
    return [Entry(software="Acme Deploy", kind="deploy", function="pg_advisory_lock",
                  normal="held for the whole deploy", keys=(Key.bigint(4711000001, "deploy"),))]
"""


def run(site: Path, cache: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.strip()


def install_acme(site: Path) -> None:
    """The Acme plugin, installed as pip leaves it."""
    install(site, "acme_plugin", PLUGIN, {"acme": "acme_plugin:entries"})


def test_plugins_are_found_once_then_read_from_the_cache(tmp_path: Path) -> None:
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    cache.mkdir()  # made now: the current directory (tmp_path) is on sys.path too
    assert run(site, cache) == "[] True"  # looked up: the distributions' metadata read
    assert run(site, cache) == "[] False"  # from the cache: no metadata read at all
    install_acme(site)  # a new dist-info directory changes the site directory's time
    assert run(site, cache) == "['acme'] True"
    assert run(site, cache) == "['acme'] True"  # from the cache: the plugin itself loaded
    (written,) = (cache / "lockdiag").iterdir()
    assert json.loads(written.read_text())["points"] == [["acme", "acme_plugin:entries"]]
    written.write_text('{"stamp": ')  # damaged: looked up again, and rewritten
    assert run(site, cache) == "['acme'] True"
    assert json.loads(written.read_text())["points"] == [["acme", "acme_plugin:entries"]]
    for path in sorted((site / "acme_plugin-1.0.dist-info").iterdir()):
        path.unlink()
    (site / "acme_plugin-1.0.dist-info").rmdir()  # uninstalled
    assert run(site, cache) == "[] True"


def test_a_cache_that_cannot_be_written_leaves_the_answer_alone(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_acme(site)
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert run(site, blocked) == "['acme'] True"
    assert run(site, blocked) == "['acme'] True"
