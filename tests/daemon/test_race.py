"""Racing a queue against a stop signal leaves no helper task behind, however it ends."""

from __future__ import annotations

import asyncio

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
