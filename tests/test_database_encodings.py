"""No other database's bytes can fail lockdiag's read (issue 44, item 4). pg_stat_activity's text
of a session in another database is in THAT database's encoding, and the shared catalogs' names
(databases, roles) in the encoding of the database they were created from; lockdiag's session
is UTF8, so the server converts every text from the connected database's encoding (from EUC_JP:
a UTF-8 '€' fails), or from SQL_ASCII validates it as UTF-8 (a LATIN1 'é' fails). Connected
to any of these databases, every command sees every holder and waiter of every database, with
each text decoded in its own database's encoding (and U+FFFD, with one note, only for bytes no
encoding explains: a SQL_ASCII database's LATIN1)."""

from __future__ import annotations

import codecs
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockdiag.core.records import FieldError
from lockdiag.demo.cluster import Cluster
from lockdiag.pg.raw_text import CODECS, Texts, codec, raw
from lockdiag.pg.session import DiagnosticSession

from helpers.cli import run_without_traceback
from helpers.servers import Sessions, Worker

ROLE = "rôle_€"  # a role whose name is UTF-8, created from a UTF8 database
NAMED = "données_日本"  # a UTF8 database whose name is not ASCII
DATABASES = {
    "enc_utf8": "UTF8",
    "enc_sql_ascii": "SQL_ASCII",
    "enc_euc_jp": "EUC_JP",
    "enc_latin1": "LATIN1",
}
OWNED = [
    "CREATE TABLE public.que_jobs (id bigint PRIMARY KEY)",
    "CREATE FUNCTION public.plus(bigint) RETURNS bigint IMMUTABLE LANGUAGE sql AS 'SELECT $1'",
    f'ALTER FUNCTION public.plus(bigint) OWNER TO "{ROLE}"',
    "CREATE INDEX ON public.que_jobs (public.plus(id))",
]
UNTRUSTED = (
    "public.que_jobs has index public.que_jobs_plus_idx that uses function public.plus(bigint) "
    f"owned by {ROLE}, neither built in nor a superuser's: not read"
)
KEY = 4404000  # the key of each database's holder and waiter: KEY + its place below
REPLACED = "\ufffd"
ESCAPES = r"{} /* €\' '' \\ \101 */"


@dataclass(frozen=True)
class Scene:
    """A holder and a waiter in one database, and what each one's query sends: text (through a
    UTF8 client, converted by the server) or raw bytes (into SQL_ASCII)."""

    database: str
    user: str  # the holder's role
    holder: str | bytes
    waiter: str | bytes
    shown_holder: str  # the holder's query as lockdiag must show it
    shown_waiter: str


def scenes() -> list[Scene]:
    def lock(place: int) -> str:
        return f"SELECT pg_advisory_lock({KEY + place})"

    utf8 = f"{lock(0)}, '€ é 日本' AS note"
    euc = f"{lock(1)}, '日本 é' AS note"  # EUC_JP has no '€'
    latin1 = f"{lock(2)}, 'é' AS note"  # LATIN1 has neither '€' nor '日本'
    ascii_utf8 = f"{lock(3)}, '€ 日本' AS note"
    named = f"{lock(4)}, '日本 €' AS note"
    return [
        # a backslash and a quote after a character EUC_JP lacks (its first byte, read as
        # EUC_JP, would take the backslash for its second)
        Scene("enc_utf8", ROLE, utf8, ESCAPES.format(lock(0)), utf8, ESCAPES.format(lock(0))),
        # ROLE cannot log in there: the server refuses its UTF-8 name as EUC_JP
        Scene("enc_euc_jp", "postgres", euc, f"{lock(1)} /* 日本 */", euc, f"{lock(1)} /* 日本 */"),
        Scene("enc_latin1", ROLE, latin1, f"{lock(2)} /* déjà */", latin1, f"{lock(2)} /* déjà */"),
        # SQL_ASCII stores what it is sent: UTF-8 bytes, and a LATIN1 client's 'é' (0xE9),
        # which no encoding of the database explains
        Scene(
            "enc_sql_ascii",
            ROLE,
            ascii_utf8.encode(),
            f"{lock(3)} /* é */".encode("latin1"),
            ascii_utf8,
            f"{lock(3)} /* {REPLACED} */",
        ),
        Scene(NAMED, ROLE, named, f"{lock(4)} /* € */", named, f"{lock(4)} /* € */"),
    ]


