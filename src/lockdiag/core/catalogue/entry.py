"""What an entry of the catalogue is written in: a program (:class:`Program`: how it takes its
locks, what holding one means for it, what to check before acting, its fixed keys), the name a
key gets (:class:`Known`), and what confirms a guess (:class:`Signs`)."""

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
class Software:
    """How a piece of software takes its advisory locks, and what is normal for it."""

    kind: SoftwareKind
    function: str  # the lock function it calls, as lockdiag key --function spells it
    normal: str  # one sentence: what holding the lock means for it
    check: str = ""  # what to look at before acting, in its own terms (else its process)

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
