"""Text that may be in another encoding, read as its bytes and decoded here: the one way
lockdiag reads every text a server may hold in an encoding other than the connected database's.

pg_stat_activity's text of a session (its query) is stored in the encoding of that session's
database, and the shared catalogs' names (pg_database.datname, role names) in the encoding of
the database they were created from. lockdiag's session is UTF8
(:data:`lockdiag.pg.connection.CLIENT_ENCODING`), so the server converts every text it sends
from the connected database's encoding: from EUC_JP a UTF-8 '€' fails ("invalid byte
sequence for encoding "EUC_JP""), from SQL_ASCII the bytes are validated as UTF-8 (a LATIN1
database's 'é' fails), from LATIN1 every byte converts, to the wrong characters, and in a UTF8
database nothing is checked (checked on PostgreSQL 15). One such text made the whole read fail.

So the queries send such a text as its bytes, in hex, which every encoding converts:
``encode(decode(quote_literal(x), 'escape'), 'hex')``. It is the one form found that cannot
fail on the server: ``convert_to(x, 'SQL_ASCII')`` first validates x in the database's
encoding (it fails in UTF8 and EUC_JP databases on the very bytes in question), ``textsend``
converts to the client's encoding, ``decode(x, 'escape')`` reads x's backslashes as escapes,
and ``replace()`` cannot double them safely (in an EUC_JP database it steps over characters by
their first byte, and a foreign byte can swallow the backslash after it). quote_literal doubles
each backslash and quote byte by byte (and writes ``E'...'`` when there was a backslash), and
``decode(..., 'escape')`` undoes the backslashes: :func:`raw` takes off the quotes.

The bytes are then decoded in the encoding of the database they come from (a session's
pg_database.encoding); a name first as UTF-8, then in that encoding. Bytes that none explains
(a SQL_ASCII database stores whatever its clients sent; EUC_TW and MULE_INTERNAL have no Python
codec) are shown with U+FFFD and counted (:class:`Texts`), and the snapshot says where
(:func:`undecodable_note`). A query text stored cut at ``track_activity_query_size`` bytes is
clipped to whole characters by the connected database's encoding, not by its own: its last
partial character is dropped, as its own database would, never counted.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from lockdiag.core.records import FieldError

if TYPE_CHECKING:
    from lockdiag.core.model import Session, Snapshot

UTF8 = "utf-8"
# PostgreSQL's server encodings (pg_encoding_to_char) and the Python codec of each. SQL_ASCII
# is no encoding (any bytes): its text is tried as UTF-8, as are EUC_TW and MULE_INTERNAL,
# which Python has no codec for (psycopg's own map is private: psycopg._encodings)
# fmt: off
CODECS = {
    "UTF8": UTF8, "SQL_ASCII": UTF8, "EUC_JP": "euc_jp", "EUC_JIS_2004": "euc_jis_2004",
    "EUC_CN": "gb2312", "EUC_KR": "euc_kr", "LATIN1": "iso8859-1", "LATIN2": "iso8859-2",
    "LATIN3": "iso8859-3", "LATIN4": "iso8859-4", "LATIN5": "iso8859-9", "LATIN6": "iso8859-10",
    "LATIN7": "iso8859-13", "LATIN8": "iso8859-14", "LATIN9": "iso8859-15",
    "LATIN10": "iso8859-16", "ISO_8859_5": "iso8859-5", "ISO_8859_6": "iso8859-6",
    "ISO_8859_7": "iso8859-7", "ISO_8859_8": "iso8859-8", "KOI8R": "koi8-r", "KOI8U": "koi8-u",
    "WIN866": "cp866", "WIN874": "cp874", "WIN1250": "cp1250", "WIN1251": "cp1251",
    "WIN1252": "cp1252", "WIN1253": "cp1253", "WIN1254": "cp1254", "WIN1255": "cp1255",
    "WIN1256": "cp1256", "WIN1257": "cp1257", "WIN1258": "cp1258",
}
# fmt: on
REPLACED = "\ufffd"


def codec(encoding: Any) -> str:
    """The Python codec of a PostgreSQL encoding's name (UTF-8 for none or an unknown one)."""
    return CODECS.get(encoding, UTF8) if isinstance(encoding, str) else UTF8


