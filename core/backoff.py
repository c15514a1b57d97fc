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
        base = min(self.maximum_s, self.initial_s * self.multiplier ** max(0, attempt - 1))
        return base * (1 + rng.uniform(-self.jitter, self.jitter))
