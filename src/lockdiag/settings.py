"""The settings file: a person's defaults for the options they repeat, and their named servers.

``$XDG_CONFIG_HOME/lockdiag/settings.toml`` (``$LOCKDIAG_SETTINGS`` names another path; set to
the empty string, no file is read). The command line and the environment win over it; the
CLI hands its values to click as ``default_map`` (:mod:`lockdiag.cli.settings`), which knows
the commands' options. This module knows only the file: where it is, its shape, its targets.
No click here: the root group reads it on every run.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lockdiag.errors import InputError
from lockdiag.registry import config_dir
from lockdiag.registry.reading import read_text, toml_refusal

FILE_NAME = "settings.toml"
ENV_VAR = "LOCKDIAG_SETTINGS"
MAX_SIZE = 256 * 1024  # bytes: a settings file is a few hundred lines of comments at most
MAX_ELEMENTS = 20_000  # values, items and tables: a thousand [targets] take 4,000
DEFAULTS = "defaults"  # the table of settings for every command that has the option
TARGETS = "targets"
EVERY_COMMAND = ("target", "timeout", "registry", "format")  # what [defaults] may set
# The options a settings file may set, where a command has them: the ones people repeat.
# Not --dsn (a server has a name under [targets]), nor what is chosen per look (filters,
# --from, --once) or per action (terminate --yes must be typed each time).
# a line a group (thresholds, then sample and log): kept as grouped
# fmt: off
SETTABLE = (
    *EVERY_COMMAND,
    "session-age", "wait-age", "idle-age", "max-blocked", "unregistered", "no-unregistered",
    "interval", "duration", "prefix", "gap",
)
# fmt: on
TARGET_KEYS = ("dsn", "description")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")


class SettingsError(InputError):
    """The settings file cannot be used; the message names the file and, if known, the line."""


@dataclass(frozen=True)
class TargetEntry:
    """A server by name, as a ``[targets.NAME]`` table says it: ``--target prod`` (the target
    read is a :class:`lockdiag.evidence.Target`, made from its DSN)."""

    name: str
    dsn: str
    description: str = ""

    @property
    def has_password(self) -> bool:
        return dsn_has_password(self.dsn)


@dataclass(frozen=True)
class Settings:
    """The file's tables as read: ``commands`` keeps each command's table as TOML gave it
    (a group's table holds its subcommands' tables), for the CLI to check against the
    command's options."""

    path: Path | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    commands: Mapping[str, Any] = field(default_factory=dict)
    targets: Mapping[str, TargetEntry] = field(default_factory=dict)
    lines: _LineIndex | None = None

    @property
    def read(self) -> bool:
        """Whether a file was read (the default one may be absent)."""
        return self.lines is not None

    def error(
        self, message: str, table: tuple[str, ...] = (), key: str | None = None
    ) -> SettingsError:
        """``settings file PATH line N: message``, N the key's line, else its table's."""
        line = self.lines.find(table, key) if self.lines else None
        return SettingsError(f"{located(self.path, line)}: {message}")

    def target(self, name: str) -> TargetEntry:
        if name in self.targets:
            return self.targets[name]
        if self.path is None:
            raise SettingsError(f"no target {name!r}: {ENV_VAR} is empty, no settings file is read")
        if not self.read:
            raise SettingsError(f"no target {name!r}: there is no settings file {self.path}")
        raise SettingsError(
            f"no target {name!r} in settings file {self.path}{suggestion(name, self.targets)}"
        )

    def exposed_passwords(self) -> list[str]:
        """Targets whose DSN holds a password in a file others can read."""
        exposed = [name for name, target in self.targets.items() if target.has_password]
        if not exposed or self.path is None:
            return []
        return exposed if self.path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO) else []


def settings_path() -> Path | None:
    """Where the settings file is; None when ``LOCKDIAG_SETTINGS`` is set empty (no file)."""
    chosen = os.environ.get(ENV_VAR)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen else None
    return config_dir() / FILE_NAME


def load_settings(commands: Collection[str]) -> Settings:
    """The settings file, its shape checked; empty settings when there is none. ``commands``:
    the command names a table may be named after. A path named by ``LOCKDIAG_SETTINGS`` must
    exist; the default one may be absent."""
    path = settings_path()
    if path is None:
        return Settings()
    if not path.exists() and os.environ.get(ENV_VAR) is None:
        return Settings(path)
    try:
        text = read_text(path, MAX_SIZE, "settings file")
    except InputError as error:
        raise SettingsError(f"{located(path)}: {error}") from None
    except OSError as error:
        raise SettingsError(f"{located(path)}: cannot read: {error.strerror or error}") from None
    refusal = toml_refusal(text, "settings file", MAX_ELEMENTS)
    if refusal is not None:
        raise SettingsError(f"{located(path)}: {refusal}")
    import tomllib  # only when there is a file to read (startup: issue 36)

    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _syntax_error(path, text, str(error)) from None
    return _parse(Settings(path, lines=_LineIndex(text)), document, commands)


