"""Which broker a daemon dials: the addresses a mesh knows, in order, and the one in use.

A daemon stays on the broker that serves it and moves to the next address only when that
one fails (a refused dial or a lost link), wrapping around; the relay's backoff paces the
attempts, so a mesh with one address behaves exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class BrokerRotation:
    urls: tuple[str, ...]
    index: int = 0

    @classmethod
    def of(cls, urls: Sequence[str]) -> BrokerRotation:
        # The same address twice would only slow a failover down.
        unique = tuple(dict.fromkeys(urls))
        if not unique:
            raise ValueError("a mesh needs at least one broker address")
        return cls(unique)

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def failed(self) -> str:
        """The current broker failed: the next address to dial."""
        self.index = (self.index + 1) % len(self.urls)
        return self.current

    def in_order(self) -> tuple[str, ...]:
        """Every address, the current one first (for one-shot dials: join, the cold path)."""
        return self.urls[self.index:] + self.urls[:self.index]

    def readdressed(self, urls: Sequence[str]) -> BrokerRotation:
        """The rotation over ``urls`` (a join that brought new addresses), still at the
        broker now in use when it is among them, else at the first."""
        new = BrokerRotation.of(urls)
        if self.current in new.urls:
            return BrokerRotation(new.urls, new.urls.index(self.current))
        return new
