"""The registry file: every validation error with its line, the search order, the worker API."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster
from lockdiag.errors import InputError
from lockdiag.keys import LockTriple
from lockdiag.registry import (
    RegistryError,
    UnknownNamespace,
    check_file,
    find_registry,
    load_registry,
    parse_registry,
)

GOOD = """\
# shared by the workers and the CLI
[namespaces.tenant_summary]
id = 4102
form = "pair"
description = "Rebuild one tenant's summary"
owner = "reporting"
expect = "xact"
max_hold = "5m"

[namespaces.invoice_export]
id = 7
form = "bigint"
expect = "session"
"""


def errors_of(text: str) -> list[tuple[int | None, str]]:
    registry, problems = parse_registry(text, "r.toml")
    assert registry is None
    return [(p.line, p.message) for p in problems if p.severity == "error"]


def test_good_registry() -> None:
    registry, problems = parse_registry(GOOD, "r.toml")
    assert problems == []
    assert registry is not None
    summary = registry.namespace("tenant_summary")
    assert (summary.id, summary.form, summary.expect, summary.max_hold) == (
        4102,
        "pair",
        "xact",
        300,
    )
    assert summary.owner == "reporting"
    assert registry.namespace("invoice_export").max_hold is None


def test_worker_api_gives_the_arguments_of_the_lock_function() -> None:
    registry, _ = parse_registry(GOOD)
    assert registry is not None
    key = registry.key("tenant_summary", 73)
    assert key.args == (4102, 73)
    assert key.placeholders == "%s, %s"
    assert key.triple == LockTriple(4102, 73, 2)
    export = registry.key("invoice_export", 99)
    assert export.args == ((7 << 32) | 99,)
    assert export.placeholders == "%s"
    assert registry.decode(export.triple) == (registry.namespace("invoice_export"), 99)
    assert registry.decode(LockTriple(4102, 73, 1)) is None  # other form, other lock space


def test_duplicate_id_in_one_form() -> None:
    text = GOOD + "\n[namespaces.again]\nid = 4102\n"
    assert errors_of(text) == [
        (16, "namespace 'again' reuses pair id 4102 of namespace 'tenant_summary'")
    ]


def test_same_id_in_both_forms_is_a_warning() -> None:
    registry, problems = parse_registry(
        GOOD + '\n[namespaces.big]\nid = 4102\nform = "bigint"\n', "r.toml"
    )
    assert registry is not None
    assert [(p.severity, p.line) for p in problems] == [("warning", 16)]
    assert "different lock spaces" in problems[0].message


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("id = 2147483648", 2, "outside int4"),
        ('id = -2147483649\nform = "bigint"', 2, "high 32 bits"),
        ('id = "7"', 2, "id must be an integer"),
        ("id = true", 2, "id must be an integer"),
        ('form = "pair"', 1, "missing id"),
        ('id = 1\ncolour = "red"', 3, "unknown key 'colour'"),
        ('id = 1\nform = "int"', 3, "form must be"),
        ('id = 1\nexpect = "forever"', 3, "expect must be"),
        ('id = 1\nmax_hold = "5 parsecs"', 3, "max_hold: '5 parsecs' is not a duration"),
        ("id = 1\nmax_hold = -5", 3, "max_hold"),
        ("id = 1\nowner = 3", 3, "owner must be a string"),
    ],
)
def test_each_error_names_its_line(body: str, line: int, message: str) -> None:
    (error,) = errors_of(f"[namespaces.n]\n{body}\n")
    assert error[0] == line
    assert message in error[1]


def test_syntax_error_names_its_line() -> None:
    (error,) = errors_of("[namespaces.a]\nid = 1\nid = = 2\n")
    assert error[0] == 3
    assert error[1].startswith("not valid TOML")


def test_unknown_top_level_key_and_bad_name() -> None:
    assert errors_of("colour = 1\n") == [
        (1, "unknown top-level key 'colour' (expected: known, namespaces, poolers, unregistered)")
    ]
    ((line, message),) = errors_of('[namespaces."bad name"]\nid = 1\n')
    assert line == 1
    assert "must start with a letter" in message


def test_unknown_namespace_lists_the_nearest_names() -> None:
    registry, _ = parse_registry(GOOD)
    assert registry is not None
    with pytest.raises(UnknownNamespace, match="did you mean tenant_summary"):
        registry.namespace("tenant_sumary")
    with pytest.raises(UnknownNamespace, match="known namespaces: invoice_export, tenant_summary"):
        registry.namespace("zzz")


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config" / "lockdiag" / "lockdiag.toml"
    config.parent.mkdir(parents=True)
    config.write_text(GOOD)
    assert find_registry() == config
    local = tmp_path / "lockdiag.toml"
    local.write_text(GOOD)
    assert find_registry() == local
    env = tmp_path / "env.toml"
    env.write_text(GOOD)
    monkeypatch.setenv("LOCKDIAG_REGISTRY", str(env))
    assert find_registry() == env
    assert find_registry(str(config)) == config
    with pytest.raises(RegistryError, match="does not exist"):
        find_registry(str(tmp_path / "missing.toml"))


def test_no_registry_is_an_empty_registry() -> None:
    registry = load_registry()
    assert registry.namespaces == {}
    assert registry.decode(LockTriple(1, 2, 2)) is None


def test_load_refuses_a_broken_file_with_every_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[namespaces.a]\nid = 1\ncolour = 2\n[namespaces.b]\nid = 1\n")
    with pytest.raises(RegistryError) as raised:
        load_registry(str(path))
    assert str(raised.value).splitlines() == [
        f"{path}:3: namespace 'a': unknown key 'colour' (allowed: description, expect, "
        "expected_resources, form, id, key, max_hold, max_wait, owner, resource, values)",
    ]
    assert isinstance(raised.value, InputError)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe\x00")
    registry, problems = check_file(path)
    assert registry is None
    assert "cannot read" in problems[0].message


def test_a_registry_found_not_named_says_so_and_its_consoles_wait_to_be_named(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A lockdiag.toml in the working directory (a clone, a shared folder: anyone's) is used,
    and every run says so; the PgBouncer consoles it names are not connected to (a planted
    DSN collected a password from ~/.pgpass) until the file is named. The user's own config
    directory's file is said too, and read whole."""
    listener = socket.create_server(("127.0.0.1", 0))  # a planted "console": who calls it?
    listener.settimeout(0.1)
    console = f"host=127.0.0.1 port={listener.getsockname()[1]} dbname=pgbouncer connect_timeout=2"
    planted = f'[namespaces.t]\nid = 4102\n\n[poolers]\npgbouncer = ["{console}"]\n'
    (tmp_path / "lockdiag.toml").write_text(planted)

    def called() -> bool:
        try:
            listener.accept()[0].close()
        except TimeoutError:
            return False
        return True

    runner = CliRunner()
    try:
        found = runner.invoke(cli, ["list", "--dsn", cluster.dsn(), "--timeout", "2s"])
        assert found.exit_code == 0, found.output
        path = tmp_path / "lockdiag.toml"
        assert f"registry {path} (found in the working directory" in found.stderr
        assert "[poolers] PgBouncer console(s) not read (1)" in found.stderr
        assert not called()
        named = runner.invoke(
            cli, ["list", "--dsn", cluster.dsn(), "--timeout", "2s", "--registry", str(path)]
        )
        assert "found in" not in named.stderr and "not read (1)" not in named.stderr
        assert called()  # named, its console is read (this one never answers: a note says so)
        (tmp_path / "lockdiag.toml").unlink()
        mine = tmp_path / "config" / "lockdiag" / "lockdiag.toml"  # XDG_CONFIG_HOME (conftest)
        mine.parent.mkdir(parents=True)
        mine.write_text(planted)
        own = runner.invoke(cli, ["list", "--dsn", cluster.dsn(), "--timeout", "2s"])
        assert f"registry {mine} (found in your config directory" in own.stderr
        assert called()
    finally:
        listener.close()
