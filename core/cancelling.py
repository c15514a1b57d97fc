"""Whether the running task was asked to stop, for loops that retry what a store throws.

A cancel can reach a task as another exception: asyncpg turns a query cancelled on a
connection PostgreSQL just dropped into a connection error. A loop that catches store
errors and tries again then swallows the cancel, and whatever waits for the task (a broker
connection's TaskGroup, a stop waiting for its background jobs) waits for good. Such a loop
asks one of these first and stops.

``being_cancelled`` reads the task's own cancel count, so it knows of every cancel, but only
a task that runs no TaskGroup of its own may ask it (a connection's pump and presence
resync, a group commit's leader). On Python 3.11 a TaskGroup whose child fails while the
group is already exiting cancels its parent task after it has undone its own cancel, so the
parent's count stays raised for good (3.12 fixed it): asked in the daemon's relay, it ended
the relay as if cancelled and the daemon exited.

``asked_to_stop`` knows only of the cancels sent with ``stop``, which is what a process's
stop sends to its long-lived loops (the relay, the daemon's supervised tasks, the broker's
background jobs); it is safe in a task that runs TaskGroups.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

# Tasks cancelled by ``stop``; weak, so a finished task is not kept for its mark.
_asked: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and mark it: its retry loops see the cancel through
    ``asked_to_stop`` even when it comes back to them as another error."""
    _asked.add(task)
    task.cancel()


def asked_to_stop() -> bool:
    task = asyncio.current_task()
    return task is not None and task in _asked
