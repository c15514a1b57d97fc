"""In-memory fan-out of committed events to live SSE clients, with bounded buffers.

Durability lives in the event log (inbox.db ``events``); this bus only wakes the streams.
A client whose buffer fills is marked dropped and must reconnect with Last-Event-ID: one
stalled reader never blocks the publisher or the other readers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tidemesh.core.errors import Busy
from tidemesh.daemon.records import Event


@dataclass(eq=False, slots=True)
class Subscriber:
    queue: asyncio.Queue[Event]
    dropped: asyncio.Event = field(default_factory=asyncio.Event)


class EventBus:
    def __init__(self, max_subscribers: int = 32, buffer: int = 1000) -> None:
        self.max_subscribers = max_subscribers
        self.buffer = buffer
        self._subs: set[Subscriber] = set()
        self.dropped_total = 0

    def subscribe(self) -> Subscriber:
        if len(self._subs) >= self.max_subscribers:
            raise Busy(f"already {self.max_subscribers} event streams open",
                       reason="too_many_streams")
        sub = Subscriber(asyncio.Queue(self.buffer))
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subs.discard(sub)

    def publish(self, event: Event) -> None:
        for sub in list(self._subs):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.dropped.set()
                self._subs.discard(sub)
                self.dropped_total += 1

    def close(self) -> None:
        """End every live stream now (at shutdown); clients reconnect with Last-Event-ID."""
        for sub in list(self._subs):
            sub.dropped.set()
        self._subs.clear()

    @property
    def subscribers(self) -> int:
        return len(self._subs)
