"""A hostile database: its owner (no superuser) plants code under every name lockdiag reads to
name well-known keys (views, row-level security policies, index predicates and expressions,
extended statistics, CHECK constraints, a column type with its own cast, functions of their own
added to a trusted extension, an operator class a superuser made from the owner's function).
lockdiag (list, who-holds, check and the exporter), run as a superuser or as a pg_monitor role,
never runs that code: the server log is the proof, and a plain SELECT by another superuser shows
that each plant is live."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner, Result

from lockdiag.cli import cli
from lockdiag.core.findings import CheckPolicy
from lockdiag.demo.cluster import Cluster
from lockdiag.evidence import Target
from lockdiag.exporter import Exporter
from lockdiag.pg.timeout import Timeout
from lockdiag.registry import Registry

from conftest import Sessions

OWNER = "dbowner"  # owns the hostile databases; not a superuser
MONITOR = "monitor"  # a member of pg_monitor, SELECT and UPDATE on every table
READER = "reader"  # a member of pg_monitor with SELECT only
CONTROL = "controller"  # a superuser that reads the tables the ordinary way
ALL_TABLES = ("public.good_jobs", "public.good_job_processes", "public.que_jobs", "pgmq.meta")
KEY = 123456789012  # an advisory key nothing names: it makes lockdiag look at the tables
EVIL = re.compile(r"LOCKDIAG-EVIL (.+) ran as (\S+)")

FUNCTIONS = """
CREATE FUNCTION public.lockdiag_evil(what text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE WARNING 'LOCKDIAG-EVIL % ran as %', what, current_user;
    PERFORM pg_catalog.pg_advisory_lock(31337);
    RETURN true;
END $$;
CREATE FUNCTION public.lockdiag_evil_immutable(what text) RETURNS boolean LANGUAGE plpgsql
IMMUTABLE AS $$
BEGIN
    RAISE WARNING 'LOCKDIAG-EVIL % ran as %', what, current_user;
    RETURN true;
END $$;
CREATE FUNCTION public.lockdiag_evil_compare(bigint, bigint) RETURNS integer LANGUAGE plpgsql
IMMUTABLE AS $$
BEGIN
    IF current_user <> 'dbowner' THEN  -- not at every comparison while the owner builds
        RAISE WARNING 'LOCKDIAG-EVIL operator class ran as %', current_user;
    END IF;
    RETURN pg_catalog.btint8cmp($1, $2);
END $$;
"""

GOOD_JOBS = (
    "CREATE TABLE public.good_jobs (id uuid PRIMARY KEY, concurrency_key text, "
    "created_at timestamptz DEFAULT now(), finished_at timestamptz)"
)
TABLES = [
    GOOD_JOBS,
    "CREATE TABLE public.good_job_processes (id uuid PRIMARY KEY)",
    "CREATE TABLE public.que_jobs (id bigint PRIMARY KEY)",
    "CREATE SCHEMA pgmq",
    "CREATE TABLE pgmq.meta (queue_name varchar PRIMARY KEY)",
]
VIEWS = [
    "CREATE VIEW public.good_jobs AS SELECT gen_random_uuid() AS id, 'k'::text AS concurrency_key,"
    " now() AS created_at, NULL::timestamptz AS finished_at WHERE public.lockdiag_evil('view')",
    "CREATE VIEW public.good_job_processes AS SELECT gen_random_uuid() AS id "
    "WHERE public.lockdiag_evil('view')",
    "CREATE VIEW public.que_jobs AS SELECT 1::bigint AS id WHERE public.lockdiag_evil('view')",
    "CREATE SCHEMA pgmq",
    "CREATE VIEW pgmq.meta AS SELECT 'q'::varchar AS queue_name WHERE public.lockdiag_evil('view')",
]
POLICIES = [
    *TABLES,
    "INSERT INTO public.que_jobs VALUES (1)",  # a policy runs for the rows it filters
    *(
        f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY; "
        f"CREATE POLICY p ON {t} USING (public.lockdiag_evil('policy'))"
        for t in ALL_TABLES
    ),
]
PLANNER = [
    *TABLES,
    # the planner evaluates immutable functions of constants in these, as the querying role
    "CREATE INDEX ON public.good_jobs (id) WHERE public.lockdiag_evil_immutable('index predicate')",
    "CREATE INDEX ON public.que_jobs ((id + 1)) WHERE public.lockdiag_evil_immutable('index')",
    "INSERT INTO public.good_job_processes VALUES (gen_random_uuid())",
    "CREATE STATISTICS s ON (public.lockdiag_evil_immutable('statistics')), (id::text) "
    "FROM public.good_job_processes",
    "ANALYZE public.good_job_processes",
    "ALTER TABLE pgmq.meta ADD CHECK (public.lockdiag_evil_immutable('check constraint'))",
]
TYPES = [
    # a column of the owner's own type, with the owner's cast to bigint
    "CREATE TYPE public.job_id AS ENUM ('1')",
    "CREATE FUNCTION public.job_id_key(public.job_id) RETURNS bigint LANGUAGE plpgsql AS $$ "
    "BEGIN PERFORM public.lockdiag_evil('cast'); RETURN 1; END $$",
    "CREATE CAST (public.job_id AS bigint) WITH FUNCTION public.job_id_key(public.job_id) "
    "AS IMPLICIT",
    "CREATE TABLE public.que_jobs (id public.job_id)",
    "INSERT INTO public.que_jobs VALUES ('1')",
]
EXTENSION = [
    *TABLES,
    # a trusted extension the owner may create (the attack used pgcrypto, which some
    # server builds lack: fuzzystrmatch is in every build of the matrix); its script's objects
    # are the bootstrap superuser's, and the owner adds a function of their own to it
    "CREATE EXTENSION fuzzystrmatch",
    "ALTER EXTENSION fuzzystrmatch ADD FUNCTION public.lockdiag_evil_immutable(text)",
    "CREATE INDEX ON public.good_jobs (id) "
    "WHERE public.lockdiag_evil_immutable('extension index predicate')",
    "CREATE INDEX ON public.que_jobs "
    "((id::text || public.lockdiag_evil_immutable('extension index expression')::text))",
    "INSERT INTO public.good_job_processes VALUES (gen_random_uuid())",
    "CREATE STATISTICS s ON (public.lockdiag_evil_immutable('extension statistics')), "
    "(id::text) FROM public.good_job_processes",
    "ANALYZE public.good_job_processes",
    # the extension's own function stays trusted: pgmq.meta is read
    "CREATE INDEX ON pgmq.meta (public.soundex(queue_name::text))",
]
OPCLASS = [
    # no primary key: the operator class's index is the only one an index scan can use
    "CREATE TABLE public.que_jobs (id bigint)",
    # enough rows for lockdiag's own read (id = ANY(keys)) to be planned as an index scan
    "INSERT INTO public.que_jobs SELECT pg_catalog.generate_series(1, 20000)",
    # a collation the owner made, on a column lockdiag reads
    "CREATE COLLATION public.owned (locale = 'C')",
    "CREATE SCHEMA pgmq",
    "CREATE TABLE pgmq.meta (queue_name varchar COLLATE public.owned)",
]
# only a superuser may create an operator class: one made for the owner, from the owner's
# comparison function (which the owner may replace at will), then used by the owner; the class
# is the superuser's, its support function is not
OPCLASS_ADMIN = [
    "CREATE OPERATOR CLASS public.job_id_ops FOR TYPE bigint USING btree AS OPERATOR 1 <, "
    "OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >, "
    "FUNCTION 1 public.lockdiag_evil_compare(bigint, bigint)",
]
OPCLASS_LATER = [
    "CREATE INDEX ON public.que_jobs (id public.job_id_ops)",
    "ANALYZE public.que_jobs",
]
CLEAN = [
    *TABLES,
    "INSERT INTO public.que_jobs VALUES (4242)",
]
DATABASES = {
    "hostile_views": VIEWS,
    "hostile_policies": POLICIES,
    "hostile_planner": PLANNER,
    "hostile_types": TYPES,
    "hostile_extension": EXTENSION,
    "hostile_opclass": OPCLASS,
    "owned_clean": CLEAN,
}
# run as a superuser, then as the owner again: (superuser's, owner's) statements
LATER = {"hostile_opclass": (OPCLASS_ADMIN, OPCLASS_LATER)}


@pytest.fixture(scope="module")
def hostile(cluster: Cluster) -> Iterator[Cluster]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {OWNER} LOGIN")
        admin.execute(f"CREATE ROLE {MONITOR} LOGIN IN ROLE pg_monitor")
        admin.execute(f"CREATE ROLE {READER} LOGIN IN ROLE pg_monitor")
        admin.execute(f"CREATE ROLE {CONTROL} LOGIN SUPERUSER")
        for database in DATABASES:
            admin.execute(f"CREATE DATABASE {database} OWNER {OWNER}")
    for database, statements in DATABASES.items():
        with psycopg.connect(cluster.dsn(user=OWNER, dbname=database), autocommit=True) as owner:
            owner.execute(FUNCTIONS)
            for statement in statements:
                owner.execute(statement)
            admin_statements, owner_statements = LATER.get(database, ([], []))
            with psycopg.connect(cluster.dsn(dbname=database), autocommit=True) as admin:
                for statement in admin_statements:
                    admin.execute(statement)
            for statement in owner_statements:
                owner.execute(statement)
            owner.execute("CREATE SCHEMA IF NOT EXISTS pgmq")
            for schema in ("public", "pgmq"):
                owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO {MONITOR}, {READER}")
                owner.execute(f"GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {MONITOR}")
                owner.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {READER}")
    yield cluster


def evil_runs(cluster: Cluster) -> list[tuple[str, str]]:
    """(what, as whom) of every planted function the server log shows running."""
    return EVIL.findall(cluster.log.read_text(errors="replace"))


def listed(cluster: Cluster, user: str, database: str) -> Result:
    result = CliRunner().invoke(cli, ["list", "--dsn", cluster.dsn(user=user, dbname=database)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def every_command(cluster: Cluster, user: str, database: str) -> str:
    """What `list` prints, after who-holds, check and one exporter scrape ran there too."""
    dsn = cluster.dsn(user=user, dbname=database)
    for args in (["who-holds", "--key", str(KEY)], ["check"]):
        result = CliRunner().invoke(cli, [*args, "--dsn", dsn])
        assert result.exception is None or isinstance(result.exception, SystemExit), result
        assert "Traceback" not in result.output
    hostile = Target.of(dsn, Timeout(5.0), Registry(), name="hostile")
    exporter = Exporter([hostile], CheckPolicy(), 60.0)
    try:
        assert b'lockdiag_up{target="hostile"} 1.0' in exporter.exposition(["hostile"])
    finally:
        exporter.close()
    return listed(cluster, user, database).stdout


def hold_key(sessions: Sessions, database: str) -> None:
    sessions.open("job", dbname=database).run(f"SELECT pg_advisory_lock({KEY})")


UNTRUSTED = "owned by dbowner, neither built in nor a superuser's: not read"
EXPECTED_NOTES = {
    "hostile_views": [f"{t} is a view: not read" for t in ALL_TABLES],
    "hostile_planner": [
        "public.good_jobs has index public.good_jobs_id_idx that uses function "
        f"public.lockdiag_evil_immutable(text) {UNTRUSTED}",
        "public.que_jobs has index public.que_jobs_expr_idx that uses function "
        "public.lockdiag_evil_immutable(text)",
        "public.good_job_processes has statistics object public.s that uses function "
        "public.lockdiag_evil_immutable(text)",
        "pgmq.meta has constraint meta_check on table pgmq.meta that uses function "
        "public.lockdiag_evil_immutable(text)",
    ],
    "hostile_types": [
        "public.que_jobs has column id of type public.job_id (expected int8 or int4): not read"
    ],
    "hostile_extension": [
        "public.good_jobs has index public.good_jobs_id_idx that uses function "
        f"public.lockdiag_evil_immutable(text) {UNTRUSTED}",
        "public.que_jobs has index public.que_jobs_expr_idx that uses function "
        f"public.lockdiag_evil_immutable(text) {UNTRUSTED}",
        "public.good_job_processes has statistics object public.s that uses function "
        f"public.lockdiag_evil_immutable(text) {UNTRUSTED}",
    ],
    "hostile_opclass": [
        "public.que_jobs has index public.que_jobs_id_idx that uses function "
        f"public.lockdiag_evil_compare(bigint,bigint) {UNTRUSTED}",
        "pgmq.meta has column queue_name under collation owned (not built in): not read",
    ],
}


@pytest.mark.parametrize("user", ["postgres", MONITOR])
@pytest.mark.parametrize("database", list(EXPECTED_NOTES))
def test_planted_code_never_runs_in_lockdiag(
    hostile: Cluster, sessions: Sessions, user: str, database: str
) -> None:
    hold_key(sessions, database)
    before = evil_runs(hostile)
    shown = every_command(hostile, user, database)
    for note in EXPECTED_NOTES[database]:
        assert note in shown, shown
    assert evil_runs(hostile) == before, "a planted function ran in lockdiag's session"


def test_an_extensions_own_functions_stay_trusted(hostile: Cluster, sessions: Sessions) -> None:
    """fuzzystrmatch's soundex() in an index of pgmq.meta: the script's objects are the bootstrap
    superuser's, although a database owner created the extension."""
    hold_key(sessions, "hostile_extension")
    shown = listed(hostile, "postgres", "hostile_extension").stdout
    assert "public.good_jobs has index" in shown, shown
    assert "pgmq.meta" not in shown, shown


def test_row_level_security(hostile: Cluster, sessions: Sessions) -> None:
    hold_key(sessions, "hostile_policies")
    before = evil_runs(hostile)
    # a role to which the policies apply: the tables are skipped, by name
    result = listed(hostile, MONITOR, "hostile_policies")
    for table in ALL_TABLES:
        assert f"{table} has row-level security that applies to this role: not read" in (
            result.stdout
        )
    # a superuser bypasses row-level security: the tables are read and no policy runs
    result = listed(hostile, "postgres", "hostile_policies")
    assert "not read" not in result.stdout
    assert evil_runs(hostile) == before


def test_each_plant_is_live_for_an_ordinary_read(hostile: Cluster) -> None:
    """The control: the same tables read as anyone reads them run the owner's code."""
    reads = {
        "hostile_views": ["SELECT count(*) FROM public.que_jobs"],
        "hostile_planner": ["SELECT count(*) FROM public.good_jobs"],
        "hostile_types": ["SELECT id::bigint FROM public.que_jobs"],
        "hostile_extension": [
            "SELECT count(*) FROM public.good_jobs",
            "SELECT count(*) FROM public.que_jobs",
            "SELECT count(*) FROM public.good_job_processes",
        ],
        # an index scan compares with the class's support function
        "hostile_opclass": ["SELECT id FROM public.que_jobs WHERE id = 7::bigint"],
    }
    for database, queries in reads.items():
        with psycopg.connect(hostile.dsn(user=CONTROL, dbname=database), autocommit=True) as c:
            for query in queries:
                c.execute(query)
    with psycopg.connect(hostile.dsn(user=MONITOR, dbname="hostile_policies")) as c:
        c.execute("SELECT count(*) FROM public.que_jobs")
    wanted = {("view", CONTROL), ("index predicate", CONTROL), ("cast", CONTROL),
              ("policy", MONITOR), ("extension index predicate", CONTROL),
              ("extension index expression", CONTROL), ("extension statistics", CONTROL),
              ("operator class", CONTROL)}  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the log is written by the server, a moment later
        ran = {(what, who) for what, who in evil_runs(hostile) if who in (CONTROL, MONITOR)}
        if wanted <= ran:
            break
        time.sleep(0.1)
    assert wanted <= ran


def test_a_clean_table_is_read_by_a_monitor_that_may_lock_it(
    hostile: Cluster, sessions: Sessions
) -> None:
    sessions.open("que", dbname="owned_clean").run("SELECT pg_advisory_lock(4242)")
    hold_key(sessions, "owned_clean")
    for user in ("postgres", MONITOR):
        result = listed(hostile, user, "owned_clean")
        assert "Que: job 4242" in result.stdout, result.stdout
        assert "not read" not in result.stdout
    # SELECT alone is not enough to lock the table against DDL: skipped, and said why
    result = listed(hostile, READER, "owned_clean")
    assert "Que: job 4242" not in result.stdout
    assert "needs UPDATE, DELETE or TRUNCATE on it; reader has none" in result.stdout


def test_a_table_busy_with_ddl_or_vacuum_is_skipped_without_waiting(
    hostile: Cluster, sessions: Sessions
) -> None:
    sessions.open("que", dbname="owned_clean").run("SELECT pg_advisory_lock(4242)")
    vacuum = sessions.open("ddl", dbname="owned_clean", autocommit=False)
    vacuum.run("LOCK TABLE public.que_jobs IN SHARE UPDATE EXCLUSIVE MODE")
    started = time.monotonic()
    result = CliRunner().invoke(
        cli, ["list", "--timeout", "10s", "--dsn", hostile.dsn(dbname="owned_clean")]
    )
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 8  # NOWAIT: never the 10 s lock_timeout
    assert "not read this time: being vacuumed or altered right now" in result.stdout
    assert "Que: job 4242" not in result.stdout
