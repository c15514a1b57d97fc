"""ULIDs and client_message_id rules."""

from __future__ import annotations

import base64
import os
import re
import time

from ulid import ULID, LaxMonotonicPolicy, PureRandomPolicy, ULIDGenerator

_ID_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
ULID_PATTERN = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")

# Fresh random bits in every id, also within one millisecond (python-ulid's default generator
# would count up from the previous id instead): the broker spreads a queue's messages over its
# consumers by the id's tail, and a batch mints all its ids in one millisecond.
_GENERATOR = ULIDGenerator(policy=PureRandomPolicy())
# Outbox rows are sent in (due time, id) order: two sends accepted one after the other in
# one millisecond must sort in that order, so within a millisecond these ids count up.
_ORDERED = ULIDGenerator(policy=LaxMonotonicPolicy())


def new_ulid(now_ms: int | None = None, randomness: bytes | None = None) -> str:
    """Return a 26-character ULID (python-ulid): 48 bits of milliseconds, 80 random bits.

    ``now_ms`` is the caller's clock (an injected one in tests); ``randomness`` (10 bytes)
    makes the id fully determined."""
    if randomness is not None:
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return str(ULID.from_bytes(ms.to_bytes(6, "big") + randomness))
    # The generator, called directly: ULID.from_timestamp would build the id twice. It reads
    # an int as milliseconds and a float as seconds: int() keeps ours milliseconds.
    return str(_GENERATOR.generate(None if now_ms is None else int(now_ms)))


# base64's RFC 4648 alphabet to ULID's Crockford one, letter for letter.
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
                             b"0123456789ABCDEFGHJKMNPQRSTVWXYZ")
_PAD = bytes(4)


def new_ulids(count: int, now_ms: int) -> list[str]:
    """``count`` ULIDs of ``now_ms``, each with 80 fresh random bits, minted together.

    The same ids python-ulid would make from these bytes (a test holds them to its parser),
    at about half the cost each: one ``os.urandom`` and one C-level base32 pass for the lot.
    The broker mints two per send. Each id is 4 zero bytes, 6 of milliseconds and 10 random
    ones: 160 bits, 32 base32 characters of which the first 6 carry only the zero padding and
    the last 26 are the ULID."""
    if count <= 0:
        return []
    ms = now_ms.to_bytes(6, "big")
    rand = os.urandom(10 * count)
    raw = b"".join(_PAD + ms + rand[k:k + 10] for k in range(0, 10 * count, 10))
    text = base64.b32encode(raw).translate(_CROCKFORD).decode("ascii")
    return [text[k + 6:k + 32] for k in range(0, 32 * count, 32)]


def ordered_ulid(now_ms: int | None = None) -> str:
    """A ULID above every earlier one of this process minted in the same millisecond (a
    clock that steps back can still sort it lower: that is the clock's order, not ours)."""
    return str(_ORDERED.generate(None if now_ms is None else int(now_ms)))


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
