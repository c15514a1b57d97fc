"""Racing a queue against a stop signal leaves no helper task behind, however it ends."""

from __future__ import annotations

import asyncio
import random

import pytest

from tidemesh.daemon import race


async def test_the_next_item_the_stop_or_the_timeout() -> None:
    q: asyncio.Queue[int] = asyncio.Queue()
    stop = asyncio.Event()
    q.put_nowait(1)
    assert await race.next_item(q, stop.wait()) == 1
    assert await race.next_item(q, stop.wait(), within=0.01) is None
    stop.set()
    assert await race.next_item(q, stop.wait()) is None
    assert q.empty()


async def test_a_cancelled_wait_leaves_no_getter_to_steal_the_next_item() -> None:
    q: asyncio.Queue[str] = asyncio.Queue()
    stop = asyncio.Event()
    others = asyncio.all_tasks()
    waiter = asyncio.create_task(race.next_item(q, stop.wait()))
    await asyncio.sleep(0.01)
    waiter.cancel()  # its connection went away
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - others == set(), "a helper task was left pending"
    q.put_nowait("next")
    await asyncio.sleep(0.01)
    assert q.get_nowait() == "next"


async def test_first_returns_on_the_first_and_cancels_the_rest() -> None:
    slow = asyncio.Event()
    fast = asyncio.Event()
    fast.set()
    others = asyncio.all_tasks()
    await race.first(slow.wait(), fast.wait(), within=5)
    await race.first(slow.wait(), within=0.01)
    assert asyncio.all_tasks() - others == set()


async def test_a_cancel_that_lands_while_helpers_are_cancelled_is_never_swallowed() -> None:
    """The mechanism of the daemon that hung on stop: a cancel arriving while ``first`` was
    cancelling its helpers was suppressed with theirs, so the sender's idle loop went on, its
    session's TaskGroup waited for it forever and so did the shutdown. Cancel a loop of
    short waits at seeded random points: every one of them must end."""
    rng = random.Random(25)
    never = asyncio.Event()

    async def idle_loop() -> None:
        while True:
            await race.first(never.wait(), within=0.001)

    survivors = 0
    for _ in range(200):
        task = asyncio.create_task(idle_loop())
        await asyncio.sleep(rng.random() * 0.005)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if not done:
            survivors += 1
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
    assert survivors == 0, f"{survivors} of 200 cancels were swallowed"
