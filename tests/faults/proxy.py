"""A loopback TCP proxy between the daemons and the broker that a fault run controls.

The daemons' broker URL points here, so the harness can cut every WebSocket at once (both
sides see the TCP connection drop) or stall them (bytes stop flowing both ways while the
sockets stay open, as on a congested or half-dead network path).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class Link:
    """One proxied connection: its two writers and the two pump tasks between them."""

    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    pumps: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    """Forward 127.0.0.1:``port`` to 127.0.0.1:``target_port``; ``cut()`` and ``stall()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._open: list[Link] = []
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        link = Link((writer, up_writer))
        link.pumps = [asyncio.create_task(self._pump(reader, up_writer)),
                      asyncio.create_task(self._pump(up_reader, writer))]
        self._open.append(link)
        try:
            await asyncio.wait(link.pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._close(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                # A stall holds the bytes here; the kernel buffers fill and both ends block.
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()

    def _close(self, link: Link) -> None:
        for task in link.pumps:
            task.cancel()
        for w in link.writers:
            with contextlib.suppress(Exception):
                w.transport.abort()
        if link in self._open:
            self._open.remove(link)

    def cut(self) -> int:
        """Drop every open connection (a reset both ends see); returns how many."""
        links = list(self._open)
        for link in links:
            self._close(link)
        return len(links)

    async def stall(self, seconds: float) -> None:
        """Stop all traffic for ``seconds`` without closing anything, then let it flow."""
        self._flowing.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._flowing.set()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
