"""ULIDs: the fixed vectors the hand-written encoder produced, and random bits that stay
random within one millisecond (the broker's queue pick reads them)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from ulid import ULID

from tidemesh.core.ids import (
    ULID_PATTERN,
    derived_ulid,
    new_ulid,
    new_ulids,
    ordered_ulid,
    ordered_ulids,
)


@pytest.mark.parametrize(("ms", "randomness", "expected"), [
    (1_469_918_176_385, bytes(range(10)), "01ARYZ6S41000G40R40M30E209"),
    (0, bytes(10), "0" * 26),
    (2**48 - 1, b"\xff" * 10, "7" + "Z" * 25),
])
def test_a_given_time_and_randomness_make_the_same_id_as_before(
        ms: int, randomness: bytes, expected: str) -> None:
    assert new_ulid(ms, randomness) == expected


def test_ids_of_one_millisecond_have_independent_random_bits() -> None:
    minted = [new_ulid(1_700_000_000_000) for _ in range(1000)]
    tails = [int.from_bytes(ULID.from_str(i).bytes[6:], "big") for i in minted]

    assert all(ULID_PATTERN.fullmatch(i) for i in minted)
    assert len(set(minted)) == 1000
    # A counting generator would make each tail the one before plus one.
    assert sum(b - a == 1 for a, b in pairwise(tails)) < 10


def test_ids_without_a_clock_carry_the_current_time() -> None:
    earlier, now = new_ulid(1_000), new_ulid()

    assert ULID_PATTERN.fullmatch(now) and earlier < now


def test_ordered_ids_of_one_millisecond_sort_in_the_order_they_were_minted() -> None:
    minted = [ordered_ulid(1_700_000_000_000) for _ in range(1000)]
    assert minted == sorted(minted) and len(set(minted)) == 1000
    assert ordered_ulid(1_700_000_000_001) > minted[-1]


@pytest.mark.parametrize("ms", [0, 1_469_918_176_385, 1_700_000_000_000, 2**48 - 1])
def test_ids_minted_in_bulk_are_the_ulids_python_ulid_reads_back(ms: int) -> None:
    minted = new_ulids(500, ms)
    parsed = [ULID.from_str(i) for i in minted]
    tails = [int.from_bytes(u.bytes[6:], "big") for u in parsed]

    assert len(minted) == 500 and len(set(minted)) == 500
    assert all(ULID_PATTERN.fullmatch(i) for i in minted)
    assert all(str(u) == i and u.milliseconds == ms for u, i in zip(parsed, minted, strict=True))
    # Each id's random bits are its own: not a counter, not shared.
    assert sum(b - a == 1 for a, b in pairwise(tails)) < 10
    assert new_ulids(0, ms) == []


@pytest.mark.parametrize("ms", [0, 1_469_918_176_385, 1_700_000_000_000, 2**48 - 1])
def test_ordered_ids_in_bulk_count_up_from_the_last_one_and_python_ulid_reads_them(
        ms: int) -> None:
    minted = [ordered_ulid(ms), *ordered_ulids(500, ms), ordered_ulid(ms)]
    parsed = [ULID.from_str(i) for i in minted]
    tails = [int.from_bytes(u.bytes[6:], "big") for u in parsed]

    assert all(str(u) == i and u.milliseconds == ms for u, i in zip(parsed, minted, strict=True))
    # One counter across single and bulk minting: each id the one before plus one.
    assert all(b - a == 1 for a, b in pairwise(tails))
    assert minted == sorted(minted)
    assert ordered_ulids(0, ms) == []


def test_a_new_millisecond_starts_from_fresh_random_bits() -> None:
    first = [ULID.from_str(i) for i in ordered_ulids(3, 1_700_000_000_000)]
    later = [ULID.from_str(i) for i in ordered_ulids(3, 1_700_000_000_001)]

    assert str(later[0]) > str(first[-1])
    starts = {int.from_bytes(u.bytes[6:], "big") for u in (first[0], later[0])}
    assert len(starts) == 2 and all(s < 2**79 for s in starts)


def test_random_starts_stay_fresh_past_a_refill_of_the_random_pool() -> None:
    # Each new millisecond takes 10 bytes of a 4 KiB pool: 1,000 of them refill it twice.
    starts = [int.from_bytes(ULID.from_str(ordered_ulid(1_700_000_100_000 + k)).bytes[6:], "big")
              for k in range(1000)]
    assert len(set(starts)) == 1000 and all(s < 2**79 for s in starts)


def test_a_derived_id_is_the_same_for_the_same_source_and_a_ulid_of_its_time() -> None:
    ms = 1_700_000_000_123
    one = derived_ulid(ms, "ab" * 32 + "\nc1")
    assert one == derived_ulid(ms, "ab" * 32 + "\nc1")
    assert ULID_PATTERN.fullmatch(one) and ULID.from_str(one).milliseconds == ms
    assert one != derived_ulid(ms, "ab" * 32 + "\nc2")
