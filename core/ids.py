"""ULIDs and client_message_id rules."""

from __future__ import annotations

import os
import re
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ID_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
ULID_PATTERN = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


# Two Crockford characters per 10 bits: 80 random bits are 8 lookups, with no per-character
# loop and no base64 module (ids are minted on the accept hot path, once per send).
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]


def _random_part(rand: bytes) -> str:
    n, p = int.from_bytes(rand, "big"), _PAIRS
    return (p[n >> 70] + p[(n >> 60) & 1023] + p[(n >> 50) & 1023] + p[(n >> 40) & 1023]
            + p[(n >> 30) & 1023] + p[(n >> 20) & 1023] + p[(n >> 10) & 1023] + p[n & 1023])


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
    return _last_time_part + _random_part(rand)


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