def located(path: Path | None, line: int | None = None) -> str:
    return f"settings file {path}" + (f" line {line}" if line else "")


def _syntax_error(path: Path, text: str, message: str) -> SettingsError:
    """tomllib's message with its position moved to the front: ``line 3: invalid value``."""
    message = message[:1].lower() + message[1:]
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)", message)
    if match is None:
        end = " (at end of document)"
        line = max(len(text.splitlines()), 1) if end in message else None
        return SettingsError(f"{located(path, line)}: {message.replace(end, ' (unfinished)')}")
    line = int(match.group(1))
    reason = message[: match.start()] + message[match.end() :]
    twice = re.fullmatch(r"cannot declare \((.*)\) twice", reason)
    if twice is not None:  # tomllib names the table as a Python tuple: ('list',)
        table = tuple(re.findall(r"'([^']*)'", twice.group(1)))
        first = _LineIndex(text).find(table, None)
        earlier = f" (first at line {first})" if first is not None and first != line else ""
        return SettingsError(
            f"{located(path, line)}: table [{'.'.join(table)}] declared again{earlier}: "
            "a table may appear once; put its settings under the first"
        )
    return SettingsError(f"{located(path, line)}: {reason} (column {match.group(2)})")


def _parse(empty: Settings, document: dict[str, Any], commands: Collection[str]) -> Settings:
    for name, value in document.items():
        if not isinstance(value, dict):
            raise empty.error(
                f"{name} is outside any table: settings go under [{DEFAULTS}] or a command's, "
                "e.g. [list]",
                (),
                name,
            )
        if name not in (DEFAULTS, TARGETS, *commands):
            known = (DEFAULTS, TARGETS, *commands)
            raise empty.error(f"unknown table [{name}]{suggestion(name, known)}", (name,), name)
    defaults = document.get(DEFAULTS, {})
    for key in defaults:
        if key not in EVERY_COMMAND:
            more = (
                f"; [{DEFAULTS}] sets {', '.join(EVERY_COMMAND)} (others go in a command's table)"
            )
            raise empty.error(
                f"unknown setting {key!r}{suggestion(key, EVERY_COMMAND) or more}", (DEFAULTS,), key
            )
    targets = {
        name: _target(empty, name, value) for name, value in document.get(TARGETS, {}).items()
    }
    return Settings(
        empty.path,
        defaults,
        {name: value for name, value in document.items() if name not in (DEFAULTS, TARGETS)},
        targets,
        empty.lines,
    )


def _target(settings: Settings, name: str, value: Any) -> TargetEntry:
    table = (TARGETS, name)
    if not isinstance(value, dict):
        raise settings.error(
            f'a target is a table: [targets.{name}] with dsn = "..."', (TARGETS,), name
        )
    if not NAME.match(name):
        raise settings.error(f"target name {name!r}: letters, digits, _ . - only", table)
    for key, item in value.items():
        if key not in TARGET_KEYS:
            raise settings.error(
                f"target {name}: unknown key {key!r}{suggestion(key, TARGET_KEYS)}", table, key
            )
        if not isinstance(item, str):
            raise settings.error(f"target {name}: {key} must be a string", table, key)
    if not value.get("dsn"):
        raise settings.error(f'target {name} has no dsn = "..."', table)
    return TargetEntry(name, value["dsn"], value.get("description", ""))


def dsn_has_password(dsn: str) -> bool:
    """A password in a URI (``user:secret@``) or in key/value form (``password=...``)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        try:
            return bool(urlsplit(dsn).password) or "password=" in dsn
        except ValueError:
            return False
    return re.search(r"(^|\s)password\s*=", dsn) is not None


def hide_password(dsn: str) -> str:
    """The DSN as it may be shown: any password replaced by ``***``."""
    if dsn.startswith(("postgresql://", "postgres://")):
        dsn = re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", dsn)
        return re.sub(r"(password=)[^&]*", r"\1***", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def suggestion(word: str, choices: Collection[str]) -> str:
    """``; did you mean NAME?`` when a choice is close to ``word``, else nothing."""
    nearest = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {nearest[0]}?" if nearest else ""


class _LineIndex:
    """Line numbers of table headers and keys (tomllib gives none for a valid document)."""

    _HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
    _KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_.-]+)\s*=")

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            if header := self._HEADER.match(line):
                table = _dotted(header.group(1))
                self._lines.setdefault(table, number)
            elif key := self._KEY.match(line):
                self._lines.setdefault((*table, *_dotted(key.group(1))), number)

    def find(self, table: tuple[str, ...], key: str | None) -> int | None:
        path = (*table, key) if key is not None else table
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None


def _dotted(text: str) -> tuple[str, ...]:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([^.\s]+)", text)
    return tuple(next(p for p in part if p) if any(part) else "" for part in parts)
