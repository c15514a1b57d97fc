"""Latest wins within a budget: the changes past it wait, and only the latest is applied."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from tidemesh.broker.service.coalesce import Coalescer
from tidemesh.core.ratelimit import Rate


async def settled(c: Coalescer[int]) -> None:
    async with asyncio.timeout(5):
        while c.waiting():
            await asyncio.sleep(0.01)


async def test_past_the_budget_only_the_latest_change_is_applied() -> None:
    applied: list[tuple[Hashable, int]] = []

    async def apply(key: Hashable, change: int) -> None:
        applied.append((key, change))

    c = Coalescer[int]("test", Rate(per_s=20, burst=2), apply)
    for i in range(100):
        await c.offer("bob", i)
    await c.offer("carol", 7)   # another member's budget is its own
    assert applied == [("bob", 0), ("bob", 1), ("carol", 7)]
    await settled(c)
    assert applied[-1] == ("bob", 99) and len(applied) == 4


async def test_a_change_offered_while_the_waiting_one_is_applied_is_not_lost() -> None:
    applied: list[int] = []
    applying = asyncio.Event()
    go_on = asyncio.Event()

    async def apply(_key: Hashable, change: int) -> None:
        if change == 1:
            applying.set()
            await go_on.wait()
        applied.append(change)

    c = Coalescer[int]("test", Rate(per_s=20, burst=1), apply)
    await c.offer("bob", 0)
    await c.offer("bob", 1)         # waits for the budget
    await asyncio.wait_for(applying.wait(), 5)
    await c.offer("bob", 2)         # arrives while 1 is being applied
    go_on.set()
    await settled(c)
    assert applied == [0, 1, 2]