def raw(value: str) -> bytes:
    """The bytes of a text sent as ``encode(decode(quote_literal(x), 'escape'), 'hex')``."""
    try:
        data = bytes.fromhex(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected the hex of a quoted text, got {value!r:.60}") from None
    start = 2 if data[:2] == b"E'" else 1
    if data[start - 1 : start] != b"'" or data[-1:] != b"'" or len(data) < start + 1:
        raise ValueError(f"expected the hex of a quoted text, got {value!r:.60}")
    return data[start:-1].replace(b"''", b"'")


class Texts:
    """Decodes the texts of one read; ``replaced`` counts those shown with U+FFFD."""

    def __init__(self) -> None:
        self.replaced = 0

    def decoded(
        self, value: Any, *encodings: str, where: str = "text", cut: bool = False
    ) -> str | None:
        """A text sent as its bytes (None stays None), decoded in the first of ``encodings``
        (Python codecs) that reads it whole; else in the first, with U+FFFD for what it cannot
        read. ``cut``: the text may end in part of a character, dropped then, not replaced."""
        if value is None:
            return None
        try:
            data = raw(value)
        except ValueError as error:
            raise FieldError(where, str(error)) from None
        for encoding in encodings:
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                pass
        for encoding in encodings if cut else ():
            try:  # all but an incomplete last character
                return codecs.getincrementaldecoder(encoding)().decode(data, final=False)
            except UnicodeDecodeError:
                pass
        self.replaced += 1
        return data.decode(encodings[0], "replace")

    def session(self, detail: Any) -> Any:
        """A session row's JSON with its texts decoded: the query in its database's encoding
        (``encoding``, taken out; ``cut``, taken out: whether the query may have been cut at
        track_activity_query_size), its database's and role's names as names, its
        application_name too (a background worker's C code sets it), its backend type as
        UTF-8 (the server's own words, but a background worker's may be any bytes)."""
        if not isinstance(detail, dict):
            return detail  # what build_record refuses, with where
        own = codec(detail.pop("encoding", None))
        cut = detail.pop("cut", None) is True
        detail["query"] = self.decoded(detail.get("query"), own, where="session.query", cut=cut)
        for field in ("database", "user", "application_name"):
            detail[field] = self.decoded(detail.get(field), UTF8, own, where=f"session.{field}")
        detail["backend_type"] = self.decoded(
            detail.get("backend_type"), UTF8, where="session.backend_type"
        )
        return detail

    def server(self, detail: Any) -> str:
        """The server row's names decoded in place (``encoding``, the connected database's,
        taken out); returns that database's codec, for its relations' names."""
        if not isinstance(detail, dict):
            return UTF8  # what server_info refuses
        own = codec(detail.pop("encoding", None))
        for field in ("current_user", "database"):
            detail[field] = self.decoded(detail.get(field), UTF8, own, where=f"server.{field}")
        databases = detail.get("databases")
        if isinstance(databases, dict):
            detail["databases"] = {
                oid: self.decoded(name, UTF8, own, where=f"server.databases.{oid}")
                for oid, name in databases.items()
            }
        return own


class RelationName(NamedTuple):
    """A row of relation_names.sql (tests/test_query_rows.py checks its columns against these
    names): a relation's OID, its name's bytes in hex, the database's encoding."""

    oid: int
    name: str
    encoding: str


def relation_names(rows: Iterable[Sequence[Any]]) -> dict[int, str]:
    """The rows of relation_names.sql as names by OID."""
    texts = Texts()
    return {
        int(r.oid): texts.decoded(r.name, codec(r.encoding)) or ""
        for r in map(RelationName._make, rows)
    }


def undecodable_note(snapshot: Snapshot) -> str:
    """The note for a snapshot some of whose text was shown with U+FFFD, naming the databases
    of the sessions it came from (once each)."""
    databases = sorted(
        {
            session.database or "?"
            for session in snapshot.sessions.values()
            if any(REPLACED in (text or "") for text in _texts(session))
        }
    )
    where = "the server"
    if databases:
        where = f"database{'s' if len(databases) > 1 else ''} {', '.join(databases)}"
    return (
        f"text from {where} is not valid UTF-8 (another encoding): shown with replacement "
        f"characters ({REPLACED}, U+FFFD)"
    )


def _texts(session: Session) -> tuple[str | None, ...]:
    return (
        session.query,
        session.application_name,
        session.user,
        session.database,
        session.backend_type,
    )
