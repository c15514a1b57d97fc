"""The running daemon's keys for opening DMs: its member key, then the archive of
rotated-out keys (``keyarchive.py``), with the two counters of what the archive did, and
the daily sweep that expires archived keys (a supervised background task)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nacl.signing import SigningKey
from prometheus_client import Counter

from tidemesh.core.metrics import CollectorRegistry
from tidemesh.core.sealing import Opened
from tidemesh.daemon.membership import keyarchive
from tidemesh.daemon.membership.keyarchive import Archive, StaleKey

SWEEP_INTERVAL_S = 86_400.0


@dataclass(slots=True)
class Keyring:
    key: SigningKey
    path: Path
    clock: Callable[[], float]
    archived: Counter
    stale: Counter
    archive: Archive = field(default_factory=Archive)

    @classmethod
    def load(cls, key: SigningKey, path: Path, clock: Callable[[], float],
             registry: CollectorRegistry) -> Keyring:
        return cls(key, path, clock,
                   Counter("cm_daemon_decrypt_archived_total", "DMs opened with a rotated-out "
                           "key of keypair-archive.json (sealed before the sender learned the "
                           "new key)", registry=registry),
                   Counter("cm_daemon_decrypt_stale_total", "DMs sealed to a rotated-out key "
                           "whose grace period ended: stored unopened", registry=registry),
                   keyarchive.load(path))

    def open(self, sender: str, ref: str, sealed: bytes, now_ms: int) -> Opened:
        try:
            opened, from_archive = keyarchive.open_dm(self.key, self.archive, now_ms, sender,
                                                      ref, sealed)
        except StaleKey:
            self.stale.inc()
            raise
        if from_archive:
            self.archived.inc()
        return opened

    def sweep(self) -> int:
        """Expire archived keys past their grace, on disk and here; how many went."""
        gone = keyarchive.cleanup(self.path, int(self.clock() * 1000))
        self.archive = keyarchive.load(self.path)
        return len(gone)

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        while True:
            await asyncio.to_thread(self.sweep)
            await asyncio.sleep(interval_s)
