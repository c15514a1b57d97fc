"""What a broker answer means for an outbox row (spec §4.5b, DESIGN §4.4). Pure.

    201                             → done
    200 duplicate, history there    → done (INFO)
    200 duplicate, history pruned   → done (WARN: the original's history is gone)
    409 idempotency_key_reused      → dead (final: requeue under a fresh id)
    429 rate_limited                → pending in its place; nothing is claimed before
                                      retry_after_ms plus up to 25 % (``hold_until``)
    other 4xx                       → dead
    5xx, a frame refused as a whole → retry with backoff
    timeout, lost connection        → pending in its place; nothing is claimed before the
                                      backoff's delay (``unanswered``); from the 4th
                                      attempt on, retry with backoff
    older than the max age          → dead (max_age_exceeded)
"""

from __future__ import annotations

import math
import random
from enum import StrEnum
from typing import Any

from tidemesh.core.backoff import Backoff
from tidemesh.core.record import record

# Unanswered this many times, a row stops keeping its place (``unanswered``).
KEEP_PLACE_ATTEMPTS = 3


class Kind(StrEnum):
    DONE = "done"
    DEAD = "dead"
    RETRY = "retry"


@record
class Settlement:
    row_id: str
    kind: Kind
    now_ms: int
    broker_message_id: str | None = None
    history_id: str | None = None
    last_error: str | None = None
    next_attempt_at: int | None = None   # RETRY: None keeps the row's place in the outbox
    history_pruned: bool = False
    hold_until: int | None = None        # the sender claims nothing before this


def classify(row_id: str, attempts: int, answer: dict[str, Any] | None, error: str | None,
             now_ms: int, backoff: Backoff, rng: random.Random) -> Settlement:
    """Settle one send: ``answer`` is the broker's send_result, or None with ``error`` set
    when the send never got an answer (timeout, connection lost)."""
    if answer is None:
        return _retry(row_id, attempts, error or "no answer", now_ms, backoff, rng)
    status = int(answer["status"])
    if status in (200, 201):
        pruned = status == 200 and answer.get("history_available") is False
        return Settlement(row_id, Kind.DONE, now_ms, answer.get("broker_message_id"),
                          answer.get("history_id"), history_pruned=pruned)
    if status == 409:
        return Settlement(row_id, Kind.DEAD, now_ms, last_error=(
            f"idempotency_key_reused: {answer.get('conflict', 'conflict')} "
            f"(broker_fingerprint_prefix {answer.get('broker_fingerprint_prefix', '?')})"))
    err = answer.get("error") or {}
    text = f"broker {status} {err.get('code', 'error')}: {err.get('message', '')}".strip()
    if status == 429:
        return _rate_limited(row_id, attempts, answer, text, now_ms, backoff, rng)
    if 400 <= status < 500:
        return Settlement(row_id, Kind.DEAD, now_ms, last_error=text)
    return _retry(row_id, attempts, text, now_ms, backoff, rng)


def _retry(row_id: str, attempts: int, error: str, now_ms: int, backoff: Backoff,
           rng: random.Random) -> Settlement:
    return Settlement(row_id, Kind.RETRY, now_ms, last_error=error,
                      next_attempt_at=now_ms + _delay_ms(attempts, backoff, rng))


def unanswered(row_id: str, attempts: int, error: str, now_ms: int, backoff: Backoff,
               rng: random.Random) -> Settlement:
    """A frame that got no answer (no answer in time, or the link closed first): the broker
    may have read none, some or all of it. Its rows keep their next_attempt_at and the wait
    is the sender's (``hold_until``), so they go out again in the order they were first
    claimed, before anything queued after them. A backoff per row would draw a jitter per
    row and send a member's rows again in another order.

    A row whose frames went unanswered ``KEEP_PLACE_ATTEMPTS`` times may be what breaks the
    link (or stalls the broker): from then on it backs off on its own, behind newer rows,
    so it cannot hold every later send back."""
    if attempts > KEEP_PLACE_ATTEMPTS:
        return _retry(row_id, attempts, error, now_ms, backoff, rng)
    return Settlement(row_id, Kind.RETRY, now_ms, last_error=error,
                      hold_until=now_ms + _delay_ms(attempts, backoff, rng))


def _rate_limited(row_id: str, attempts: int, answer: dict[str, Any], error: str, now_ms: int,
                  backoff: Backoff, rng: random.Random) -> Settlement:
    """Over the member's send budget: not a failure. The row keeps its next_attempt_at, so
    rows are sent again in the order they were first claimed, and the wait is the sender's
    (``hold_until``): the broker's ``retry_after_ms`` (else the backoff's delay), plus jitter
    that only lengthens it, so daemons refused together do not all return at once."""
    wait_ms = answer.get("retry_after_ms")
    if not isinstance(wait_ms, int) or wait_ms <= 0:
        wait_ms = _delay_ms(attempts, backoff, rng)
    jittered = math.ceil(wait_ms * (1 + rng.uniform(0, backoff.jitter)))
    return Settlement(row_id, Kind.RETRY, now_ms, last_error=error,
                      hold_until=now_ms + jittered)


def _delay_ms(attempts: int, backoff: Backoff, rng: random.Random) -> int:
    """The backoff's delay before the next try of a row tried ``attempts`` times."""
    return int(backoff.delay(max(1, attempts), rng) * 1000)


def expired(row_id: str, enqueued_at: int, max_age_ms: int, now_ms: int) -> Settlement | None:
    if now_ms - enqueued_at <= max_age_ms:
        return None
    hours = (now_ms - enqueued_at) / 3_600_000
    return Settlement(row_id, Kind.DEAD, now_ms,
                      last_error=f"max_age_exceeded: unsent for {hours:.1f} h")
