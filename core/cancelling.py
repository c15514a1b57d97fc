"""Whether the running task was asked to stop, for loops that retry what a store throws.

A cancel can reach a task as another exception: asyncpg turns a query cancelled on a
connection PostgreSQL just dropped into a connection error. A loop that catches store
errors and tries again then swallows the cancel, and whatever waits for the task (a broker
connection's TaskGroup, so the connection itself) waits for good. Such a loop asks this
first and stops.

Only for a task that runs no TaskGroup of its own (a connection's pump and presence resync,
a group commit's leader). On Python 3.11 a TaskGroup whose child fails while the group is
already exiting cancels its parent task after it has undone its own cancel, so the parent's
count stays raised for good (3.12 fixed it): asked in the daemon's relay, this ended the
relay as if cancelled and the daemon exited.
"""

from __future__ import annotations

import asyncio


def being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
