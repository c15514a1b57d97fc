"""Brokers on one PostgreSQL database hear each other through LISTEN/NOTIFY (DESIGN §10).

Each broker LISTENs on one dedicated connection (not from the pool: a pooled connection is
handed to other work) and NOTIFYs through its pool after the accept has committed, so a
notification never names an uncommitted row and NOTIFY's commit-time lock stays out of the
accept transaction. Notifications are hints: one lost (a broker killed between commit and
NOTIFY, a LISTEN connection that dropped) delays a delivery until the safety poll, never
loses it. A dropped LISTEN connection is reconnected with backoff; once listening again the
broker wakes all its pumps, since what was said meanwhile went unheard.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

import asyncpg
import structlog

from tidemesh.broker.service.cluster import ClusterEvents, Key
from tidemesh.core.backoff import Backoff
from tidemesh.storage.postgres import DB_ERRORS

log = structlog.get_logger(__name__)

WAKE_CHANNEL = "tidemesh_wake"
# NOTIFY payloads must stay under 8000 bytes; keys are sent in chunks well below that.
PAYLOAD_BUDGET = 7000
# asyncpg notices a dead socket only when it uses it: the LISTEN connection is pinged.
PING_S = 5.0


class PostgresCluster:
    def __init__(self, dsn: str, pool: Any, broker_id: str, *,
                 backoff: Backoff | None = None) -> None:
        self.dsn = dsn
        self.pool = pool
        self.broker_id = broker_id
        self.backoff = backoff or Backoff()
        self._outgoing: set[Key] = set()
        self._queued = asyncio.Event()

    def publish_wake(self, keys: set[Key]) -> None:
        self._outgoing |= keys
        self._queued.set()

    async def run(self, events: ClusterEvents) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publish(), name="cluster-notify")
            tg.create_task(self._listen(events), name="cluster-listen")

    async def unacked(self, keys: Sequence[Key]) -> list[tuple[str, str, int, int]]:
        if not keys:
            return []
        rows = await self.pool.fetch(
            "SELECT c.mesh_id, c.recipient_pubkey, c.epoch, c.last_seq"
            " FROM mesh.recipient_cursor c JOIN unnest($1::text[], $2::text[]) AS k(m, p)"
            " ON c.mesh_id = k.m AND c.recipient_pubkey = k.p WHERE c.last_seq > c.acked_seq",
            [k[0] for k in keys], [k[1] for k in keys])
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    async def _publish(self) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            keys, self._outgoing = self._outgoing, set()
            for payload in wake_payloads(self.broker_id, keys):
                try:
                    await self.pool.execute("SELECT pg_notify($1, $2)", WAKE_CHANNEL, payload)
                except DB_ERRORS as exc:  # the safety poll finds these recipients' rows
                    log.warning("broker_wake_unsent", error=str(exc), recipients=len(keys))

    async def _listen(self, events: ClusterEvents) -> None:
        attempt = 0
        rng = random.Random()  # noqa: S311 - jitter, not secrets
        while True:
            try:
                await self._listen_once(events)
                reason = "closed"
            except (*DB_ERRORS, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
            attempt += 1
            delay = self.backoff.delay(attempt, rng)
            log.warning("broker_cluster_listen_lost", reason=reason, retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)

    async def _listen_once(self, events: ClusterEvents) -> None:
        # Named, so that operators (and tests) can tell it in pg_stat_activity.
        conn = await asyncpg.connect(self.dsn, server_settings={
            "application_name": f"tidemesh-listen-{self.broker_id}"})
        try:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c: lost.set())

            def heard(_c: Any, _pid: int, _channel: str, payload: str) -> None:
                self._heard(events, payload)

            await conn.add_listener(WAKE_CHANNEL, heard)
            log.info("broker_cluster_listening", broker_id=self.broker_id)
            events.on_listening()
            while not lost.is_set():
                try:
                    async with asyncio.timeout(PING_S):
                        await lost.wait()
                except TimeoutError:
                    async with asyncio.timeout(PING_S):
                        await conn.execute("SELECT 1")
        finally:
            conn.terminate()

    def _heard(self, events: ClusterEvents, payload: str) -> None:
        try:
            message = json.loads(payload)
            if message["b"] == self.broker_id:
                return  # our own: those pumps were woken when the accept committed
            events.on_wake((str(m), str(p)) for m, p in message["k"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("broker_cluster_message_invalid", error=repr(exc))


def wake_payloads(broker_id: str, keys: set[Key]) -> Iterator[str]:
    """The keys as JSON payloads, each under PAYLOAD_BUDGET bytes."""
    chunk: list[list[str]] = []
    size = 0
    for mesh_id, pubkey in sorted(keys):
        item_size = len(mesh_id) + len(pubkey) + 8
        if chunk and size + item_size > PAYLOAD_BUDGET:
            yield json.dumps({"b": broker_id, "k": chunk}, separators=(",", ":"))
            chunk, size = [], 0
        chunk.append([mesh_id, pubkey])
        size += item_size
    if chunk:
        yield json.dumps({"b": broker_id, "k": chunk}, separators=(",", ":"))
