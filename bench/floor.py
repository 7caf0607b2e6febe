"""The least a Python client of the join psql prints can do: connect with psycopg, fetch the
rows as text (no type conversion) and print them aligned. No analysis, no names, no sorting.

    python bench/floor.py DSN SQL

bench/run.py times it beside psql and lockdiag: the floor for target 2 in Python.
"""

from __future__ import annotations

import sys

import psycopg
from psycopg.types.string import TextLoader

TYPES = ("bool", "int2", "int4", "int8", "oid", "inet", "timestamptz")  # the join's non-text


def main() -> None:
    with psycopg.connect(sys.argv[1], autocommit=True) as connection:
        for name in TYPES:
            connection.adapters.register_loader(name, TextLoader)
        cursor = connection.execute(sys.argv[2].encode())
        headers = [column.name for column in cursor.description or ()]
        rows = [["" if value is None else value for value in row] for row in cursor]
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
    template = " | ".join(f"{{:<{width}}}" for width in widths)
    sys.stdout.write("\n".join(template.format(*cells) for cells in [headers, *rows]) + "\n")


if __name__ == "__main__":
    main()
