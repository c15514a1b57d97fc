"""Retry delays: exponential with a cap and jitter (DESIGN §4.4: 0.5 s doubling to 30 s, ±25 %)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.5
    maximum_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.25

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Delay before retry number ``attempt`` (1-based), jittered by ±jitter."""
        base = self.initial_s
        # Grow step by step and stop at the cap: multiplier ** attempt overflows a float
        # after about a thousand attempts, which a long outage reaches.
        for _ in range(max(0, attempt - 1)):
            if base >= self.maximum_s:
                break
            base *= self.multiplier
        base = min(self.maximum_s, base)
        return base * (1 + rng.uniform(-self.jitter, self.jitter))
