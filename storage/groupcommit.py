"""Group commit without a task of its own: callers that arrive while a batch runs wait for
it, then one of them runs all that queued meanwhile as the next batch, in one call of
``run``. A lone caller runs at once (no batch window; DESIGN §11, "no waiting on an idle
path").

The batch runs in its leader's task, so the leader can be cancelled mid-batch (its
connection closed). That is no failure of the others' work: their items go back to the head
of the queue and one of them runs them as the next batch. ``run`` must therefore be safe to
run again on items a cancelled batch may have committed (hand-outs re-read under their
locks, cumulative acks, reads). A caller cancelled while it waits takes its item out of
the queue (nobody would read its answer)."""

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
        entry = (arg, mine)
        self._queued.append(entry)
        try:
            while not mine.done():
                if self._running is None:
                    await self._lead(loop)
                else:
                    waits: list[asyncio.Future[Any]] = [mine, self._running]
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._forget(entry)
            raise
        return mine.result()

    def _forget(self, entry: tuple[A, asyncio.Future[T]]) -> None:
        for i, queued in enumerate(self._queued):
            if queued is entry:
                del self._queued[i]
                break
        mine = entry[1]
        if not mine.done():
            mine.cancel()   # a batch running it now leaves it be
        elif not mine.cancelled():
            mine.exception()  # retrieved: no "exception was never retrieved" at exit

    async def _lead(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queued = self._queued[:self._max], self._queued[self._max:]
        self._running = running = loop.create_future()
        try:
            results = await self._run([a for a, _ in batch])
        except Exception as exc:  # the store's: every caller of the batch hears it
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc)
        except BaseException:
            # This task was cancelled, not the batch failed: the others run it again.
            self._queued[:0] = [e for e in batch if not e[1].done()]
            raise
        else:
            for (_, f), r in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(r)
        finally:
            self._running = None
            running.set_result(None)
