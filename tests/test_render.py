"""Rendering: one path for table, plain and JSON; hostile strings neutralised for display."""

from __future__ import annotations

import io
import json

from click.testing import CliRunner

from lockdiag.cli import cli
from lockdiag.demo.cluster import Cluster
from lockdiag.render import Output, Table, Text, clean, plain, render

from helpers.servers import Sessions
from helpers.terminal import Terminal


def test_clean_makes_control_characters_visible() -> None:
    assert clean("ok\x1b[31mred\x1b[0m\nnext\ttab\x07\u202e") == (
        "ok\\e[31mred\\e[0m\\nnext\\ttab\\x07\\u202e"
    )
    assert clean(None) == ""
    assert clean("[bold]markup[/bold]") == "[bold]markup[/bold]"  # rich never parses cells


def test_plain_aligns_columns() -> None:
    text = plain([Table(["A", "LONGER"], [["x", "1"], ["yyyy", "2"]]), Text(["done"])])
    assert text == "A     LONGER\nx     1\nyyyy  2\ndone\n"
    assert plain([Table(["A"], [], title="T", empty="(none)")]) == "T\n(none)\n"


def test_terminal_view_is_capped_with_important_rows_first() -> None:
    rows = [[f"row{i}"] for i in range(500)]
    important = [int(i == 450) for i in range(500)]
    output = Output(lambda: [Table(["NAME"], rows, important=important)], dict)
    terminal = Terminal()
    render(output, "auto", terminal)
    shown = terminal.getvalue()
    assert "row450" in shown
    assert "row499" not in shown
    assert "more row(s) not shown (the most urgent first)" in shown


def test_a_capped_table_without_an_order_of_urgency_claims_none() -> None:
    rows = [[f"row{i}"] for i in range(500)]
    terminal = Terminal()
    render(Output(lambda: [Table(["NAME"], rows)], dict), "auto", terminal)
    shown = " ".join(terminal.getvalue().split())
    assert "more row(s) not shown; --format plain or json gives every row" in shown


def test_json_keeps_exact_values_and_display_escapes_them(
    cluster: Cluster, sessions: Sessions
) -> None:
    worker = sessions.open("placeholder")
    worker.connection.execute(
        "SELECT set_config('application_name', %s, false)", ("evil\x1b]0;pwned\x07[red]x[/red]",)
    )
    worker.run("SELECT pg_advisory_lock(5, 5) /* \x1b[2J\nDROP */")
    runner = CliRunner()
    args = ["who-holds", "--key", "5,5", "--dsn", cluster.dsn()]
    shown = runner.invoke(cli, args).stdout
    assert "\x1b" not in shown and "\x07" not in shown
    # the server keeps printable ASCII only in application_name (up to 15 it puts '?' for the
    # rest, from 16 a literal \x1b escape); markup passes through as text
    assert "evil?]0;pwned?[red]x[/red]" in shown or "evil\\x1b]0;pwned\\x07[red]x[/red]" in shown
    assert "/* \\e[2J\\nDROP */" in shown  # the query's escape and newline, made visible
    document = json.loads(runner.invoke(cli, [*args, "--format", "json"]).stdout)
    (holder,) = document["holders"]
    assert holder["query"] == "SELECT pg_advisory_lock(5, 5) /* \x1b[2J\nDROP */"
    terminal = Terminal()
    render(Output(lambda: [Table(["Q"], [[clean(holder["query"])]])], dict), "table", terminal)
    assert "\x1b[2J" not in terminal.getvalue()


def test_plain_alignment_is_the_one_format_per_row_it_replaces() -> None:
    """Rows sharing all but their first cell reuse the rest as formatted for the row before:
    the text is what one format call per row gives, for tables of one, two and five columns."""
    words = ["", "a", "held", "WAITING", "tenant_summary 73", "x  ", "≥ 5m"]
    for columns in (1, 2, 5):
        headers = [f"H{n}" for n in range(columns)]
        rows: list[list[str]] = []
        for n in range(300):
            if rows and n % 5 < 3:  # the same rest as the row before
                rows.append([words[n % 7], *rows[-1][1:]])
            else:
                rows.append([words[(n * 3 + k * 5) % 7] for k in range(columns)])
        widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
        template = "  ".join([*(f"{{:<{w}}}" for w in widths[:-1]), "{}"])
        expected = [template.format(*cells).rstrip() for cells in [headers, *rows]]
        assert plain([Table(headers, rows)]) == "\n".join(expected) + "\n"


def test_a_table_whose_title_wraps_still_fits_the_screen() -> None:
    """sample's legend is a title of four lines at 80 columns: a screenful counts it so, and
    the verdict above the table stays on screen (it scrolled off when a title was one line)."""
    from rich.console import Console

    from lockdiag.render import STEP, Block, fit_screen
    from lockdiag.render.terminal import rich_renderables

    title = "Per key (" + "; ".join(f"COLUMN {n}: what its figures mean" for n in range(8)) + ")"
    rows = [[f"key {n}", "100%"] for n in range(200)]
    blocks: list[Block] = [
        Text(["sampled 3s"], "verdict", STEP),
        Table(["KEY", "HELD"], rows, title=title, essential={0}),
    ]
    stream = io.StringIO()
    console = Console(file=stream, width=80, height=24, highlight=False, soft_wrap=False)
    for renderable in rich_renderables(fit_screen(blocks, 80, 23), console):
        console.print(renderable)
    drawn = stream.getvalue().splitlines()
    assert len(drawn) <= 23, len(drawn)
    assert drawn[0] == "sampled 3s"


def test_a_screen_counts_the_lines_of_a_group_it_leaves_out() -> None:
    """A group of text blocks (watch's causes) is counted as a table's rows are: one line
    after the group says how many of its lines the screen and the view's own cap left out."""
    from lockdiag.render import DETAIL, STEP, VERDICT, Block, More, Text, fit_screen

    group: list[Block] = [
        Text([f"cause {n}"], "warning", STEP if n < 2 else DETAIL, "c") for n in range(5)
    ]
    blocks: list[Block] = [
        Text(["heading"], "verdict", VERDICT),
        *group,
        Text(["footer"], rank=VERDICT),
    ]
    more = {"c": More("… {n} more cause(s)", before=1)}
    fitted = fit_screen(blocks, 80, 5, cut=None, more=more)
    lines = [line for block in fitted if isinstance(block, Text) for line in block.lines]
    assert lines == ["heading", "cause 0", "cause 1", "… 4 more cause(s)", "footer"]
    whole = fit_screen(blocks, 80, 50, cut=None, more={"c": More("… {n} more")})
    assert [line for b in whole if isinstance(b, Text) for line in b.lines][-1] == "footer"
