"""Writes waiting for a writer: how a batch is taken from the queue and how its callers hear
back. Shared by both engines, so that they drain, answer and fail callers the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(slots=True, kw_only=True)
class Pending:
    """One caller's write: its future, and what the writer found for it."""

    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None


P = TypeVar("P", bound=Pending)


def take(queue: asyncio.Queue[P | None], batch: list[P], batch_max: int) -> bool:
    """Move what is queued into ``batch`` (up to ``batch_max``); True when close() was."""
    while len(batch) < batch_max and not queue.empty():
        nxt = queue.get_nowait()
        if nxt is None:
            return True
        batch.append(nxt)
    return False


def answer(batch: Iterable[Pending]) -> None:
    """Resolve each caller's future, after COMMIT (or with the error its write met)."""
    for p in batch:
        if p.future.done():
            continue
        if p.error is not None:
            p.future.set_exception(p.error)
        else:
            p.future.set_result(p.result)


def fail_all(queue: asyncio.Queue[P | None], pending: Iterable[P], err: Exception) -> None:
    """A writer that stops (cancelled, or a bug) fails its batch and everything queued, so
    no caller waits forever."""
    left = list(pending)
    while not queue.empty():
        p = queue.get_nowait()
        if p is not None:
            left.append(p)
    for p in left:
        if not p.future.done():
            p.future.set_exception(err)
