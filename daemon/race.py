"""Waiting for the first of several things, without leaving a helper task behind.

A task racing a ``Queue.get()`` against a stop signal must cancel both helper tasks however
it ends, including when it is itself cancelled (its connection went away): a helper left
pending is garbage-collected mid-wait ("Task was destroyed but it is pending!").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


async def first(*aws: Awaitable[Any], within: float | None = None) -> None:
    """Return when the first of ``aws`` completes, or after ``within`` seconds."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancel(tasks)


async def next_item(queue: asyncio.Queue[T], stop: Awaitable[Any],
                    within: float | None = None) -> T | None:
    """The queue's next item; None when ``stop`` completes first or ``within`` passes."""
    if not queue.empty():
        if asyncio.iscoroutine(stop):
            stop.close()  # never started: say so, or Python warns it was never awaited
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    await first(getter, stop, within=within)
    if getter.done() and not getter.cancelled():
        return getter.result()
    return None


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the helpers and wait until they are done. A cancel of the caller that lands
    here must go on up: suppressing ``CancelledError`` around ``await helper`` swallowed it
    (the caller then looped on, and the session waiting for it never ended), so the wait is
    ``asyncio.wait``, which never raises a helper's outcome, only the caller's own cancel."""
    for t in tasks:
        t.cancel()
    pending = [t for t in tasks if not t.done()]
    try:
        if pending:
            await asyncio.wait(pending)
    finally:
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()   # retrieved: a helper's error is the caller's to ignore
