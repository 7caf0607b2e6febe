"""What an entry of the catalogue is written in: a program (:class:`Program`: how it takes its
locks, what holding one means for it, what to check before acting, its fixed keys), the name a
key gets (:class:`Known`), and what confirms a guess (:class:`Signs`); and what an entry
declares beside its keys, everything else derived from it (:mod:`.index`): how each of its
calls holds the lock (:class:`Hold`), the keys of a database's name or of the names a team lists
(``[known]``: :class:`~lockdiag.registry.KnownList`), names the server hashes
(:class:`Hashed`), the tables whose rows name its keys with the SQL that reads them
(:class:`Rows`), the key spaces it uses whole (:class:`Space`), its extension and the advisory
tags its C code takes. For advice in its terms: the connection its work runs on when that is
not the lock's (:class:`Sibling`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from lockdiag import plugins
from lockdiag.keys import Form, LockTriple
from lockdiag.registry import KNOWN_LISTS, Candidates, KnownList, declare_list, withdraw_list

Confidence = Literal["exact", "derived", "corroborated", "guess", "plugin"]

SoftwareKind = plugins.Kind


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
    # its routines run in the server, each one statement of the session that calls it (an
    # extension's functions): an idle session runs none of them
    in_server: bool = False

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


Second = Literal["waits", "polls", "fails", "skips"]


@dataclass(frozen=True)
class Hold:
    """How one call of a program takes its lock (from its source, and where it was run, as
    seen on a real server): the lock functions it calls in order (``pg_try_advisory_lock``
    then ``pg_advisory_lock``: one try, then a wait), which of its keys, and what a second
    caller meets while the lock is held: it ``waits`` in a lock function (a waiter pg_locks
    shows), ``polls`` (tries again every ``interval`` seconds, idle between tries: no waiter
    in pg_locks), ``fails`` (one try, then an error) or ``skips`` (one try, then returns having
    done nothing)."""

    call: str  # what runs: "deploy", "run_maintenance_proc()"
    functions: tuple[str, ...]  # as lockdiag key --function spells them
    second: Second
    # the keys' meanings, as the catalogue names them, where the program has several (none:
    # each of its keys)
    keys: tuple[str, ...] = ()
    note: str = ""  # one sentence: what else is true of the hold
    interval: float | None = None  # seconds between a poller's tries
    # finds the call in its holder's query text, where the program's calls take one key with
    # different functions (pg_partman's run_maintenance() and run_maintenance_proc()): the
    # advice then speaks of the call its holder runs
    query: re.Pattern[str] | None = None

    @property
    def function(self) -> str:
        """The function that holds the lock once the call has it (the last it calls)."""
        return self.functions[-1]

    def named_in(self, query: str) -> bool:
        """Whether a holder's query text runs this call."""
        return self.query is not None and self.query.search(query) is not None

    @property
    def scope(self) -> Literal["session", "xact"]:
        """A transaction lock when every function takes one, else a session lock."""
        return "xact" if all("_xact_" in f for f in self.functions) else "session"


HashForm = Literal["bigint", "pair-prefix", "pair-after-0"]


@dataclass(frozen=True)
class Hashed:
    """A name the program passes to PostgreSQL's hashtext(): the server computes its key, once
    a snapshot, the same in every database. With ``listed``, ``text`` is a template whose
    ``{name}`` takes each name of that ``[known]`` list. ``forms``: the key as a bigint
    (``pg_advisory_lock(hashtext(t))``), the first number of a pair whose second is anything
    (``pair-prefix``), or the second of the pair ``(0, hashtext(t))`` (``pair-after-0``)."""

    text: str
    meaning: str  # may use {name}
    forms: tuple[HashForm, ...] = ("bigint", "pair-prefix")
    listed: str = ""

    def name_of(self, hashed: str) -> str | None:
        """The listed name a hashed string was made of (the text itself for a constant); None
        when the string is not this declaration's."""
        if not self.listed:
            return hashed if hashed == self.text else None
        before, _, after = self.text.partition("{name}")
        if len(hashed) < len(before) + len(after) or not hashed.startswith(before):
            return None
        return hashed[len(before) : len(hashed) - len(after)] if hashed.endswith(after) else None


@dataclass(frozen=True)
class Rows:
    """A table of the program whose rows name its keys, in the database lockdiag connects to.
    lockdiag reads it only after :mod:`lockdiag.pg.trust` has vetted it in the catalog: a plain
    table, no row security for the role, and each of ``columns`` with one of the built-in types
    listed for it. ``sql`` reads those columns of that table alone (``FROM ONLY <table>``) and
    returns rows ``(name text, key bigint)`` for the keys in ``%(keys)s::bigint[]``, at most
    ``%(row_limit)s`` rows of the table (a pair as ``classid << 32 | objid`` with ``form``
    "pair"); every name qualified (the session's search_path is pg_catalog). ``describe`` turns
    a name into (software, meaning) where the software depends on it (pg-boss's versions)."""

    table: str  # schema.name
    columns: Mapping[str, tuple[str, ...]]  # pg_type.typname of each column read
    sql: str
    meaning: str = "{name}"
    form: Literal["bigint", "pair"] = "bigint"
    describe: Callable[[str], tuple[str, str]] | None = None


