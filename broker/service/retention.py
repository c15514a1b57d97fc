"""Retention (spec §17.5-6): expired dedupe rows, then messages older than the retention
window whose deliveries are all acked or stalled past the stall window, then shared files
past their own retention (files.retention_days; a persistent file has none)."""

from __future__ import annotations

import structlog

from tidemesh.broker.service.connections import now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.store.base import Store

log = structlog.get_logger(__name__)


class Retention:
    def __init__(self, store: Store, metrics: Metrics, *, retention_days: int,
                 stall_window_hours: int) -> None:
        self.store = store
        self.metrics = metrics
        self.retention_days = retention_days
        self.stall_window_hours = stall_window_hours

    async def sweep(self) -> tuple[int, int]:
        now = now_ms()
        expired = await self.store.delete_expired_dedupe(now)
        pruned = await self.store.prune_messages(now - self.retention_days * 86_400_000,
                                                 now - self.stall_window_hours * 3_600_000)
        files = await self.store.delete_expired_files(now)
        self.metrics.expired.inc(expired)
        self.metrics.pruned.inc(pruned)
        log.info("broker_retention_swept", dedupe_deleted=expired, messages_pruned=pruned,
                 files_deleted=files)
        return expired, pruned
