"""Server strings made inert wherever they are shown: on a terminal (:func:`clean`), in
Markdown (:func:`md_escape`), in a spreadsheet (:func:`csv_cell`) and in a monitoring plugin's
status line (:func:`plugin_text`). JSON keeps exact values."""

from __future__ import annotations

import re

# what a terminal does not show as itself: control characters (Unicode category Cc), line and
# paragraph separators (Zl, Zp), formatting characters (Cf, as of Unicode 15.1: the soft
# hyphen, zero-width spaces and joiners, direction marks, embeddings, overrides and isolates,
# the byte order mark, tags) and surrogates (Cs, which no output can encode); a test checks
# the list against the running Python's unicodedata
_INVISIBLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    r"\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0001\U000e0020-\U000e007f]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def clean(text: str | None) -> str:
    """A server-provided string made safe to print: no escape sequences, no line breaks,
    nothing invisible. Each such character is written as Python writes it in a string
    literal (``\\x07``, ``\\u200b``; ``\\n``, ``\\e``...), so it can be seen and looked up."""
    if not text:
        return ""
    if text.isprintable():  # the common case, checked in C: no Cc, Cf, Cs, Zl, Zp in it
        return text
    return _INVISIBLE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code <= 0xFF:
        return _NAMED.get(char) or f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def plugin_text(text: str | None) -> str:
    """A monitoring plugin's status text made inert (:func:`clean`), whose ``|`` would start
    its performance data: a name with one (an application's, a relation's, a target's) could
    forge metrics. Each is written ``¦`` (U+00A6), which reads the same to a person."""
    return clean(text).replace("|", "\u00a6")


_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>#!|~])")


def md_escape(text: str) -> str:
    """A server string made inert in Markdown: pipes cannot end a cell, backticks cannot open
    code, brackets and stars cannot make links or emphasis."""
    return _MARKDOWN.sub(r"\\\1", text)


# what makes a spreadsheet (Excel, LibreOffice, Google Sheets) read a cell as a formula: a
# tab or a carriage return first, or = + - @ after any whitespace (" =1+1", "\u00a0=1+1")
_FORMULA = re.compile(r"[\t\r]|\s*[=+\-@]")
_PLAIN_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows and never executes (OWASP's "CSV injection"): a
    text cell that begins with ``=``, ``+``, ``-``, ``@`` (after any Unicode whitespace), a
    tab or a carriage return gets a single quote ``'`` in front (``=HYPERLINK(...)`` is
    written ``'=HYPERLINK(...)``), unless it is entirely a plain decimal number (an optional
    sign, ASCII digits, an optional fraction: ``-12``, ``+3``, ``-0.5``), which a spreadsheet
    reads as that number. Every other text cell, and a value that is not text (an int or a
    float: keys, pids and counts, negative ones too), is written as it is."""
    if (
        isinstance(value, str)
        and not value[:1].isalnum()  # nearly every cell, told apart in C
        and _FORMULA.match(value)
        and not _PLAIN_NUMBER.fullmatch(value)
    ):
        return "'" + value
    return value
