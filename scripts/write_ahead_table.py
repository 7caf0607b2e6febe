"""Write src/lockdiag/core/ahead_table.py from the catalogue (see lockdiag.core.ahead): run it
after changing a program's keys, hashed names, tables or extensions; tests/test_ahead.py
fails until it is run."""

from __future__ import annotations

from pathlib import Path

from lockdiag.core import ahead, ahead_table


def main() -> None:
    where = Path(ahead_table.__file__)
    text = ahead.render()
    if where.read_text(encoding="utf-8") == text:
        print(f"{where}: already up to date")
        return
    where.write_text(text, encoding="utf-8")
    print(f"{where}: written")


if __name__ == "__main__":
    main()
