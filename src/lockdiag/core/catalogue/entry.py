"""What an entry of the catalogue is written in: a program (:class:`Program`: how it takes its
locks, what holding one means for it, what to check before acting, its fixed keys), the name a
key gets (:class:`Known`), and what confirms a guess (:class:`Signs`). How a program holds its
lock, for advice in its terms: the routines that take each key (:class:`Call`) and the
connection its work runs on when that is not the lock's (:class:`Sibling`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from lockdiag import plugins
from lockdiag.keys import LockTriple
from lockdiag.registry import Candidates

Confidence = Literal["exact", "derived", "corroborated", "guess", "plugin"]

SoftwareKind = plugins.Kind


@dataclass(frozen=True)
class Call:
    """One routine of a program that takes some of its keys, with one lock function: how its
    holder's query shows it (``query``), which keys (by their :attr:`Known.meaning`)."""

    routine: str  # as its users call it: "run_maintenance_proc()"
    function: str  # the lock function it calls, as lockdiag key --function spells it
    keys: tuple[str, ...]  # the meanings of the keys it takes
    query: re.Pattern[str]  # finds the routine in a holder's query text


@dataclass(frozen=True)
class Sibling:
    """The connection a program's work runs on while its lock stays on a connection of its
    own, which waits in state ``holder``: from the same client address, database and user,
    named ``application`` (or as the holder is), connected within ``window`` seconds of the
    holder's ``since`` (negative: before it). ``lasting``: it stays for the whole run, so none
    seen means the run's process is gone; else it comes and goes (one per change), and none
    seen proves nothing."""

    work: str  # what runs there, in the program's words: "migration", "change"
    holder: Literal["idle", "idle in transaction"]
    since: Literal["backend_start", "xact_start"]
    window: tuple[float, float]
    lasting: bool
    stop: str  # what ending the sibling does: the clean way to stop the work
    application: str | None = None  # None: the holder's own application_name
    # the holder's connection only takes the lock: its last query is the lock call on that
    # key (Rails 6.1's lock connection; Rails 7.1's lock is on the migration's connection,
    # whose last query is the migration's own)
    lock_only: bool = False


@dataclass(frozen=True)
class Software:
    """How a piece of software takes its advisory locks, and what is normal for it."""

    kind: SoftwareKind
    function: str  # the lock function it calls, as lockdiag key --function spells it
    normal: str  # one sentence: what holding the lock means for it
    check: str = ""  # what to look at before acting, in its own terms (else its process)
    # what ending the lock's session does while the program works, after "ending it": said
    # wherever ending it is considered (check's next step, terminate's preview)
    ending: str = ""
    # ending the lock's session does not stop the program's work (it runs elsewhere): the
    # exclusion ends while the work goes on, so terminate --yes refuses it without --force
    keeps_working: bool = False
    sibling: Sibling | None = None  # where that work runs, when lockdiag can find it
    calls: tuple[Call, ...] = ()  # the routines that take its keys, when they differ
    # its routines run in the server, each one statement of the session that calls it (an
    # extension's functions): an idle session runs none of them
    in_server: bool = False

    def calls_of(self, meaning: str) -> tuple[Call, ...]:
        """The routines that take the key of that meaning."""
        return tuple(call for call in self.calls if meaning in call.keys)

    @property
    def runs(self) -> bool:
        """A migration or a deploy: ending its session mid-run can leave its record of applied
        changes out of step with the schema."""
        return self.kind in ("migration", "deploy")


# Every built-in program's Software, by name: each Program adds its own when a family module
# declares it, so a Known names its software's behaviour by name alone.
SOFTWARE: dict[str, Software] = {}


@dataclass(frozen=True)
class Known:
    software: str
    meaning: str
    confidence: Confidence
    plugin: str | None = None  # the plugin that declared it (confidence "plugin")
    declared: Software | None = None  # a plugin's software: SOFTWARE names built-ins only
    evidence: str = ""  # what confirmed a guess (confidence "corroborated")

    @property
    def names(self) -> bool:
        """Whether it names the lock: a guess nothing confirms only says what it could be."""
        return self.confidence != "guess"

    @property
    def label(self) -> str:
        if self.plugin is not None:
            return f"{self.software}: {self.meaning} (declared by plugin {self.plugin})"
        if self.confidence == "guess":  # no claim about what it does
            return f"could be {self.software}"
        return f"{self.software}: {self.meaning}"

    @property
    def behaviour(self) -> Software | None:
        """How its software behaves, for advice in its terms; none for a mere guess."""
        if self.confidence == "guess":
            return None
        return self.declared or SOFTWARE.get(self.software)


@dataclass(frozen=True)
class Signs:
    """What confirms a guess-level key of one software: its tables in the lock's database
    (all of them), an application_name it sets (a prefix), or its own words in the query text
    of a session on the key. A software with guess keys and no signs stays "could be"."""

    tables: tuple[str, ...] = ()
    applications: tuple[str, ...] = ()
    query: re.Pattern[str] | None = None


@dataclass(frozen=True)
class Program:
    """One program's entry, from its source (see the known-locks guide): its behaviour and
    advice, its fixed keys by what they mean (``exact``: only it uses them; ``guesses``: small
    numbers other code may pick too, named only when its ``signs`` confirm them), and the
    application_names its sessions set (``sessions``), which name it whatever they hold.
    Declaring it adds its Software to :data:`SOFTWARE`."""

    name: str
    software: Software
    exact: Mapping[LockTriple, str] = field(default_factory=dict)
    guesses: Mapping[LockTriple, str] = field(default_factory=dict)
    signs: Signs | None = None
    sessions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in SOFTWARE:
            raise ValueError(f"two programs of the catalogue are named {self.name!r}")
        SOFTWARE[self.name] = self.software


def _none(_: object) -> dict[LockTriple, Known]:
    return {}


@dataclass(frozen=True)
class Family:
    """The programs of one family, and the keys its formulas compute: per database (from the
    database's name) and from the names the team lists (the registry's ``[known]``)."""

    programs: tuple[Program, ...]
    database_keys: Callable[[str], dict[LockTriple, Known]] = _none
    candidate_keys: Callable[[Candidates], dict[LockTriple, Known]] = _none
