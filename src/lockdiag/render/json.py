"""JSON output by orjson, its items streamed."""

from __future__ import annotations

from typing import Any, TextIO

from lockdiag.render.model import Items, Output


def write_json(output: Output, stream: TextIO) -> None:
    """JSON by orjson. Items (a hundred thousand locks) are streamed one at a time, each
    already encoded by its view when it is bytes, and written in large chunks; a terminal gets
    the whole document indented."""
    import orjson

    head = output.data()
    if head is None:
        return
    if output.items is None or stream.isatty():  # a terminal gets it whole and indented
        if output.items is not None:
            key, items = output.items
            head = {**head, key: [one for item in items() for one in _decoded(item)]}
        indent = orjson.OPT_INDENT_2 if stream.isatty() else 0
        stream.write(orjson.dumps(head, option=indent).decode() + "\n")
        return
    key, items = output.items
    opening = orjson.dumps(head)[:-1]
    chunks = [opening, b"," if head else b"", orjson.dumps(key), b":["]
    raw = getattr(stream, "buffer", None)
    for index, item in enumerate(items()):
        if index:
            chunks.append(b",")
        if type(item) is Items:  # a run of items, some megabyte: written as it is
            _write(stream, raw, chunks, item)
            continue
        chunks.append(item if isinstance(item, bytes) else orjson.dumps(item))
        if len(chunks) > 4096:
            _write(stream, raw, chunks)
    chunks.append(b"]}\n")
    _write(stream, raw, chunks)


def _write(stream: TextIO, raw: Any, chunks: list[bytes], run: bytes = b"") -> None:
    """The chunks joined, and then ``run``, written; the chunks cleared."""
    data = b"".join(chunks)
    chunks.clear()
    if raw is not None:
        stream.flush()
        raw.write(data)
        raw.write(run)
    else:
        stream.write(data.decode())
        stream.write(run.decode())


def _decoded(item: Any) -> list[Any]:
    """An item as data, in a list: several for :class:`Items`."""
    import orjson

    if isinstance(item, Items):
        return list(orjson.loads(b"[" + item + b"]"))
    return [orjson.loads(item) if isinstance(item, bytes) else item]
