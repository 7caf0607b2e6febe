"""JSON output by orjson, its items streamed."""

from __future__ import annotations

from typing import Any, TextIO

from lockdiag.render.model import Output


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
            head = {**head, key: [_decoded(item) for item in items()]}
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
        chunks.append(item if isinstance(item, bytes) else orjson.dumps(item))
        if len(chunks) > 4096:
            _write(stream, raw, chunks)
    chunks.append(b"]}\n")
    _write(stream, raw, chunks)


def _write(stream: TextIO, raw: Any, chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    chunks.clear()
    if raw is not None:
        stream.flush()
        raw.write(data)
    else:
        stream.write(data.decode())


def _decoded(item: Any) -> Any:
    import orjson

    return orjson.loads(item) if isinstance(item, bytes) else item
