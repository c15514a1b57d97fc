"""Per-member token buckets for the broker's fair load (pure: the caller passes the clock).

A member's bucket holds up to ``burst`` tokens and refills at ``per_s`` tokens a second;
each new send takes one. ``admit`` decides a frame's new sends in item order: as many as
there are whole tokens go through, the rest are refused with the time after which each
would fit if the ones before it were sent as soon as they could (capped at a full bucket,
so no answer asks a member to wait longer than the bucket takes to refill). A bucket that
has refilled is the same as none, so ``prune`` forgets it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float     # 0: no limit
    burst: int

    @property
    def unlimited(self) -> bool:
        return self.per_s <= 0


@dataclass(slots=True)
class Bucket:
    tokens: float
    at_ms: int

    def level(self, rate: Rate, now_ms: int) -> float:
        """The tokens at ``now_ms``; a clock that went back adds none."""
        gained = max(0, now_ms - self.at_ms) * rate.per_s / 1000
        return min(float(rate.burst), self.tokens + gained)


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: int                       # the first ``admitted`` sends go through
    retry_after_ms: tuple[int, ...]     # one per refused send, in order
    fill: float                         # the bucket's level after, as a fraction of burst


class Buckets:
    """The buckets of every member that sent lately, keyed by whatever the caller uses."""

    def __init__(self) -> None:
        self._buckets: dict[Hashable, Bucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def fits(self, key: Hashable, rate: Rate, sends: int, now_ms: int) -> bool:
        """Would ``sends`` all go through now?"""
        return rate.unlimited or self._bucket(key, rate, now_ms).level(rate, now_ms) >= sends

    def admit(self, key: Hashable, rate: Rate, sends: int, now_ms: int) -> Admission:
        """Take a token for each of the first sends that have one; refuse the rest."""
        if rate.unlimited:
            return Admission(sends, (), 1.0)
        bucket = self._bucket(key, rate, now_ms)
        level = bucket.level(rate, now_ms)
        admitted = min(sends, int(level))
        # A caller's clock read before a wait can be older than the bucket's: the bucket's
        # time never goes back, or the refill since it would be counted twice.
        bucket.tokens, bucket.at_ms = level - admitted, max(bucket.at_ms, now_ms)
        waits = tuple(_wait_ms(bucket.tokens, k, rate) for k in range(1, sends - admitted + 1))
        return Admission(admitted, waits, bucket.tokens / rate.burst)

    def take(self, key: Hashable, rate: Rate, now_ms: int) -> int:
        """One request's token: 0 when it had one (taken), else the milliseconds until it
        would. ``admit`` for a single request, without its tuples (the IPC's hot path)."""
        if rate.unlimited:
            return 0
        bucket = self._bucket(key, rate, now_ms)
        level = bucket.level(rate, now_ms)
        bucket.at_ms = max(bucket.at_ms, now_ms)
        if level >= 1:
            bucket.tokens = level - 1
            return 0
        bucket.tokens = level
        return _wait_ms(level, 1, rate)

    def refund(self, key: Hashable, rate: Rate, sends: int, now_ms: int) -> None:
        """Give back tokens taken for sends that turned out not to be new."""
        bucket = self._buckets.get(key)
        if bucket is None or rate.unlimited or sends <= 0:
            return
        bucket.tokens, bucket.at_ms = (min(float(rate.burst), bucket.level(rate, now_ms) + sends),
                                       max(bucket.at_ms, now_ms))

    def prune(self, rate_of: Callable[[Hashable], Rate], now_ms: int) -> int:
        """Forget the buckets that are full again (or no longer limited); how many."""
        gone = []
        for key, bucket in self._buckets.items():
            rate = rate_of(key)
            if rate.unlimited or bucket.level(rate, now_ms) >= rate.burst:
                gone.append(key)
        for key in gone:
            del self._buckets[key]
        return len(gone)

    def _bucket(self, key: Hashable, rate: Rate, now_ms: int) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(float(rate.burst), now_ms)
        return bucket


def _wait_ms(tokens: float, k: int, rate: Rate) -> int:
    """Milliseconds until the ``k``-th refused send has its token, at least 1."""
    need = min(k, rate.burst) - tokens
    return max(1, math.ceil(need * 1000 / rate.per_s))


@dataclass(slots=True)
class Owed:
    """One member's refused sends, each with the time its 429 named. Until they have come
    back, nothing new of the member's goes through, or a send it had on the wire behind a
    refused one would overtake it; the owed ones themselves go through in the order the
    member brings them. A new send held back this way is refused, so it is owed in turn
    and goes through with them next time: the member always makes progress, whatever order
    it sends again in (a daemon's rows whose link dropped come back behind newer ones).

    A send that never comes back (its row was aborted) stops being owed ``slack_ms`` after
    its time. At most ``cap`` are kept: a member past it is not sending again what it was
    refused, and its later refusals are not remembered."""

    slack_ms: int
    cap: int
    keys: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def expire(self, now_ms: int) -> None:
        """Forget the sends long overdue (they are not coming back)."""
        gone = [k for k, at_ms in self.keys.items() if now_ms > at_ms + self.slack_ms]
        for key in gone:
            del self.keys[key]

    def allowed(self, keys: Sequence[str | None]) -> int:
        """How many of a frame's new sends, from the first, may take a token: owed ones,
        then any once the frame has brought back every one owed."""
        brought: set[str] = set()
        for n, key in enumerate(keys):
            if len(brought) == len(self.keys):
                return len(keys)
            if key not in self.keys:
                return n
            brought.add(key)
        return len(keys)

    def wait_ms(self, keys: Sequence[str | None], now_ms: int, late_ms: int) -> int:
        """How long sends held back behind owed ones the frame (``keys``) did not bring
        wait: until the last of those may come back, at least ``late_ms`` once it is late."""
        brought = set(keys)
        at_ms = max((at for k, at in self.keys.items() if k not in brought), default=now_ms)
        return late_ms if now_ms >= at_ms else at_ms - now_ms

    def forget(self, keys: Iterable[str]) -> None:
        """These are owed no longer (found already accepted)."""
        for key in keys:
            self.keys.pop(key, None)

    def settle(self, keys: Sequence[str | None], admitted: int, waits: Sequence[int],
               now_ms: int) -> None:
        """The frame's first ``admitted`` sends went through; the rest were refused with
        ``waits``: those are owed no more, these are (again)."""
        for key in keys[:admitted]:
            if key is not None:
                self.keys.pop(key, None)
        for key, wait in zip(keys[admitted:], waits, strict=True):
            if key is None:
                continue
            if key in self.keys or len(self.keys) < self.cap:
                self.keys[key] = now_ms + wait
