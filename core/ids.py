"""ULIDs and client_message_id rules."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

from ulid import ULID, PureRandomPolicy, ULIDGenerator

_ID_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
ULID_PATTERN = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")

# Fresh random bits in every id, also within one millisecond (python-ulid's default generator
# would count up from the previous id instead): the broker spreads a queue's messages over its
# consumers by the id's tail, and a batch mints all its ids in one millisecond.
_GENERATOR = ULIDGenerator(policy=PureRandomPolicy())


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


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Any byte to the Crockford character of its low five bits: 256 is a multiple of 32, so a
# random byte gives a uniformly random character.
_FIVE_BITS = bytes(ord(_CROCKFORD[b & 31]) for b in range(256))
# Any 10 bits to their two Crockford characters.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]


def _eight_chars(n: int) -> str:
    """40 bits as 8 Crockford characters."""
    return _PAIRS[n >> 30] + _PAIRS[(n >> 20) & 1023] + _PAIRS[(n >> 10) & 1023] + _PAIRS[n & 1023]


def _stamp(ms: int) -> str:
    """A ULID's first 10 characters: its 48 bits of milliseconds (50 with two leading zeros)."""
    return _PAIRS[ms >> 40] + _eight_chars(ms & (2**40 - 1))


def new_ulids(count: int, now_ms: int) -> list[str]:
    """``count`` ULIDs of ``now_ms``, each with 80 fresh random bits, minted together.

    The same ids python-ulid would make from these bits (a test holds them to its parser),
    about fifteen times cheaper each: the 10 characters of the time are made once, and the
    16 random characters of every id come from one ``os.urandom`` and one C-level
    ``bytes.translate`` that maps each byte to the character of its low five bits. The
    broker mints two per send."""
    if count <= 0:
        return []
    stamp = _stamp(now_ms)
    tails = os.urandom(16 * count).translate(_FIVE_BITS).decode("ascii")
    return [stamp + tails[k:k + 16] for k in range(0, 16 * count, 16)]


def derived_ulid(ms: int, source: str) -> str:
    """A ULID of ``ms`` whose 80 other bits are a hash of ``source``: the same source always
    gives the same id (an inbox entry's id, from its sender and client_message_id, is the
    same in an inbox rebuilt from the broker)."""
    bits = int.from_bytes(hashlib.blake2b(source.encode("utf-8"), digest_size=10).digest(),
                          "big")
    return _stamp(min(max(ms, 0), 2**48 - 1)) + _eight_chars(bits >> 40) + _eight_chars(
        bits & (2**40 - 1))


# Outbox rows are sent in (due time, id) order: two sends accepted one after the other in
# one millisecond must sort in that order, so within a millisecond these ids count up from
# the last one: (its millisecond, its 80 random bits).
_last_ordered = [-1, 0]
_ordered_lock = threading.Lock()


class _RandomPool:
    """Fresh random bits for new milliseconds, drawn from os.urandom 4 KiB at a time: one
    call per id released the GIL on the daemon's event loop, which then waited for the
    writer thread to hand it back (py-spy: 5 % of the loop under bench/e2e). Used under
    ``_ordered_lock``."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.data = b""
        self.at = 0

    def bits_79(self) -> int:
        """79 random bits: 80 with the top one clear."""
        if self.at + 10 > len(self.data):
            self.data, self.at = os.urandom(self.size), 0
        self.at += 10
        return int.from_bytes(self.data[self.at - 10:self.at], "big") >> 1


_pool = _RandomPool()


_LOW_40 = 2**40 - 1
# The 18 characters an id shares with the ids minted just before it: its millisecond and the
# top 40 of its 80 random bits, which rarely change within a millisecond. Made once for each
# pair; a lone send mints one id per request. Replaced whole, so a reader sees one pair.
_prefix_of: tuple[int, int, str] = (-1, -1, "")


def _prefix(ms: int, hi: int) -> str:
    global _prefix_of
    cached_ms, cached_hi, text = _prefix_of
    if cached_ms != ms or cached_hi != hi:
        text = _stamp(ms) + _eight_chars(hi)
        _prefix_of = (ms, hi, text)
    return text


def _claim(count: int, now_ms: int | None) -> tuple[int, int]:
    """The millisecond and the first of ``count`` counter values no id of this process has
    had in it."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else int(now_ms)
    with _ordered_lock:
        last_ms, last = _last_ordered
        start = last + 1 if ms == last_ms else _pool.bits_79()
        _last_ordered[0] = ms
        _last_ordered[1] = start + count - 1
    return ms, start


def ordered_ulids(count: int, now_ms: int | None = None) -> list[str]:
    """``count`` ULIDs, ascending, each above every earlier one of this process minted in
    the same millisecond (a clock that steps back can still sort them lower: that is the
    clock's order, not ours). python-ulid's monotonic policy does the same one id at a time
    at ~6 µs each, 12 % of the daemon's event loop under ``send_batch`` (py-spy); here a
    batch costs one ``os.urandom`` and string lookups. A new millisecond starts from fresh
    random bits with the top one clear, so its ids can count up without running out."""
    if count <= 0:
        return []
    ms, start = _claim(count, now_ms)
    # After the time, the 80 random bits: two runs of 8, the first of which rarely changes.
    out = []
    hi_done, prefix = -1, ""
    for r in range(start, start + count):
        hi = r >> 40
        if hi != hi_done:
            hi_done, prefix = hi, _prefix(ms, hi)
        out.append(prefix + _eight_chars(r & _LOW_40))
    return out


def ordered_ulid(now_ms: int | None = None) -> str:
    """One id of ``ordered_ulids`` (the same counter), without the list: 1.3 µs against
    2.7 µs (timeit, best of 7, one run), and py-spy had it at 5 % of the daemon's loop at 64
    lone sends."""
    ms, r = _claim(1, now_ms)
    return _prefix(ms, r >> 40) + _eight_chars(r & _LOW_40)


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
