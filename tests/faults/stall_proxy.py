"""A WebSocket proxy in front of a real broker that goes quiet at a chosen step.

Its ``stall_on``-th connection (counted from 1) forwards frames both ways until the daemon
sends a frame of the chosen type, drops that frame and everything after it, and keeps the
socket open (it still answers pings: a stalled broker process whose sockets stay up). With
``talking``, the stalled connection keeps sending the daemon frames that answer nothing (a
late answer to an unknown request, every 0.2 s): a broker whose presence feed runs on while
what answers requests is stuck.
``"open"`` stalls right after the WebSocket handshake, before the broker's challenge. Other
connections pass through. It runs on a thread of its own, so that a test blocking its own
loop cannot hold it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


class StallProxy:
    def __init__(self, upstream: str, stall_at: str, stall_on: int = 1,
                 talking: bool = False) -> None:
        self.upstream = upstream
        self.talking = talking
        self.stall_at = stall_at
        self.stall_on = stall_on
        self.connections = 0
        self.stalled = threading.Event()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="stall-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._handle, "127.0.0.1", 0, compression=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        stall = self.connections == self.stall_on
        if stall and self.stall_at == "open":
            self.stalled.set()
            await ws.wait_closed()
            return
        quiet = asyncio.Event()
        async with connect(self.upstream, compression=None, max_size=None) as up:
            async def down() -> None:
                async for raw in up:
                    if not quiet.is_set():
                        await ws.send(raw)

            async def upward() -> None:
                async for raw in ws:
                    if quiet.is_set():
                        continue
                    if stall and json.loads(raw).get("type") == self.stall_at:
                        quiet.set()
                        self.stalled.set()
                        if self.talking:
                            tasks.append(asyncio.create_task(self._chatter(ws)))
                        continue
                    await up.send(raw)

            tasks = [asyncio.create_task(down()), asyncio.create_task(upward())]
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait(tasks[:2], return_when=asyncio.FIRST_COMPLETED)
            if quiet.is_set():
                # The broker may give up on us meanwhile; the daemon must still see no answer.
                await ws.wait_closed()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _chatter(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(json.dumps({"type": "result", "id": "r999999", "ok": True}))
                await asyncio.sleep(0.2)

    @contextlib.contextmanager
    def running(self) -> Iterator[StallProxy]:
        self._thread.start()
        self._ready.wait(10)
        try:
            yield self
        finally:
            if self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
