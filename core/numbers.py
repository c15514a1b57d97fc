"""Integers read from text a caller wrote: query parameters, headers, Content-Length.

``str.isdigit`` accepts ``²`` and other scripts' digits that ``int`` then refuses, and
``int`` refuses more than 4,300 digits: both were 500s. Here a number is 1 to 19 ASCII
digits (no sign, no space), so it always fits SQLite's 64-bit integers, and one out of its
range is a 400 naming the parameter.
"""

from __future__ import annotations

import re

from tidemesh.core.errors import InvalidRequest

MAX_DIGITS = 19
# The largest id or cursor a caller may name: what every table's INTEGER holds, with room.
MAX_ID = 2**62

_DECIMAL = re.compile(rb"[0-9]{1,%d}" % MAX_DIGITS)


def decimal(text: str | bytes) -> int | None:
    """The value of ``text`` when it is 1-19 ASCII digits, else None."""
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return int(raw) if _DECIMAL.fullmatch(raw) else None


def bounded(text: str | bytes, name: str, lo: int, hi: int) -> int:
    """``decimal(text)`` within ``lo``..``hi``; else a 400 naming ``name``."""
    value = decimal(text)
    if value is None or not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be an integer from {lo} to {hi}", field=name)
    return value
