"""ULIDs and client_message_id rules."""

from __future__ import annotations

import base64
import os
import re
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ID_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
ULID_PATTERN = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


# RFC 4648 base32 to Crockford's alphabet: 80 random bits are exactly 16 characters, so the
# random part needs no per-character loop (ids are minted on the accept hot path).
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode())


def _time_part(ms: int) -> str:
    out = []
    for _ in range(10):
        out.append(_CROCKFORD[ms & 31])
        ms >>= 5
    return "".join(reversed(out))


_last_ms, _last_time_part = -1, ""


def new_ulid(now_ms: int | None = None, randomness: bytes | None = None) -> str:
    """Return a 26-character ULID: 48 bits of milliseconds, 80 random bits."""
    global _last_ms, _last_time_part
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    if ms != _last_ms:
        _last_ms, _last_time_part = ms, _time_part(ms)
    rand = os.urandom(10) if randomness is None else randomness
    return _last_time_part + base64.b32encode(rand).translate(_TO_CROCKFORD).decode("ascii")


def client_message_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a client_message_id, or None when it can.

    Ids are 1-255 printable ASCII characters. Leading or trailing spaces are refused because
    an ``Idempotency-Key`` header cannot carry them faithfully.
    """
    if not _ID_PATTERN.fullmatch(value):
        return "must be 1-255 printable ASCII characters"
    if value != value.strip(" "):
        return "must not start or end with a space"
    return None