@pytest.fixture(scope="module")
def encoded(cluster: Cluster) -> Iterator[Cluster]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{ROLE}" LOGIN')
        for database, encoding in DATABASES.items():
            admin.execute(
                f"CREATE DATABASE {database} TEMPLATE template0 ENCODING '{encoding}' "
                "LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        admin.execute(f'CREATE DATABASE "{NAMED}"')
    # a software table whose index uses a function ROLE owns: named in a note (trust.py); the
    # statements go as their bytes (a UTF8 client cannot write ROLE's name in LATIN1)
    with psycopg.connect(
        cluster.dsn(dbname="enc_latin1", client_encoding="SQL_ASCII"), autocommit=True
    ) as owner:
        for statement in OWNED:
            owner.execute(statement.encode())
    yield cluster
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        for database in [*DATABASES, NAMED]:
            admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
        admin.execute(f'DROP ROLE "{ROLE}"')


def connect(cluster: Cluster, sessions: Sessions, database: str, user: str, name: str) -> Worker:
    # the server converts a UTF8 client's text into the database's encoding; into SQL_ASCII it
    # stores the bytes sent as they are
    encoding = "SQL_ASCII" if database == "enc_sql_ascii" else "UTF8"
    connection = psycopg.connect(
        cluster.dsn(user=user, dbname=database, application_name=name, client_encoding=encoding),
        autocommit=True,
    )
    worker = Worker(connection, connection.info.backend_pid, name)
    sessions.workers.append(worker)  # ended by pid with the others
    return worker


def send(worker: Worker, query: str | bytes) -> None:
    worker.connection.execute(query.encode() if isinstance(query, str) else query)


@pytest.fixture
def waits(encoded: Cluster, sessions: Sessions) -> dict[str, tuple[Worker, Worker]]:
    """In each database, a holder idle after its query and a waiter behind it."""
    found = {}
    for scene in scenes():
        holder = connect(encoded, sessions, scene.database, scene.user, "holder")
        send(holder, scene.holder)
        waiter = connect(encoded, sessions, scene.database, "postgres", "waiter")
        waiter.thread = threading.Thread(target=wait, args=(waiter, scene.waiter), daemon=True)
        waiter.thread.start()
        sessions.waiting(waiter)
        found[scene.database] = (holder, waiter)
    return found


# queries longer than track_activity_query_size (1024 bytes: 1023 kept), cut in the middle of a
# character (of 3 bytes in UTF-8, 2 in EUC_JP): in another database the server clips them by
# the connected database's encoding, not their own
LONG = {
    "enc_utf8": (f"SELECT pg_advisory_lock({KEY + 5}), '", "€"),
    "enc_euc_jp": (f"SELECT pg_advisory_lock({KEY + 6}), 'x", "日"),
}


@pytest.fixture
def long_queries(encoded: Cluster, sessions: Sessions) -> dict[int, tuple[str, str]]:
    """pid: (the start of its query, the character repeated after it)."""
    found = {}
    for database, (start, character) in LONG.items():
        holder = connect(encoded, sessions, database, "postgres", "long")
        send(holder, start + character * 600 + "'")
        found[holder.pid] = (start, character)
    return found


def wait(worker: Worker, query: str | bytes) -> None:
    try:
        send(worker, query)
    except psycopg.Error as error:  # ended by the fixture
        worker.error = error


NOTE = (
    "text from database enc_sql_ascii is not valid UTF-8 (another encoding): shown with "
    "replacement characters (\ufffd, U+FFFD)"
)


@pytest.mark.parametrize("connected", [*DATABASES, NAMED])
def test_every_command_sees_every_database_from_each(
    encoded: Cluster,
    waits: dict[str, tuple[Worker, Worker]],
    long_queries: dict[int, tuple[str, str]],
    connected: str,
    tmp_path: Path,
) -> None:
    dsn = encoded.dsn(dbname=connected)
    pids = {pid for pair in waits.values() for pid in (pair[0].pid, pair[1].pid)}

    result = run_without_traceback("list", "--format", "json", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    locks = {lock["pid"]: lock for lock in document["locks"] if lock["pid"] in pids}
    assert set(locks) == pids  # every holder and every waiter, of every database
    for scene in scenes():
        holder, waiter = waits[scene.database]
        held, waiting = locks[holder.pid], locks[waiter.pid]
        assert held["granted"] and not waiting["granted"]
        assert waiting["waits_for"] == [holder.pid]
        assert held["database"] == waiting["database"] == scene.database
        assert held["user"] == scene.user and waiting["user"] == "postgres"
        assert held["query"] == scene.shown_holder
        assert waiting["query"] == scene.shown_waiter
    shown = {lock["pid"]: lock["query"] for lock in document["locks"]}
    for pid, (start, character) in long_queries.items():  # whole characters, none replaced
        assert shown[pid].startswith(start), shown[pid]
        assert set(shown[pid][len(start) :]) == {character}, shown[pid]
        assert len(shown[pid]) > 300
    # once, naming only that database; and ROLE's name where the owners of software tables are
    notes = sorted([NOTE, UNTRUSTED] if connected == "enc_latin1" else [NOTE])
    assert sorted(document["notes"]) == notes, document["notes"]

    holder, waiter = waits["enc_utf8"]
    result = run_without_traceback("who-holds", "--key", str(KEY), "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert f"{holder.pid}" in result.stdout and f"{waiter.pid}" in result.stdout
    assert "'€ é 日本' AS note" in result.stdout and ROLE in result.stdout

    result = run_without_traceback("blockers", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    for holder, waiter in waits.values():
        assert str(holder.pid) in result.stdout and str(waiter.pid) in result.stdout

    result = run_without_traceback(
        "check", "--wait-age", "1ms,1h", "--format", "nagios", "--dsn", dsn
    )
    assert result.exit_code == 1, result.output  # the waits, as a WARNING: not UNKNOWN

    result = run_without_traceback("watch", "--once", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert all(str(pid) in result.stdout for pid in pids), result.stdout

    saved = tmp_path / "snapshot.json"
    result = run_without_traceback("snapshot", "-o", str(saved), "--dsn", dsn)
    assert result.exit_code == 0, result.output
    saved_sessions = json.loads(saved.read_text(encoding="utf-8"))["sessions"]
    queries = {session["pid"]: session["query"] for session in saved_sessions}
    for scene in scenes():
        holder, waiter = waits[scene.database]
        assert queries[holder.pid] == scene.shown_holder
        assert queries[waiter.pid] == scene.shown_waiter

    holder, waiter = waits[NAMED]
    result = run_without_traceback(
        "terminate", str(holder.pid), "--dsn", dsn
    )  # no terminal: the preview only
    assert result.exit_code == 2 and "not confirmed" in result.stderr, result.output
    assert f"pid {holder.pid} (holder)" in result.stdout
    assert f"holds up 1 session(s): {waiter.pid}" in result.stdout
    assert holder.connection.execute("SELECT 1").fetchone() == (1,)  # nothing done

    # the names `log --dsn` gives the databases of a server log's lines
    with DiagnosticSession(dsn) as session:
        here, databases, _ = session.names([])
    assert set(databases.values()) >= {*DATABASES, NAMED}
    assert here is not None and databases[here] == connected


@pytest.mark.parametrize("connected", ["enc_euc_jp", NAMED])
def test_pooltest_reads_the_pools_names(
    encoded: Cluster, waits: dict[str, tuple[Worker, Worker]], connected: str
) -> None:
    """pooltest's probe through the pool reads the database's and the role's names as their
    bytes too, and its direct snapshot sees every database's sessions: the holder of that
    database (connected from the pool's address) is the evidence it refuses to destroy."""
    user = "postgres" if connected == "enc_euc_jp" else ROLE
    dsn = encoded.dsn(user=user, dbname=connected)
    result = run_without_traceback(
        "pooltest", "--pooled", dsn, "--direct", encoded.dsn(dbname=connected)
    )
    assert result.exit_code == 2, result.output
    holder, _ = waits[connected]
    place = 1 if connected == "enc_euc_jp" else 4
    assert f"pid {holder.pid} holds unregistered bigint {KEY + place}" in result.output


# what the queries send for a text that may be in another encoding (raw_text.py)
AS_BYTES = "pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal({}), 'escape'), 'hex')"


@given(st.binary(max_size=64).filter(lambda data: b"\0" not in data))
def test_any_bytes_come_back_as_they_are(encoded: Cluster, data: bytes) -> None:
    """Whatever bytes a text holds (quotes, backslashes, escapes, any high byte), the form the
    queries send gives them back unchanged: in a SQL_ASCII database a text may be any bytes."""
    dsn = encoded.dsn(dbname="enc_sql_ascii", client_encoding="SQL_ASCII")
    with psycopg.connect(dsn, autocommit=True) as connection:
        text = "pg_catalog.convert_from(%s, 'SQL_ASCII')"
        row = connection.execute(f"SELECT {AS_BYTES.format(text)}", (data,)).fetchone()
    assert row is not None  # a SQL_ASCII session's text comes as bytes from psycopg
    assert raw(bytes(row[0]).decode("ascii")) == data


def test_decoding_and_what_is_not_the_form_sent() -> None:
    texts = Texts()
    # quote_literal's form: E'...' when a backslash was doubled, every quote doubled
    hexed = rb"E'caf\xe9 \\ ''x'''".replace(rb"\xe9", b"\xe9").hex()
    assert raw(hexed) == rb"caf\xe9 \\ 'x'".replace(rb"\xe9", b"\xe9")
    assert texts.decoded(hexed, codec("LATIN1")) == "café \\\\ 'x'"
    assert texts.replaced == 0
    assert texts.decoded(hexed, codec("SQL_ASCII")) == f"caf{REPLACED} \\\\ 'x'"
    assert texts.replaced == 1  # counted: the snapshot's note
    assert texts.decoded(b"'\xe9'".hex(), "utf-8", "iso8859-1") == "é"  # a name's second try
    # a query cut short in the middle of its last character: dropped only when it may be cut
    cut = ("'" + "€€").encode()[:-1] + b"'"
    assert texts.decoded(cut.hex(), "utf-8", cut=True) == "€"
    assert texts.decoded(cut.hex(), "utf-8") == f"€{REPLACED}"
    assert texts.decoded(None, "utf-8") is None
    for bad in ("zz", "'x'", b"x".hex(), b"'".hex(), 7):  # a hostile server's
        with pytest.raises(FieldError, match=r"^session\.query: "):
            texts.decoded(bad, "utf-8", where="session.query")
    assert all(codecs.lookup(name) for name in CODECS.values())
    assert codec("EUC_TW") == codec(None) == codec(3) == "utf-8"  # no Python codec: UTF-8
