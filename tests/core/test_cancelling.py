"""``stop`` marks the task it cancels; ``asked_to_stop`` reads the mark from inside it."""

from __future__ import annotations

import asyncio

from tidemesh.core import cancelling


async def _asked_after_a_cancel(*, by_stop: bool) -> bool:
    seen = asyncio.get_running_loop().create_future()

    async def body() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.set_result(cancelling.asked_to_stop())

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    if by_stop:
        cancelling.stop(task)
    else:
        task.cancel()
    await task
    return await seen


async def test_a_task_stopped_with_stop_knows_it_was_asked() -> None:
    assert await _asked_after_a_cancel(by_stop=True)


async def test_other_cancels_and_other_tasks_are_not_asked() -> None:
    assert not await _asked_after_a_cancel(by_stop=False)
    assert not cancelling.asked_to_stop()   # the test's own task
