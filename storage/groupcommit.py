"""Group commit without a task of its own: callers that arrive while a batch runs wait for
it, then one of them runs all that queued meanwhile as the next batch, in one call of
``run``. A lone caller runs at once (no batch window; DESIGN §11, "no waiting on an idle
path")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

A = TypeVar("A")
T = TypeVar("T")


class GroupCommit(Generic[A, T]):
    def __init__(self, run: Callable[[Sequence[A]], Awaitable[Sequence[T]]],
                 max_batch: int = 1024) -> None:
        self._run = run
        self._max = max_batch
        self._queued: list[tuple[A, asyncio.Future[T]]] = []
        self._running: asyncio.Future[None] | None = None

    async def submit(self, arg: A) -> T:
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[T] = loop.create_future()
        self._queued.append((arg, mine))
        while not mine.done():
            if self._running is None:
                await self._lead(loop)
            else:
                waits: list[asyncio.Future[Any]] = [mine, self._running]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        return mine.result()

    async def _lead(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queued = self._queued[:self._max], self._queued[self._max:]
        self._running = running = loop.create_future()
        try:
            results = await self._run([a for a, _ in batch])
        except BaseException as exc:
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc if isinstance(exc, Exception)
                                    else ConnectionAbortedError("the batch was cancelled"))
            raise
        else:
            for (_, f), r in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(r)
        finally:
            self._running = None
            running.set_result(None)

