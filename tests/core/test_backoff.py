"""Retry delays (DESIGN §4.4): 0.5 s doubling to a 30 s cap, jittered by ±25 %."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemesh.core.backoff import Backoff


class FixedUniform(random.Random):
    """``uniform`` returns the bound it is told to: -1 the low one, +1 the high one, 0 the mid."""

    def __init__(self, where: int) -> None:
        super().__init__(0)
        self.where = where

    def uniform(self, a: float, b: float) -> float:
        return {-1: a, 0: (a + b) / 2, 1: b}[self.where]


@pytest.mark.parametrize(("attempt", "seconds"), [
    (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (8, 30.0), (100, 30.0),
    (0, 0.5), (-3, 0.5),  # attempts below 1 get the first delay, never less
])
def test_delay_doubles_from_half_a_second_to_the_cap(attempt: int, seconds: float) -> None:
    assert Backoff().delay(attempt, FixedUniform(0)) == pytest.approx(seconds)


@pytest.mark.parametrize(("where", "factor"), [(-1, 0.75), (1, 1.25)])
def test_delay_jitter_reaches_exactly_a_quarter_either_way(where: int, factor: float) -> None:
    assert Backoff().delay(3, FixedUniform(where)) == pytest.approx(2.0 * factor)
    assert Backoff().delay(50, FixedUniform(where)) == pytest.approx(30.0 * factor)


def test_delay_follows_its_own_settings() -> None:
    b = Backoff(initial_s=1.0, maximum_s=5.0, multiplier=3.0, jitter=0.0)
    assert [b.delay(n, random.Random(1)) for n in (1, 2, 3)] == [1.0, 3.0, 5.0]


@given(attempt=st.integers(-5, 1024), seed=st.integers(0, 2**32))
def test_delay_stays_within_the_jittered_bounds(attempt: int, seed: int) -> None:
    d = Backoff().delay(attempt, random.Random(seed))
    assert 0.5 * 0.75 <= d <= 30.0 * 1.25


@given(attempt=st.integers(1, 60), seed=st.integers(0, 2**32))
def test_delay_never_shrinks_without_jitter(attempt: int, seed: int) -> None:
    b = Backoff(jitter=0.0)
    assert b.delay(attempt, random.Random(seed)) <= b.delay(attempt + 1, random.Random(seed))


def test_delay_is_capped_after_a_thousand_attempts() -> None:
    assert Backoff().delay(1025, FixedUniform(0)) == pytest.approx(30.0)
