"""One aiohttp runner with two sites: the Unix socket (0600) and loopback TCP."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import structlog
from aiohttp import web

from tidemesh.daemon.api.middleware import ipc
from tidemesh.daemon.api.routes import ROUTES

log = structlog.get_logger(__name__)

# Local programs connect in bursts. When a Unix socket's accept queue is full, connect()
# fails with EAGAIN, which asyncio clients take for "in progress" and then see as a reset
# on their first write; so the queue is as deep as the kernel allows (capped at somaxconn).
ACCEPT_BACKLOG = 4096


def build_app(max_body_bytes: int) -> web.Application:
    app = web.Application(middlewares=[ipc], client_max_size=max_body_bytes)
    app.add_routes(ROUTES)
    return app


class IpcServer:
    def __init__(self, app: web.Application, socket_path: Path, tcp_port: int | None,
                 shutdown_timeout: float) -> None:
        self.app = app
        self.socket_path = socket_path
        self.tcp_port = tcp_port
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout,
                                    handle_signals=False)
        self.bound_port: int | None = None

    async def start(self) -> None:
        await self.runner.setup()
        # We hold the instance lock, so a socket file left here is a dead daemon's.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old_umask = os.umask(0o177)
        try:
            await web.UnixSite(self.runner, str(self.socket_path), backlog=ACCEPT_BACKLOG).start()
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        if self.tcp_port is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.tcp_port))
            self.bound_port = sock.getsockname()[1]
            await web.SockSite(self.runner, sock, backlog=ACCEPT_BACKLOG).start()
        log.info("ipc_listening", socket=str(self.socket_path), tcp_port=self.bound_port)

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the timeout), remove the socket."""
        await self.runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
