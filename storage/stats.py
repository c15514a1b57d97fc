"""What a write engine reports about its group commits: counters and a per-batch callback."""

from __future__ import annotations

from collections.abc import Callable


class BatchCounters:
    """Counters since the engine opened; ``on_batch(items, seconds)`` after each commit lets
    the composition root feed its histograms without the engine importing a metrics library."""

    def __init__(self) -> None:
        self.batches = 0
        self.items = 0
        self.on_batch: Callable[[int, float], None] | None = None

    def _record(self, items: int, seconds: float) -> None:
        self.batches += 1
        self.items += items
        if self.on_batch is not None:
            self.on_batch(items, seconds)
