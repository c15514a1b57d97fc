"""What a broker answer means for an outbox row (spec §4.5b), decided without any I/O."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tidemesh.core.backoff import Backoff
from tidemesh.core.outcome import (
    KEEP_PLACE_ATTEMPTS,
    Kind,
    Settlement,
    classify,
    expired,
    unanswered,
)

NOW = 1_700_000_000_000
NO_JITTER = Backoff(jitter=0.0)


def settle(answer: dict[str, Any] | None, error: str | None = None,
           attempts: int = 1) -> Settlement:
    return classify("r1", attempts, answer, error, NOW, NO_JITTER, random.Random(0))


@pytest.mark.parametrize(("answer", "kind", "pruned"), [
    ({"status": 201, "broker_message_id": "b", "history_id": "h"}, Kind.DONE, False),
    ({"status": 200, "duplicate": True, "broker_message_id": "b", "history_id": "h",
      "history_available": True}, Kind.DONE, False),
    ({"status": 200, "duplicate": True, "broker_message_id": "b", "history_id": "h"},
     Kind.DONE, False),  # no word on history: not reported as pruned
    ({"status": 200, "duplicate": True, "broker_message_id": "b", "history_id": "h",
      "history_available": False}, Kind.DONE, True),
])
def test_classify_201_and_200_are_done_with_the_brokers_ids(answer: dict[str, Any], kind: Kind,
                                                           pruned: bool) -> None:
    st = settle(answer)
    assert st == Settlement("r1", kind, NOW, "b", "h", history_pruned=pruned)


def test_classify_201_with_history_unavailable_is_not_pruned() -> None:
    assert not settle({"status": 201, "history_available": False}).history_pruned


def test_classify_409_is_dead_and_names_the_conflict() -> None:
    st = settle({"status": 409, "conflict": "fingerprint_mismatch",
                 "broker_fingerprint_prefix": "abcd"})
    assert st.kind is Kind.DEAD and st.next_attempt_at is None
    assert st.last_error == ("idempotency_key_reused: fingerprint_mismatch "
                             "(broker_fingerprint_prefix abcd)")


def test_classify_409_without_details_still_says_what_it_was() -> None:
    assert settle({"status": 409}).last_error == (
        "idempotency_key_reused: conflict (broker_fingerprint_prefix ?)")


@pytest.mark.parametrize(("status", "kind"), [
    (400, Kind.DEAD), (404, Kind.DEAD), (413, Kind.DEAD), (499, Kind.DEAD),
    (500, Kind.RETRY), (503, Kind.RETRY), (599, Kind.RETRY),
])
def test_classify_other_4xx_is_dead_and_5xx_retries(status: int, kind: Kind) -> None:
    st = settle({"status": status, "error": {"code": "boom", "message": "it broke"}})
    assert st.kind is kind
    assert st.last_error == f"broker {status} boom: it broke"


def test_classify_error_text_without_an_error_object() -> None:
    assert settle({"status": 400}).last_error == "broker 400 error:"


@pytest.mark.parametrize(("attempts", "delay_ms"), [
    (1, 500), (2, 1000), (3, 2000), (0, 500), (40, 30_000),
])
def test_classify_no_answer_retries_after_the_backoff(attempts: int, delay_ms: int) -> None:
    st = settle(None, "TimeoutError: no answer", attempts)
    assert st == Settlement("r1", Kind.RETRY, NOW, last_error="TimeoutError: no answer",
                            next_attempt_at=NOW + delay_ms)


def test_classify_no_answer_and_no_error_says_so() -> None:
    assert settle(None).last_error == "no answer"


def test_classify_5xx_retries_after_the_backoff() -> None:
    assert settle({"status": 502}, attempts=3).next_attempt_at == NOW + 2000


@pytest.mark.parametrize(("age_ms", "dead"), [
    (0, False), (3_600_000, False), (3_600_000 + 1, True), (-5, False),
])
def test_expired_only_past_the_max_age(age_ms: int, dead: bool) -> None:
    st = expired("r1", NOW - age_ms, 3_600_000, NOW)
    assert (st is not None) == dead
    if st is not None:
        assert st == Settlement("r1", Kind.DEAD, NOW, last_error=(
            "max_age_exceeded: unsent for 1.0 h"))


RATE_LIMITED = {"status": 429, "retry_after_ms": 400,
                "error": {"code": "rate_limited", "message": "over budget"}}


def test_classify_429_rate_limited_retries_in_place_after_retry_after_ms() -> None:
    st = settle(RATE_LIMITED, attempts=7)
    assert st.kind is Kind.RETRY
    assert st.next_attempt_at is None           # keeps its place: sent again in order
    assert st.hold_until == NOW + 400           # the broker's wait, not the backoff's
    assert st.last_error == "broker 429 rate_limited: over budget"


def test_classify_429_jitter_only_lengthens_the_wait() -> None:
    waits = {classify("r1", 1, RATE_LIMITED, None, NOW, Backoff(), random.Random(seed)
                      ).hold_until for seed in range(50)}
    assert all(w is not None and NOW + 400 <= w <= NOW + 500 for w in waits)
    assert len(waits) > 1


def test_classify_429_without_retry_after_waits_the_backoff() -> None:
    st = settle({"status": 429, "error": {"code": "rate_limited", "message": ""}}, attempts=2)
    assert (st.kind, st.next_attempt_at, st.hold_until) == (Kind.RETRY, None, NOW + 1000)


@pytest.mark.parametrize(("attempts", "delay_ms"), [(1, 500), (2, 1000), (3, 2000)])
def test_unanswered_keeps_its_place_and_holds_the_sender(attempts: int, delay_ms: int) -> None:
    """A lost link's rows go out again in the order first claimed: none jumps ahead of
    another by a jitter of its own."""
    st = unanswered("r1", attempts, "LinkClosed: gone", NOW, Backoff(jitter=0.0),
                    random.Random(1))
    assert st == Settlement("r1", Kind.RETRY, NOW, last_error="LinkClosed: gone",
                            hold_until=NOW + delay_ms)


def test_unanswered_too_often_backs_off_behind_newer_rows() -> None:
    """A row whose frames keep going unanswered may be what breaks the link: it stops
    holding every later send back."""
    st = unanswered("r1", KEEP_PLACE_ATTEMPTS + 1, "TimeoutError: no answer", NOW,
                    Backoff(jitter=0.0), random.Random(1))
    assert (st.next_attempt_at, st.hold_until) == (NOW + 4000, None)
