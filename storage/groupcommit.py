"""Group commit without a task of its own: callers that arrive while a batch runs wait for
it, then one of them runs all that queued meanwhile as the next batch, in one call of
``run``. A lone caller runs after one turn of the event loop, not a batch window (DESIGN
§11, "no waiting on an idle path"): callers made ready by the same event (the pumps of N
members woken by one message, the acks of N connections read in one poll) go in its batch.

The batch runs in its leader's task, so the leader can be cancelled mid-batch (its
connection closed). That is no failure of the others' work: their items go back to the head
of the queue and one of them runs them as the next batch. ``run`` must therefore be safe to
run again on items a cancelled batch may have committed (hand-outs re-read under their
locks, cumulative acks, reads). A caller cancelled while it waits takes its item out of
the queue (nobody would read its answer).

Each waiter waits on its own future alone: a leader that ends wakes its batch's callers with
their answers and the first queued caller to lead the next batch. (``asyncio.wait`` on the
running batch as well put a callback per waiter on one future and took each off again, a
list scan per caller: a fifth of the broker's CPU with 1,000 members, issue #30.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar, cast

from tidemesh.core.cancelling import being_cancelled

A = TypeVar("A")
T = TypeVar("T")


class _Item(Generic[A, T]):
    __slots__ = ("arg", "done", "error", "result", "wake")

    def __init__(self, arg: A, wake: asyncio.Future[None]) -> None:
        self.arg = arg
        self.wake = wake                        # set when answered, or asked to lead
        self.done = False                       # answered, or its caller is gone
        self.result: T | None = None
        self.error: Exception | None = None

    def answer(self, result: T | None, error: Exception | None = None) -> None:
        if not self.done:
            self.done, self.result, self.error = True, result, error
            if not self.wake.done():
                self.wake.set_result(None)


class GroupCommit(Generic[A, T]):
    def __init__(self, run: Callable[[Sequence[A]], Awaitable[Sequence[T]]],
                 max_batch: int = 1024) -> None:
        self._run = run
        self._max = max_batch
        self._queued: list[_Item[A, T]] = []
        self._running = False

    async def submit(self, arg: A) -> T:
        loop = asyncio.get_running_loop()
        item: _Item[A, T] = _Item(arg, loop.create_future())
        self._queued.append(item)
        try:
            while not item.done:
                if not self._running:
                    await self._lead()
                else:
                    await item.wake
                    if not item.done:   # asked to lead: the loop leads, or waits again
                        item.wake = loop.create_future()
        except BaseException:
            self._forget(item)
            raise
        if item.error is not None:
            raise item.error
        return cast(T, item.result)   # answered: one of run's results

    def _forget(self, item: _Item[A, T]) -> None:
        for i, queued in enumerate(self._queued):
            if queued is item:
                del self._queued[i]
                break
        item.done = True   # a batch running it now leaves it be
        self._hand_on()    # had it been asked to lead, another leads instead

    def _hand_on(self) -> None:
        """Nobody leads and callers wait: wake the first to lead (once)."""
        if not self._running and self._queued:
            first = self._queued[0].wake
            if not first.done():
                first.set_result(None)

    async def _lead(self) -> None:
        self._running = True
        try:
            await asyncio.sleep(0)   # callers made ready with this one join its batch
            batch, self._queued = self._queued[:self._max], self._queued[self._max:]
            try:
                results = await self._run([i.arg for i in batch])
            except BaseException as exc:
                if isinstance(exc, Exception) and not being_cancelled():
                    for i in batch:   # the store's: every caller of the batch hears it
                        i.answer(None, exc)
                    return
                # This task was cancelled, not the batch failed (the cancel may have come as
                # a store error, core/cancelling.py): the others run it again.
                self._queued[:0] = [i for i in batch if not i.done]
                if isinstance(exc, Exception):
                    raise asyncio.CancelledError from exc
                raise
            else:
                for i, r in zip(batch, results, strict=True):
                    i.answer(r)
        finally:
            self._running = False
            self._hand_on()
