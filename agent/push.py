"""Push into the session: each inbox entry for it becomes a ``notifications/claude/channel``.

Where the session stands is a named consumer of the daemon's inbox
(``session.NAME.push``), acked only after the notification was flushed to stdout
(``wire.py``): a server killed mid-push pushes that entry again when it starts, and one
whose push never reached the pipe loses nothing. The daemon's ``/v1/events`` stream only
wakes the loop; what is pushed is read from the consumer, so a missed or repeated event
changes nothing.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any, cast

import structlog
from mcp.server.session import ServerSession
from pydantic import BaseModel

from tidemesh.agent.handlers import Session
from tidemesh.agent.wire import Wire
from tidemesh.client import Event
from tidemesh.core import agents
from tidemesh.core.errors import TidemeshError

log = structlog.get_logger("tidemesh.mcp")
CHANNEL_METHOD = "notifications/claude/channel"
# Between wake-ups a drain runs at least this often (an event lost to a reconnect).
_IDLE_DRAIN_S = 5.0
_RETRY_S = 1.0


class _Notification(BaseModel):
    """A notification of a method outside the SDK's own tables (the channel's)."""

    method: str
    params: dict[str, Any]


class Pusher:
    def __init__(self, session: Session, wire: Wire | None = None) -> None:
        self.session = session
        self._wire = wire      # None in-process (tests over memory streams): nothing to wait on
        self._sent = 0
        self.watched: set[str] = set()   # resource URIs the client subscribed to
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._out: ServerSession | None = None

    def start(self, out: ServerSession) -> None:
        if self._tasks:
            return
        self._out = out
        self._tasks = [asyncio.create_task(self._supervised(self._follow_events), name="events"),
                       asyncio.create_task(self._supervised(self._drain_loop), name="push")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _supervised(self, run: Any) -> None:
        """Keep a loop running through a daemon that is down or restarts."""
        while True:
            try:
                await run()
            except TidemeshError as exc:
                log.warning("mcp_push_paused", code=exc.code, error=exc.message)
            except Exception:
                log.exception("mcp_push_failed")
            await asyncio.sleep(_RETRY_S)

    async def _follow_events(self) -> None:
        async for item in self.session.client.events():
            if not isinstance(item, Event):
                continue
            if item.type == "message":
                self._wake.set()
            elif item.type in ("peer_join", "peer_leave"):
                await self._updated("tidemesh://peers")

    async def _drain_loop(self) -> None:
        if not self.session.member_key:
            await self.session.start()
        while True:
            await self.drain()
            self._wake.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _IDLE_DRAIN_S)

    async def drain(self) -> int:
        """Push every entry after the push cursor; returns how many were pushed."""
        s, pushed = self.session, 0
        while True:
            page = await s.client.inbox(limit=100, consumer=s.push_consumer)
            if not page["items"]:
                return pushed
            for raw in page["items"]:
                entry: dict[str, Any] = dict(raw)
                if s.shown(entry):
                    await self._notify(CHANNEL_METHOD, {
                        "content": agents.channel_content(entry),
                        "meta": agents.channel_meta(entry, s.mesh)})
                    await s.send_receipt(entry, "delivered")
                    pushed += 1
                    s.arrived.set()
                await s.client.ack(s.push_consumer, int(entry["seq"]))
            await self._updated("tidemesh://inbox")

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        assert self._out is not None
        # The SDK types server notifications as its own union; the channel's is not in it,
        # and the session sends any model as {method, params}.
        await self._out.send_notification(cast(Any, _Notification(method=method, params=params)))
        if self._wire is not None and method == CHANNEL_METHOD:
            self._sent += 1
            await self._wire.wait_flushed(self._sent)

    async def _updated(self, uri: str) -> None:
        if uri in self.watched and self._out is not None:
            await self._out.send_resource_updated(uri)
