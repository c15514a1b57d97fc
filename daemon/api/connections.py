"""How long a connection may take to ask, and how many token-less ones the TCP port holds.

Any local user can connect to the loopback port, and without limits a few hundred
connections that never finish a request head (or send nothing) hold the daemon's file
descriptors until the Unix socket fails too. So each TCP connection starts at the ``Gate``:
it has ``header_timeout_s`` to send a complete request head, and at most
``max_unauthenticated`` connections wait there at once; one more closes the one that has
waited longest, so a client that sends its head at once (with the token) always gets
through. A complete head hands the connection to aiohttp, where the middleware closes it
after its answer unless the request carried the token (``middleware``), and a connection
left idle is closed after ``idle_timeout_s`` (aiohttp's keep-alive). The Unix socket's send
lane applies the same two timeouts itself (``send_lane``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

# A head not complete within this many bytes goes to aiohttp, which answers its 400/431.
MAX_HEAD = 64 * 1024


HEADER_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0
MAX_UNAUTHENTICATED = 64


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The ``ipc.header_timeout_s``, ``ipc.idle_timeout_s`` and ``ipc.max_unauthenticated``
    settings (docs/configuration.md)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_unauthenticated: int = MAX_UNAUTHENTICATED


class Gate:
    """The TCP connections that have not sent a complete request head yet, oldest first."""

    def __init__(self, limits: ConnectionLimits,
                 aiohttp_protocol: Callable[[], asyncio.Protocol]) -> None:
        self.limits = limits
        self.aiohttp_protocol = aiohttp_protocol
        self.waiting: dict[GateConnection, None] = {}   # insertion-ordered: oldest first

    def protocol(self) -> GateConnection:
        return GateConnection(self)

    def admit(self, conn: GateConnection) -> None:
        while len(self.waiting) >= max(self.limits.max_unauthenticated, 1):
            oldest = next(iter(self.waiting))
            oldest.close()
        self.waiting[conn] = None

    def close_all(self) -> None:
        for conn in list(self.waiting):
            conn.close()


class GateConnection(asyncio.Protocol):
    """One TCP connection until its first request head is complete."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        self.gate.admit(self)
        self.timer = asyncio.get_running_loop().call_later(
            self.gate.limits.header_timeout_s, self.close)

    def data_received(self, data: bytes) -> None:
        searched = max(len(self.buf) - 3, 0)
        self.buf += data
        if self.buf.find(b"\r\n\r\n", searched) >= 0 or len(self.buf) > MAX_HEAD:
            self._hand_over()

    def eof_received(self) -> bool:
        return False   # no complete head will come: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._leave()

    def _leave(self) -> None:
        self.gate.waiting.pop(self, None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _hand_over(self) -> None:
        """aiohttp's protocol owns the connection from here, starting with the head."""
        transport = self.transport
        if transport is None:
            return
        self._leave()
        self.transport = None
        protocol = self.gate.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        data, self.buf = bytes(self.buf), bytearray()
        protocol.data_received(data)
