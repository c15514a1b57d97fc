"""What text other members chose may do on the terminal it is printed to: nothing.

Bodies, display names, topics, summaries and error details come from other members or the
broker. Printed raw, an OSC or CSI sequence retitles, recolours or rewrites the reader's
terminal, and a CR overwrites what the line showed. ``printable`` shows each such character
as literal text (``\\x1b``, ``\\r``, ``\\u202e``) for the human form; ``json_text`` keeps
``--json`` exact JSON (the same values) with no such character raw. Pure: text in, text out.
"""

from __future__ import annotations

import re

# C0, DEL, C1, the line/paragraph separators, the bidi embeddings/overrides/isolates (a
# right-to-left override makes a name read as another), and lone surrogates (unprintable).
_OTHERS = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_IN_LINE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")   # keeps tab and newline
# Outside strings JSON text is ASCII without DEL, so these occur only inside a string,
# where ``\\uXXXX`` is the same character (C0 json.dumps escapes itself).
_IN_JSON = re.compile(f"[{_OTHERS}]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every terminal control character shown as an escape; newline and tab
    are kept only with ``lines`` (a body printed as text, not a table cell)."""
    return (_IN_TEXT if lines else _IN_LINE).sub(_escaped, text)


def json_text(encoded: str) -> str:
    """JSON text (from ``json.dumps(…, ensure_ascii=False)``) with the controls a terminal
    acts on, which JSON allows raw, written as ``\\uXXXX`` instead: the same values."""
    return _IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
