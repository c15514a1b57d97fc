"""Outbox max age (spec §4.9) from the broker's dedupe window: derived, overridden, refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemesh.core.maxage import DedupeWindow, MaxAgeError, max_age_hours

PERMANENT = DedupeWindow("permanent", None)


def scoped(days: int | None) -> DedupeWindow:
    return DedupeWindow("retention_scoped", days)


@pytest.mark.parametrize(("configured", "override", "hours"), [
    (168, None, 168),      # the default
    (24, None, 24),
    (720, None, 720),      # the cap itself
    (10_000, None, 720),   # configured above the cap is capped
    (168, 5, 5),           # an override wins, even below the configured value
    (168, 10_000, 10_000), # ... and is not capped: the broker never forgets
])
def test_permanent_window_uses_configured_hours_capped(configured: int, override: int | None,
                                                       hours: int) -> None:
    assert max_age_hours(PERMANENT, configured, override) == hours


@pytest.mark.parametrize(("days", "hours"), [
    (3, 72),              # 72 h - 24 h margin = 48 h, raised to the 72 h floor
    (4, 72),              # 96 - 24
    (10, 216),            # 240 - 24
    (11, 237),            # margin ceil(26.4) = 27
    (30, 648),            # 720 - 72
    (365, 8760 - 876),
])
def test_scoped_window_leaves_a_margin_of_a_tenth_at_least_a_day(days: int, hours: int) -> None:
    assert max_age_hours(scoped(days)) == hours


def test_scoped_window_ignores_the_configured_hours() -> None:
    assert max_age_hours(scoped(30), configured_hours=1) == 648


@pytest.mark.parametrize("days", [None, 2, 0, -1])
def test_scoped_window_below_three_days_is_refused(days: int | None) -> None:
    with pytest.raises(MaxAgeError) as info:
        max_age_hours(scoped(days))
    assert info.value.code == "feature_param_below_floor"


@pytest.mark.parametrize(("days", "override"), [(3, 71), (3, 1), (30, 719)])
def test_scoped_override_inside_the_window_is_used(days: int, override: int) -> None:
    assert max_age_hours(scoped(days), override_hours=override) == override


@pytest.mark.parametrize(("days", "override"), [(3, 72), (30, 720), (30, 10_000)])
def test_scoped_override_reaching_the_window_is_refused(days: int, override: int) -> None:
    with pytest.raises(MaxAgeError) as info:
        max_age_hours(scoped(days), override_hours=override)
    assert info.value.code == "outbox_max_age_above_dedupe_window"


@given(st.integers(3, 100_000))
def test_derived_max_age_always_ends_before_the_broker_forgets(days: int) -> None:
    hours = max_age_hours(scoped(days))
    assert hours >= 72 and (days < 4 or hours <= days * 24 - 24)
