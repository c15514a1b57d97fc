"""The per-member token bucket, on an injected clock."""

from __future__ import annotations

from tidemesh.core.ratelimit import Buckets, Owed, Rate

RATE = Rate(per_s=10, burst=5)   # a token every 100 ms, five at most
KEY = ("mesh", "alice")


def test_a_fresh_member_has_a_full_burst() -> None:
    b = Buckets()
    got = b.admit(KEY, RATE, 5, now_ms=0)
    assert (got.admitted, got.retry_after_ms, got.fill) == (5, (), 0.0)


def test_sends_over_the_burst_are_refused_in_order_with_their_waits() -> None:
    got = Buckets().admit(KEY, RATE, 8, now_ms=0)
    assert got.admitted == 5
    # the 1st refused fits in 100 ms, the 2nd in 200, the 3rd in 300 (if the others go first)
    assert got.retry_after_ms == (100, 200, 300)


def test_waits_are_capped_at_a_full_bucket() -> None:
    got = Buckets().admit(KEY, RATE, 20, now_ms=0)
    assert max(got.retry_after_ms) == 500   # five tokens take 500 ms, never more


def test_the_bucket_refills_at_the_rate_up_to_the_burst() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=0)
    assert b.admit(KEY, RATE, 1, now_ms=50).admitted == 0
    assert b.admit(KEY, RATE, 2, now_ms=250).admitted == 2    # 2.5 tokens by then
    assert b.admit(KEY, RATE, 9, now_ms=100_000).admitted == 5


def test_a_partial_token_shortens_the_wait() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=0)
    assert b.admit(KEY, RATE, 1, now_ms=30).retry_after_ms == (70,)


def test_members_have_separate_buckets() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=0)
    assert b.admit(("mesh", "bob"), RATE, 5, now_ms=0).admitted == 5
    assert not b.fits(KEY, RATE, 1, now_ms=0)
    assert b.fits(("mesh", "bob"), RATE, 0, now_ms=0)


def test_a_refund_gives_tokens_back_up_to_the_burst() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 4, now_ms=0)
    b.refund(KEY, RATE, 3, now_ms=0)
    assert b.fits(KEY, RATE, 4, now_ms=0)
    b.refund(KEY, RATE, 100, now_ms=0)
    assert not b.fits(KEY, RATE, 6, now_ms=0)


def test_unlimited_admits_everything_and_keeps_no_state() -> None:
    b = Buckets()
    off = Rate(per_s=0, burst=1)
    assert b.admit(KEY, off, 10_000, now_ms=0).admitted == 10_000
    assert len(b) == 0


def test_a_clock_that_goes_back_adds_no_tokens() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=1_000)
    assert b.admit(KEY, RATE, 1, now_ms=0).admitted == 0


def test_prune_forgets_only_full_buckets() -> None:
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=0)
    b.admit(("mesh", "bob"), RATE, 1, now_ms=450)
    assert b.prune(lambda _: RATE, now_ms=450) == 0
    assert b.prune(lambda _: RATE, now_ms=500) == 1     # alice refilled, bob not yet
    assert len(b) == 1


def test_a_late_callers_older_clock_does_not_count_the_refill_twice() -> None:
    """A frame that read the clock, then waited its turn, asks with a time older than the
    bucket's: the refill since then is counted once, not again by the next caller."""
    b = Buckets()
    b.admit(KEY, RATE, 5, now_ms=0)                  # empty
    assert b.admit(KEY, RATE, 5, now_ms=1_000).admitted == 5
    assert b.admit(KEY, RATE, 5, now_ms=400).admitted == 0   # read before the one above
    assert b.admit(KEY, RATE, 5, now_ms=1_000).admitted == 0
    b.refund(KEY, RATE, 1, now_ms=400)
    assert b.admit(KEY, RATE, 5, now_ms=1_000).admitted == 1


def _owed(*refused: tuple[str, int]) -> Owed:
    owed = Owed(slack_ms=10_000, cap=3)
    keys = [k for k, _ in refused]
    owed.settle(keys, 0, [at for _, at in refused], 0)
    return owed


def test_owed_sends_go_through_before_anything_new() -> None:
    owed = _owed(("a", 50), ("b", 60))
    assert owed.allowed(["a", "b", "c"]) == 3
    assert owed.allowed(["a", "c", "b"]) == 1      # c is new while b is still owed
    assert owed.allowed(["c"]) == 0
    assert Owed(10_000, 3).allowed(["c", "d"]) == 2


def test_owed_sends_go_through_in_the_order_the_member_brings_them() -> None:
    """A daemon's rows whose link dropped come back behind newer ones: holding them to the
    order refused would stall it until each expired."""
    owed = _owed(("a", 50), ("b", 60))
    assert owed.allowed(["b", "a", "c"]) == 3
    assert owed.allowed(["b", "b", "c"]) == 2      # a sent twice is still one


def test_owed_sends_that_go_through_are_owed_no_more_and_refused_ones_are_owed_again(
        ) -> None:
    owed = _owed(("a", 50), ("b", 60))
    owed.settle(["a", "c"], 1, [90], 10)
    assert owed.keys == {"b": 60, "c": 100}
    owed.settle(["b", "c"], 0, [30, 40], 20)
    assert owed.keys == {"b": 50, "c": 60}


def test_new_sends_wait_for_the_owed_ones_not_brought_at_least_a_little_once_late() -> None:
    owed = _owed(("a", 50), ("b", 80))
    assert owed.wait_ms([], 20, late_ms=100) == 60
    assert owed.wait_ms(["b"], 20, late_ms=100) == 30     # b comes back in this frame
    assert owed.wait_ms([], 80, late_ms=100) == 100


def test_a_send_that_never_comes_back_stops_being_owed_after_the_slack() -> None:
    owed = _owed(("a", 20_000), ("b", 50))
    owed.expire(10_050)
    assert list(owed.keys) == ["a", "b"]
    owed.expire(10_051)
    assert list(owed.keys) == ["a"]


def test_refusals_past_the_cap_are_not_remembered() -> None:
    owed = _owed(("a", 1), ("b", 1), ("c", 1))
    owed.settle(["d", "a"], 0, [5, 5], 0)
    assert owed.keys == {"a": 5, "b": 1, "c": 1}