@dataclass(frozen=True)
class Space:
    """Keys the program takes in a whole space (a bigint's high 32 bits, a pair's first
    number): a namespace of the team in one of ``ids`` meets them (registry check warns)."""

    form: Form
    ids: range
    meaning: str

    @property
    def where(self) -> str:
        low, high = self.ids[0], self.ids[-1]
        if self.form == "bigint":
            return f"high 32 bits {low}..{high}" if high != low else f"high 32 bits {low}"
        return f"first number {low}..{high}" if high != low else f"first number {low}"


@dataclass(frozen=True)
class Program:
    """One program's entry, from its source (see the known-locks guide): its behaviour and
    advice, its fixed keys by what they mean (``exact``: only it uses them; ``guesses``: small
    numbers other code may pick too, named only when its ``signs`` confirm them), and the
    application_names its sessions set (``sessions``), which name it whatever they hold.

    Besides: how each of its calls holds its lock (``holds``); the keys it derives from a
    database's name (``database_keys``) or from the names a team lists under ``[known]``
    (``lists``, computed by ``listed_keys``); names the server hashes (``hashed``); tables
    whose rows name its keys (``rows``); key spaces it uses whole (``spaces``); the extension
    it is (``extension``), and the advisory tags its C code takes, by objsubid (``tags``:
    named only where that extension is installed in the lock's database).

    Declaring it adds it to the catalogue (:mod:`.index`): nothing else needs to name it."""

    name: str
    software: Software
    exact: Mapping[LockTriple, str] = field(default_factory=dict)
    guesses: Mapping[LockTriple, str] = field(default_factory=dict)
    signs: Signs | None = None
    sessions: Mapping[str, str] = field(default_factory=dict)
    holds: tuple[Hold, ...] = ()
    database_keys: Callable[[str], dict[LockTriple, Known]] | None = None
    lists: tuple[KnownList, ...] = ()
    listed_keys: Callable[[Candidates], dict[LockTriple, Known]] | None = None
    hashed: tuple[Hashed, ...] = ()
    rows: tuple[Rows, ...] = ()
    spaces: tuple[Space, ...] = ()
    extension: str = ""
    tags: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in SOFTWARE:
            raise ValueError(f"two programs of the catalogue are named {self.name!r}")
        _declare(self)
        SOFTWARE[self.name] = self.software


# the programs declared, in the catalogue's order; :mod:`.index` derives its tables from them
# and rebuilds them at every change it is told of (it imports this module, not the reverse)
PROGRAMS: list[Program] = []
_CHANGED: list[Callable[[], None]] = []


def on_change(rebuild: Callable[[], None]) -> None:
    """Call ``rebuild`` whenever a program is declared, withdrawn or the order changes."""
    _CHANGED.append(rebuild)


def _declare(program: Program) -> None:
    """Add a program; refused (nothing changed) when a key, a ``[known]`` list, a hashed name
    or a table's columns contradict a program already declared."""
    fixed_keys([*PROGRAMS, program])  # raises on a key claimed twice
    for known in program.lists:
        if KNOWN_LISTS.get(known.name) is not None:
            raise ValueError(f"[known] {known.name} is declared twice")
    table_columns([*PROGRAMS, program])  # raises on a column typed two ways
    hashed = {h.text: p.name for p in PROGRAMS for h in p.hashed}
    for name in (h.text for h in program.hashed):
        if name in hashed:
            raise ValueError(f"hashtext({name!r}) is both {hashed[name]}'s and {program.name}'s")
    PROGRAMS.append(program)
    for known in program.lists:
        declare_list(known)
    _changed()


def withdraw(program: Program) -> None:
    """Take a declared program back out of the catalogue (a test's)."""
    if any(p is program for p in PROGRAMS):
        PROGRAMS[:] = [p for p in PROGRAMS if p is not program]
        for known in program.lists:
            withdraw_list(known.name)
        _changed()
    SOFTWARE.pop(program.name, None)


def order(names: list[str]) -> None:
    """Put the programs named in that order first (the families', as their modules list
    them), the others after them as declared."""
    rank = {name: place for place, name in enumerate(names)}
    PROGRAMS.sort(key=lambda p: rank.get(p.name, len(rank)))
    _changed()


def _changed() -> None:
    for rebuild in _CHANGED:
        rebuild()


def fixed_keys(programs: list[Program]) -> dict[LockTriple, Known]:
    """The exact and guessed keys of ``programs``; a key claimed twice is refused."""
    found: dict[LockTriple, Known] = {}
    for program in programs:
        keys = [(k, Known(program.name, m, "exact")) for k, m in program.exact.items()]
        keys += [(k, Known(program.name, m, "guess")) for k, m in program.guesses.items()]
        for key, known in keys:
            if key in found:
                other = found[key].software
                raise ValueError(f"{key.describe()} is both {other}'s and {program.name}'s")
            found[key] = known
    return found


def table_columns(programs: list[Program]) -> dict[str, dict[str, tuple[str, ...]]]:
    """The tables whose rows ``programs`` read, with each column's built-in types; a table not
    named schema.name, or a column typed two ways, is refused."""
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for program in programs:
        for rows in program.rows:
            schema, dot, name = rows.table.partition(".")
            if not (schema and dot and name) or "." in name:
                raise ValueError(f"{program.name}: table {rows.table!r} is not schema.name")
            columns = found.setdefault(rows.table, {})
            for column, types in rows.columns.items():
                if columns.setdefault(column, types) != types:
                    raise ValueError(f"{rows.table}.{column} is declared with two sets of types")
    return found


@dataclass(frozen=True)
class Family:
    """The programs of one family, declared in its module (the order the catalogue lists
    them in)."""

    programs: tuple[Program, ...]
