"""Keeps the daemon's Unix socket reachable: a file deleted or replaced at the socket path
(a cleanup script, a ``rm -rf`` of the runtime folder) is noticed by a cheap periodic stat
and the listener is bound again. If that fails the task raises, and the supervisor stops
the daemon with an error rather than leave it running where no client can reach it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from tidemesh.daemon.process.server import IpcServer

log = structlog.get_logger(__name__)

CHECK_INTERVAL_S = 2.0


def socket_problem(path: Path, bound: tuple[int, int] | None) -> str | None:
    """Why ``path`` no longer reaches the socket we bound (``"gone"``/``"replaced"``), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "gone"
    return None if (st.st_dev, st.st_ino) == bound else "replaced"


class SocketWatch:
    def __init__(self, server: IpcServer, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.server = server
        self.interval_s = interval_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            problem = socket_problem(self.server.socket_path, self.server.socket_identity)
            if problem is None:
                continue
            try:
                await self.server.rebind_unix()
            except OSError as exc:
                log.error("ipc_socket_lost", socket=str(self.server.socket_path),
                          problem=problem, error=str(exc))
                raise
            log.warning("ipc_socket_recreated", socket=str(self.server.socket_path),
                        problem=problem)
