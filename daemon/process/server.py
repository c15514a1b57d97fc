"""The IPC listeners: the Unix socket (0600) through the send lane, which hands every
request but the sends to aiohttp, and loopback TCP through the gate (``api/connections``),
which hands each connection to aiohttp once its first request head is in."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import structlog
from aiohttp import web

from tidemesh.daemon.api.connections import ConnectionLimits, Gate
from tidemesh.daemon.api.keys import MAX_BODY
from tidemesh.daemon.api.middleware import ipc
from tidemesh.daemon.api.routes import ROUTES
from tidemesh.daemon.api.send_lane import Lane

log = structlog.get_logger(__name__)

# Local programs connect in bursts. When a Unix socket's accept queue is full, connect()
# fails with EAGAIN, which asyncio clients take for "in progress" and then see as a reset
# on their first write; so the queue is as deep as the kernel allows (capped at somaxconn).
ACCEPT_BACKLOG = 4096


def build_app(max_body_bytes: int) -> web.Application:
    app = web.Application(middlewares=[ipc], client_max_size=max_body_bytes)
    app.add_routes(ROUTES)
    app[MAX_BODY] = max_body_bytes
    return app


class IpcServer:
    def __init__(self, app: web.Application, socket_path: Path, tcp_port: int | None,
                 shutdown_timeout: float, limits: ConnectionLimits | None = None) -> None:
        self.app = app
        self.socket_path = socket_path
        self.tcp_port = tcp_port
        self.limits = limits = limits or ConnectionLimits()
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout,
                                    handle_signals=False, keepalive_timeout=limits.idle_timeout_s)
        self.bound_port: int | None = None
        self.shutdown_timeout = shutdown_timeout
        self._lane: Lane | None = None
        self._unix_server: asyncio.AbstractServer | None = None
        self._gate: Gate | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        # (st_dev, st_ino) of the socket file we bound: a file at the path with another
        # identity is not ours (deleted and replaced), and nobody can connect through it.
        self.socket_identity: tuple[int, int] | None = None

    async def start(self) -> None:
        await self.runner.setup()
        server = self.runner.server
        assert server is not None  # set by setup()
        self._lane = Lane(self.app, self.app[MAX_BODY], server,
                          keepalive_s=self.limits.idle_timeout_s,
                          header_timeout_s=self.limits.header_timeout_s)
        await self._bind_unix()
        if self.tcp_port is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.tcp_port))
            self.bound_port = sock.getsockname()[1]
            self._gate = Gate(self.limits, server)
            self._tcp_server = await asyncio.get_running_loop().create_server(
                self._gate.protocol, sock=sock, backlog=ACCEPT_BACKLOG)
        log.info("ipc_listening", socket=str(self.socket_path), tcp_port=self.bound_port)

    async def _bind_unix(self) -> None:
        # We hold the instance lock, so a socket file left here is a dead daemon's (or one
        # that replaced ours: see rebind_unix).
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        assert self._lane is not None
        old_umask = os.umask(0o177)
        try:
            server = await asyncio.get_running_loop().create_unix_server(
                self._lane.protocol, str(self.socket_path), backlog=ACCEPT_BACKLOG)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        st = os.stat(self.socket_path)
        self._unix_server, self.socket_identity = server, (st.st_dev, st.st_ino)

    async def rebind_unix(self) -> None:
        """Listen on a fresh socket file; connections already open go on over the old one."""
        if self._unix_server is not None:
            self._unix_server.close()
        await self._bind_unix()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the timeout), remove the socket.

        aiohttp's cleanup runs the drain (``on_shutdown``), which waits for the lane's sends
        too: they count in the same in-flight figure."""
        if self._unix_server is not None:
            self._unix_server.close()
        if self._tcp_server is not None:
            self._tcp_server.close()
        if self._gate is not None:
            self._gate.close_all()
        if self._lane is not None:
            self._lane.close_idle()
        await self.runner.cleanup()
        if self._lane is not None:
            await self._lane.close(self.shutdown_timeout)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
