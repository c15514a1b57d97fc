"""A backup asked for over IPC: the same bundle as `tidemesh daemon backup`, made off the
event loop (Argon2id takes about a second and 256 MiB on purpose)."""

from __future__ import annotations

import asyncio
from typing import Any

from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon.offline import backup


class BackupService:
    def __init__(self, paths: DaemonPaths, mesh: str) -> None:
        self.paths = paths
        self.mesh = mesh

    async def make(self, passphrase: str) -> dict[str, Any]:
        data, summary = await asyncio.to_thread(backup.make, self.paths, self.mesh,
                                                passphrase.encode())
        return {**summary, "bundle": backup.encode(data)}
