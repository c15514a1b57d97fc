"""Retention sweeps: forget what no guarantee needs any more (docs/daemon.md, "What the daemon
keeps"), in small transactions through each database's writer, then give the space back.

The policy is core.retention; the SQL is store.retention; this module runs them on a clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import structlog
from prometheus_client import Counter

from tidemesh.core.errors import InsufficientStorage, Unavailable
from tidemesh.core.retention import DAY_MS, HOUR_MS, InboxPolicy, OutboxPolicy
from tidemesh.daemon.store import files, outbox, retention
from tidemesh.daemon.store.db import Connection, Database

log = structlog.get_logger(__name__)
Clock = Callable[[], float]
T = TypeVar("T")

VACUUM_PAGES = 1024
# While the fleet is past its disk budget: how often that is looked at, and the least time
# between two sweeps it brings forward.
URGENT_POLL_S = 1.0
URGENT_GAP_S = 10.0          # pages returned per transaction (4 MiB at the default page size)


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    outbox_margin_ms: int = 24 * HOUR_MS
    dead_retention_ms: int = 30 * DAY_MS
    inbox: InboxPolicy = field(
        default_factory=lambda: InboxPolicy(30 * DAY_MS, 90 * DAY_MS, 30 * DAY_MS))
    batch_rows: int = 500
    max_pause_s: float = 0.25


class RetentionService:
    def __init__(self, outbox_db: Database, inbox_db: Database | None,
                 settings: RetentionSettings, clock: Clock = time.time,
                 deleted: Counter | None = None) -> None:
        self.outbox_db = outbox_db
        self.inbox_db = inbox_db
        self.settings = settings
        self.clock = clock
        self.deleted = deleted if deleted is not None else Counter(
            "cm_daemon_retention_deleted_total", "",
            ["kind"], registry=None)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def outbox_policy(self) -> OutboxPolicy | None:
        max_age = await self.outbox_db.read(partial(outbox.get_meta, key=outbox.MAX_AGE_MS))
        if max_age is None:
            return None
        s = self.settings
        return OutboxPolicy(max_age, s.outbox_margin_ms, s.dead_retention_ms)

    async def prune_outbox(self, dry_run: bool = False) -> dict[str, Any]:
        policy = await self.outbox_policy()
        if policy is None:
            return {"dry_run": dry_run, "deleted": 0, "skipped": (
                "the broker's dedupe window is not known yet: done and aborted rows are kept "
                "until the daemon has connected once")}
        now, db = self._now_ms(), self.outbox_db
        cur, total, finished = retention.Cursor(), 0, False
        while not finished:
            step = partial(retention.outbox_step, cur=cur, policy=policy, now_ms=now,
                           limit=self.settings.batch_rows, dry_run=dry_run)
            n, finished = await self._step(db, step, dry_run)
            total += n
        if not dry_run:
            self.deleted.labels(kind="outbox").inc(total)
            await self._vacuum(db)
        return {"dry_run": dry_run, "deleted": total,
                "max_age_hours": round(policy.max_age_ms / HOUR_MS, 3),
                "settled_before_ms": policy.settled_cutoff(now),
                "dead_before_ms": policy.dead_cutoff(now)}

    async def prune_inbox(self, dry_run: bool = False) -> dict[str, Any]:
        db = self.inbox_db
        if db is None:
            raise Unavailable("the inbox is not open")
        policy, now, size = self.settings.inbox, self._now_ms(), self.settings.batch_rows
        events, after, finished = 0, 0, False
        while not finished:
            ev_step = partial(retention.events_step, after_id=after, policy=policy, now_ms=now,
                              limit=size, dry_run=dry_run)
            n, after, finished = await self._step(db, ev_step, dry_run)
            events += n
        cur, entries, finished = retention.InboxCursor(), 0, False
        while not finished:
            step = partial(retention.inbox_step, cur=cur, policy=policy, now_ms=now,
                           limit=size, dry_run=dry_run)
            n, finished = await self._step(db, step, dry_run)
            entries += n
        prune_files = partial(files.prune, before_ms=policy.cutoff(now), dry_run=dry_run)
        shared = await (db.read(prune_files) if dry_run else db.write(prune_files))
        if not dry_run:
            self.deleted.labels(kind="events").inc(events)
            self.deleted.labels(kind="inbox").inc(entries)
            self.deleted.labels(kind="files").inc(shared)
            await self._vacuum(db)
        return {"dry_run": dry_run, "deleted": entries, "events_deleted": events,
                "files_deleted": shared,
                "before_ms": policy.cutoff(now), "held_until_ms": policy.hold_cutoff(now),
                "events_before_ms": policy.events_cutoff(now)}

    async def _step(self, db: Database, step: Callable[[Connection], T],
                    dry_run: bool) -> T:
        """One batch; then rest as long as it took, so that a long sweep takes at most about
        half of the writer's time and accepts queued behind it wait one batch at most."""
        started = time.monotonic()
        result = await (db.read(step) if dry_run else db.write(step))
        await asyncio.sleep(min(time.monotonic() - started, self.settings.max_pause_s))
        return result

    @staticmethod
    async def _vacuum(db: Database) -> None:
        left = 1
        while left:
            left = await db.write(partial(retention.vacuum_step, pages=VACUUM_PAGES))

    async def sweep(self) -> dict[str, Any]:
        started = time.monotonic()
        out = await self.prune_outbox()
        inn = await self.prune_inbox() if self.inbox_db is not None else {}
        log.info("retention_swept", outbox_deleted=out.get("deleted", 0),
                 inbox_deleted=inn.get("deleted", 0), events_deleted=inn.get("events_deleted", 0),
                 duration_s=round(time.monotonic() - started, 3))
        return {"outbox": out, "inbox": inn}

    async def run(self, interval_s: float, first_after_s: float = 30.0,
                  urgent: Callable[[], bool] = lambda: False) -> None:
        """Sweep now and then, forever. A database that is down or full is tried again at the
        next round; anything else ends the task, and the supervisor stops the daemon.

        While ``urgent()`` (the fleet is past its disk budget) a sweep does not wait for the
        interval: it runs at once, and again every ``URGENT_GAP_S`` while it stays so."""
        due = time.monotonic() + min(first_after_s, interval_s)
        last = float("-inf")
        while True:
            now = time.monotonic()
            early = urgent() and now - last >= URGENT_GAP_S
            if now < due and not early:
                await asyncio.sleep(min(due - now, URGENT_POLL_S))
                continue
            if early and now < due:
                log.warning("retention_sweep_early", reason="fleet_disk_budget")
            try:
                await self.sweep()
            except (Unavailable, InsufficientStorage) as exc:
                log.warning("retention_sweep_failed", error=exc.message)
            last = time.monotonic()
            due = last + interval_s
