"""Latest wins, within a budget: what a member may change as often as it likes (its profile,
its presence) but the other members pay for (each change is an event in every daemon's
database, issue #31.6).

Per key, a token bucket (``core.ratelimit``): a change within it is applied at once; past it
the change is kept, replaced by any later one, and the latest is applied when the bucket has
a token again. The changes in between are never applied. Order per key holds: while one
waits, later ones wait behind it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import structlog

from tidemesh.core.ratelimit import Buckets, Rate

log = structlog.get_logger(__name__)
T = TypeVar("T")


def _now_ms() -> int:
    return int(time.time() * 1000)


class Coalescer(Generic[T]):
    def __init__(self, name: str, rate: Rate, apply: Callable[[Hashable, T], Awaitable[None]]
                 ) -> None:
        self.name = name
        self.rate = rate
        self.apply = apply
        self._budgets = Buckets()
        self._latest: dict[Hashable, T] = {}
        self._waiting: dict[Hashable, asyncio.Task[None]] = {}

    def waiting(self) -> int:
        """Keys whose latest change waits for the budget."""
        return len(self._waiting)

    async def offer(self, key: Hashable, change: T) -> None:
        """Apply ``change`` now if the budget allows, else when it does (unless a later
        change replaces it first)."""
        if key in self._waiting:
            self._latest[key] = change
            return
        taken = self._budgets.admit(key, self.rate, 1, _now_ms())
        if taken.admitted:
            await self.apply(key, change)
            return
        self._latest[key] = change
        self._waiting[key] = asyncio.get_running_loop().create_task(
            self._later(key, taken.retry_after_ms[0]), name=f"broker-{self.name}-coalesced")

    def prune(self, now_ms: int) -> None:
        """Forget the budgets that have refilled (the same as none)."""
        self._budgets.prune(lambda _key: self.rate, now_ms)

    def stop(self) -> None:
        """Drop what still waits (the server stopped)."""
        for task in list(self._waiting.values()):
            task.cancel()

    async def _later(self, key: Hashable, wait_ms: int) -> None:
        try:
            await asyncio.sleep(wait_ms / 1000)
            # A change offered while the one before is applied waits its turn here too.
            while key in self._latest:
                taken = self._budgets.admit(key, self.rate, 1, _now_ms())
                if not taken.admitted:
                    await asyncio.sleep(taken.retry_after_ms[0] / 1000)
                    continue
                await self.apply(key, self._latest.pop(key))
        except Exception as exc:  # a store that is down: the next change tries again
            self._latest.pop(key, None)
            log.warning("broker_coalesced_change_failed", kind=self.name, error=repr(exc))
        finally:
            self._waiting.pop(key, None)
