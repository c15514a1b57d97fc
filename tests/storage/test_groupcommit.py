"""Group commit (storage/groupcommit.py): a batch's leader or a waiter cancelled mid-way
(its connection closed) costs the other callers nothing, and loses no item."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tidemesh.storage.groupcommit import GroupCommit


class Runs:
    """A ``run`` that records each batch and holds it until released."""

    def __init__(self, fail: Exception | None = None,
                 cancelled_as: Exception | None = None) -> None:
        self.batches: list[list[str]] = []
        self.leaders: list[asyncio.Task[Any] | None] = []
        self.release = asyncio.Event()
        self.fail = fail
        # What a cancel while it waits comes back as, if not CancelledError (asyncpg's for a
        # query on a connection PostgreSQL just dropped: a connection error).
        self.cancelled_as = cancelled_as

    async def __call__(self, args: Sequence[str]) -> list[str]:
        self.batches.append(list(args))
        self.leaders.append(asyncio.current_task())
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            if self.cancelled_as is None:
                raise
            raise self.cancelled_as from None
        if self.fail is not None:
            raise self.fail
        return [a.upper() for a in args]


async def started(runs: Runs, n: int) -> None:
    while len(runs.batches) < n:
        await asyncio.sleep(0)


async def test_the_others_of_a_batch_whose_leader_was_cancelled_get_their_answers() -> None:
    runs = Runs()
    group: GroupCommit[str, str] = GroupCommit(runs)
    first = asyncio.create_task(group.submit("a"))
    await started(runs, 1)
    tasks = {x: asyncio.create_task(group.submit(x)) for x in ("b", "c")}
    await asyncio.sleep(0)
    runs.release.set()
    assert await first == "A"
    runs.release.clear()
    await started(runs, 2)
    assert sorted(runs.batches[1]) == ["b", "c"]
    # b and c share the second batch; it runs in its leader's task, which goes away.
    leader = next(x for x, t in tasks.items() if t is runs.leaders[1])
    other = "c" if leader == "b" else "b"
    tasks[leader].cancel()
    await asyncio.sleep(0)
    runs.release.set()
    # Before: the other got ConnectionAbortedError for a batch cut by another's cancel.
    assert await tasks[other] == other.upper()
    assert tasks[leader].cancelled()
    assert runs.batches[2:] == [[other]]


async def test_a_waiter_cancelled_before_its_batch_ran_is_not_run() -> None:
    runs = Runs()
    group: GroupCommit[str, str] = GroupCommit(runs)
    first = asyncio.create_task(group.submit("a"))
    await started(runs, 1)
    gone = asyncio.create_task(group.submit("gone"))
    kept = asyncio.create_task(group.submit("kept"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    runs.release.set()
    assert await first == "A" and await kept == "KEPT"
    assert runs.batches == [["a"], ["kept"]]


async def test_callers_made_ready_together_share_one_batch() -> None:
    # N pumps woken by one message: the first leads, the others go in its batch, not the next.
    runs = Runs()
    runs.release.set()
    group: GroupCommit[str, str] = GroupCommit(runs)
    assert await asyncio.gather(*(group.submit(x) for x in "abc")) == ["A", "B", "C"]
    assert runs.batches == [["a", "b", "c"]]


async def test_a_waiter_cancelled_as_the_batch_ends_leaves_the_lead_to_the_next() -> None:
    runs = Runs()
    group: GroupCommit[str, str] = GroupCommit(runs)
    first = asyncio.create_task(group.submit("a"))
    await started(runs, 1)
    gone = asyncio.create_task(group.submit("gone"))
    kept = asyncio.create_task(group.submit("kept"))
    await asyncio.sleep(0)
    runs.release.set()
    gone.cancel()   # the first waiter, the one the ending batch would ask to lead
    async with asyncio.timeout(5):   # not left waiting for a leader that is gone
        assert await first == "A" and await kept == "KEPT"
    assert gone.cancelled()
    assert runs.batches == [["a"], ["kept"]]


async def test_a_leader_cancelled_as_a_store_error_stops_and_the_others_run_again() -> None:
    runs = Runs(cancelled_as=ConnectionResetError("connection was closed in the middle of "
                                                  "operation"))
    group: GroupCommit[str, str] = GroupCommit(runs)
    tasks = {x: asyncio.create_task(group.submit(x)) for x in ("a", "b")}
    await started(runs, 1)
    leader = next(x for x, t in tasks.items() if t is runs.leaders[0])
    other = "b" if leader == "a" else "a"
    tasks[leader].cancel()
    await asyncio.sleep(0)
    runs.release.set()
    # Before: the leader's submit raised the store error (a retrying caller then went on
    # as if never cancelled) and the other heard it too.
    assert await tasks[other] == other.upper()
    assert tasks[leader].cancelled()
    assert runs.batches[1:] == [[other]]
