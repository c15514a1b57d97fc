"""The retention policy alone: which rows may go, and when."""

from __future__ import annotations

import pytest

from tidemesh.core.retention import (
    DAY_MS,
    HOUR_MS,
    ChainRow,
    InboxPolicy,
    Loss,
    OutboxPolicy,
    below_floor,
    chain_expired,
    entry_expired,
    losses,
    row_expired,
    used_pct,
)

POLICY = OutboxPolicy(max_age_ms=72 * HOUR_MS, margin_ms=24 * HOUR_MS,
                      dead_retention_ms=30 * DAY_MS)
NOW = 1_000 * DAY_MS


def _row(status: str, age_ms: int, dead_age_ms: int | None = None) -> ChainRow:
    dead_at = None if dead_age_ms is None else NOW - dead_age_ms
    return ChainRow("r", status, NOW - age_ms, dead_at)


@pytest.mark.parametrize("status", ["done", "aborted"])
def test_a_settled_row_goes_exactly_after_max_age_plus_margin(status: str) -> None:
    keep_for = 96 * HOUR_MS
    assert not row_expired(_row(status, keep_for), POLICY, NOW)
    assert row_expired(_row(status, keep_for + 1), POLICY, NOW)


@pytest.mark.parametrize("status", ["pending", "inflight"])
def test_a_live_row_never_goes(status: str) -> None:
    assert not row_expired(_row(status, 10_000 * DAY_MS), POLICY, NOW)


def test_a_dead_row_waits_for_dead_retention_from_when_it_died() -> None:
    old_but_recent_death = _row("dead", 400 * DAY_MS, dead_age_ms=30 * DAY_MS)
    assert not row_expired(old_but_recent_death, POLICY, NOW)
    assert row_expired(_row("dead", 400 * DAY_MS, dead_age_ms=30 * DAY_MS + 1), POLICY, NOW)


def test_a_dead_row_without_a_death_time_counts_from_its_accept() -> None:
    assert row_expired(_row("dead", 30 * DAY_MS + 1), POLICY, NOW)
    assert not row_expired(_row("dead", 30 * DAY_MS), POLICY, NOW)


def test_a_chain_goes_only_when_every_row_of_it_may() -> None:
    old_aborted = _row("aborted", 200 * DAY_MS)
    assert not chain_expired([old_aborted, _row("pending", 200 * DAY_MS)], POLICY, NOW)
    assert not chain_expired([old_aborted, _row("done", HOUR_MS)], POLICY, NOW)
    assert chain_expired([old_aborted, _row("done", 5 * DAY_MS)], POLICY, NOW)
    assert not chain_expired([], POLICY, NOW)


INBOX = InboxPolicy(retention_ms=30 * DAY_MS, consumer_hold_ms=90 * DAY_MS,
                    events_retention_ms=7 * DAY_MS)


def test_an_entry_acked_by_every_consumer_goes_after_retention() -> None:
    at = NOW - 30 * DAY_MS
    assert not entry_expired(5, at, 10, INBOX, NOW)
    assert entry_expired(5, at - 1, 10, INBOX, NOW)
    assert entry_expired(5, at - 1, None, INBOX, NOW)


def test_an_unacked_entry_is_held_until_the_hold_cap() -> None:
    assert not entry_expired(11, NOW - 90 * DAY_MS, 10, INBOX, NOW)
    assert entry_expired(11, NOW - 90 * DAY_MS - 1, 10, INBOX, NOW)


def test_losses_are_what_each_consumer_had_not_acked() -> None:
    assert losses([3, 4, 5, 6], {"fast": 10, "slow": 4, "new": 0}) == {
        "slow": Loss(2, 6), "new": Loss(4, 6)}
    assert losses([], {"a": 0}) == {}


@pytest.mark.parametrize(("ret", "hold", "events"), [(30, 20, 7), (30, 90, 31)])
def test_inconsistent_inbox_settings_are_refused(ret: int, hold: int, events: int) -> None:
    with pytest.raises(ValueError, match="days"):
        InboxPolicy(ret * DAY_MS, hold * DAY_MS, events * DAY_MS)


def test_the_disk_floor() -> None:
    assert below_floor(99, 100)
    assert not below_floor(100, 100)
    assert not below_floor(0, 0), "a floor of 0 disables the check"
    assert used_pct(200, 50) == 75.0
    assert used_pct(0, 0) == 0.0
