"""Whether the running task was asked to stop, for loops that retry what a store throws.

A cancel can reach a task as another exception: asyncpg turns a query cancelled on a
connection PostgreSQL just dropped into a connection error. A loop that catches store
errors and tries again then swallows the cancel, and whatever waits for the task (a broker
connection's TaskGroup, so the connection itself) waits for good. Such a loop asks this
first and stops.
"""

from __future__ import annotations

import asyncio


def being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
