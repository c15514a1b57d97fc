"""Brokers on one PostgreSQL database hear each other through LISTEN/NOTIFY (DESIGN §10),
and share who is connected where in ``mesh.member_session`` (one row per member: the newest
session's) beside ``mesh.broker_alive`` (each broker's heartbeat).

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
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import asyncpg
import structlog

from tidemesh.broker.store.cluster import ClusterEvents, Key, SessionRow
from tidemesh.core.backoff import Backoff
from tidemesh.storage.postgres import DB_ERRORS

log = structlog.get_logger(__name__)
T = TypeVar("T")

WAKE_CHANNEL = "tidemesh_wake"          # {"b": sender broker, "k": [[mesh_id, pubkey], …]}
SESSION_CHANNEL = "tidemesh_session"    # {"b": holder broker, "m", "p", "s": session to close}
#                     or {"b", "m", "p", "h": host, "clone": "close" | "tell", "policy"}
PRESENCE_CHANNEL = "tidemesh_presence"  # {"b": sender broker, "fs": [peer_join/peer_leave]}
#                     (or "f": one frame, from brokers before batches)
REVOKED_CHANNEL = "tidemesh_revoked"    # {"m", "p"}: a member revoked (or left), at commit
# NOTIFY payloads must stay under 8000 bytes; keys are sent in chunks well below that.
PAYLOAD_BUDGET = 7000
# Presence events waiting for their NOTIFY; past this the oldest are dropped (and counted).
PRESENCE_BACKLOG = 10_000
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
        self._presence_out: list[dict[str, Any]] = []
        # Presence events the others could not be told (counted by the service, not logged:
        # a storm is thousands).
        self.presence_unsent: Callable[[int], None] = lambda _n: None
        self._queued = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def publish_wake(self, keys: set[Key]) -> None:
        self._outgoing |= keys
        self._queued.set()

    async def publish_taken_over(self, broker_id: str, mesh_id: str, pubkey: str,
                                 session_id: str) -> None:
        await self._notify(SESSION_CHANNEL, {"b": broker_id, "m": mesh_id, "p": pubkey,
                                             "s": session_id})

    def publish_presence(self, frame: dict[str, Any]) -> None:
        # Sent in the background, many events per NOTIFY (a storm of joins was one pooled
        # query each, queued in front of the handshakes' own).
        self._presence_out.append(frame)
        if len(self._presence_out) > PRESENCE_BACKLOG:
            del self._presence_out[0]
            self.presence_unsent(1)
        self._queued.set()

    async def _notify(self, channel: str, message: dict[str, Any]) -> None:
        try:
            await self.pool.execute("SELECT pg_notify($1, $2)", channel,
                                    json.dumps(message, separators=(",", ":")))
        except DB_ERRORS as exc:  # a takeover also ends on expiry
            log.warning("broker_cluster_unsent", channel=channel, error=str(exc))

    async def heartbeat(self, now_ms: int, stale_before: int,
                        live: Callable[[], Sequence[SessionRow]]) -> Sequence[SessionRow]:
        async with self.pool.acquire() as conn, conn.transaction():
            last = await conn.fetchval(
                "SELECT heartbeat_at FROM mesh.broker_alive WHERE broker_id = $1 FOR UPDATE",
                self.broker_id)
            await conn.execute(
                "INSERT INTO mesh.broker_alive (broker_id, heartbeat_at) VALUES ($1, $2)"
                " ON CONFLICT (broker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
                self.broker_id, now_ms)
            if last is not None and last >= stale_before:
                return ()   # nobody can have expired our sessions: nothing to put back
            rows = live()
            if rows:
                # One statement for all; only missing rows: a row another broker holds is its
                # takeover, not ours.
                cols = list(zip(*(_args(r) for r in rows), strict=True))
                await conn.execute(
                    "INSERT INTO mesh.member_session (mesh_id, pubkey, broker_id, session_id,"
                    " display_name, profile, connected_at, host) SELECT * FROM unnest("
                    "$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],"
                    " $7::bigint[], $8::text[]) ON CONFLICT DO NOTHING", *cols)
            return rows

    async def claim(self, row: SessionRow) -> SessionRow | None:
        old = await self.pool.fetchrow(CLAIM_SESSION_SQL, *_args(row))
        return None if old is None else _session(old)

    async def release(self, mesh_id: str, pubkey: str, session_id: str,
                      successor: SessionRow | None) -> bool:
        if successor is None:
            done = await self.pool.execute(
                "DELETE FROM mesh.member_session WHERE mesh_id = $1 AND pubkey = $2"
                " AND session_id = $3", mesh_id, pubkey, session_id)
        else:
            done = await self.pool.execute(
                "UPDATE mesh.member_session SET session_id = $4, connected_at = $5"
                " WHERE mesh_id = $1 AND pubkey = $2 AND session_id = $3",
                mesh_id, pubkey, session_id, successor.session_id, successor.connected_at)
        return bool(int(done.rsplit(" ", 1)[1]))

    async def expire(self, alive_after: int) -> list[SessionRow]:
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "DELETE FROM mesh.member_session s WHERE NOT EXISTS (SELECT 1"
                " FROM mesh.broker_alive b WHERE b.broker_id = s.broker_id"
                " AND b.heartbeat_at >= $1) RETURNING mesh_id, pubkey, broker_id, session_id,"
                " display_name, profile, connected_at, host", alive_after)
            await conn.execute("DELETE FROM mesh.broker_alive WHERE heartbeat_at < $1",
                               alive_after)
        return [_session(r) for r in rows]

    async def sessions(self, mesh_id: str, alive_after: int) -> list[SessionRow]:
        rows = await self.pool.fetch(
            "SELECT mesh_id, pubkey, broker_id, session_id, display_name, profile, connected_at,"
            " host FROM mesh.member_session s WHERE mesh_id = $1 AND broker_id <> $3"
            " AND EXISTS (SELECT 1 FROM mesh.broker_alive b WHERE b.broker_id = s.broker_id"
            " AND b.heartbeat_at >= $2) ORDER BY pubkey", mesh_id, alive_after, self.broker_id)
        return [_session(r) for r in rows]

    async def session_of(self, mesh_id: str, pubkey: str, alive_after: int) -> SessionRow | None:
        row = await self.pool.fetchrow(
            "SELECT mesh_id, pubkey, broker_id, session_id, display_name, profile, connected_at,"
            " host FROM mesh.member_session s WHERE mesh_id = $1 AND pubkey = $2"
            " AND EXISTS (SELECT 1 FROM mesh.broker_alive b WHERE b.broker_id = s.broker_id"
            " AND b.heartbeat_at >= $3)", mesh_id, pubkey, alive_after)
        return None if row is None else _session(row)

    async def publish_clone(self, broker_id: str, mesh_id: str, pubkey: str, host: str,
                            new_host: str, close: bool, policy: str) -> None:
        await self._notify(SESSION_CHANNEL, {"b": broker_id, "m": mesh_id, "p": pubkey,
                                             "h": host, "n": new_host,
                                             "clone": "close" if close else "tell",
                                             "policy": policy})

    async def save_profile(self, mesh_id: str, pubkey: str, profile: str) -> None:
        await self.pool.execute(
            "UPDATE mesh.member_session SET profile = $3 WHERE mesh_id = $1 AND pubkey = $2"
            " AND broker_id = $4", mesh_id, pubkey, profile, self.broker_id)

    async def exclusively(self, job: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """``fn`` under a session advisory lock named after ``job``, held by one pooled
        connection for the whole run (``fn`` uses others); none waits: a broker that does not
        get the lock skips the round, the holder does the work once."""
        key = zlib.crc32(f"tidemesh:{job}".encode())
        async with self.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
                log.debug("broker_job_skipped", job=job, reason="running on another broker")
                return None
            try:
                return await fn()
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", key)

    async def run(self, events: ClusterEvents) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publish(), name="cluster-notify")
            tg.create_task(self._listen(events), name="cluster-listen")

    async def unacked(self, keys: Sequence[Key]) -> list[tuple[str, str, int, int]]:
        if not keys:
            return []
        rows = await self.pool.fetch(UNACKED_SQL, [k[0] for k in keys], [k[1] for k in keys])
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    async def _publish(self) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            keys, self._outgoing = self._outgoing, set()
            frames, self._presence_out = self._presence_out, []
            for payload, count in presence_payloads(self.broker_id, frames):
                try:
                    await self.pool.execute("SELECT pg_notify($1, $2)", PRESENCE_CHANNEL,
                                            payload)
                except DB_ERRORS:
                    self.presence_unsent(count)
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

            def heard(_c: Any, _pid: int, channel: str, payload: str) -> None:
                self._heard(events, channel, payload)

            for channel in (WAKE_CHANNEL, SESSION_CHANNEL, PRESENCE_CHANNEL, REVOKED_CHANNEL):
                await conn.add_listener(channel, heard)
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

    def _heard(self, events: ClusterEvents, channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
            if channel == REVOKED_CHANNEL:   # from the revoking process, any broker's or CLI's
                self._spawn(events.on_revoked(str(message["m"]), str(message["p"])))
            elif channel == SESSION_CHANNEL:
                if message["b"] != self.broker_id:  # only the holder acts on its session
                    return
                if "clone" in message:
                    # "n" is absent from a broker of an earlier version.
                    new_host = message.get("n")
                    self._spawn(events.on_clone(str(message["m"]), str(message["p"]),
                                                str(message["h"]),
                                                None if new_host is None else str(new_host),
                                                message["clone"] == "close",
                                                str(message["policy"])))
                else:
                    self._spawn(events.on_taken_over(str(message["m"]), str(message["p"]),
                                                     str(message["s"])))
            elif message["b"] == self.broker_id:
                return  # our own: told here already, when it happened
            elif channel == PRESENCE_CHANNEL:
                for frame in message.get("fs") or [message["f"]]:
                    self._spawn(events.on_presence(dict(frame)))
            else:
                events.on_wake((str(m), str(p)) for m, p in message["k"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("broker_cluster_message_invalid", channel=channel, error=repr(exc))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run what a notification asks (it sends frames) outside asyncpg's callback; the
        task is held until done so it is not collected, and its failure is logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("broker_cluster_event_failed", error=repr(task.exception()))


# One statement, one round trip (it was four: BEGIN, the locking read, the upsert, COMMIT),
# taken by every handshake: the row it replaces is read, locked, then overwritten; a
# data-modifying WITH runs whether or not it is read.
CLAIM_SESSION_SQL = """
WITH old AS (
  SELECT mesh_id, pubkey, broker_id, session_id, display_name, profile, connected_at, host
  FROM mesh.member_session WHERE mesh_id = $1 AND pubkey = $2 FOR UPDATE),
upsert AS (
  INSERT INTO mesh.member_session (mesh_id, pubkey, broker_id, session_id, display_name,
                                   profile, connected_at, host)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
  ON CONFLICT (mesh_id, pubkey) DO UPDATE SET broker_id = excluded.broker_id,
    session_id = excluded.session_id, display_name = excluded.display_name,
    profile = excluded.profile, connected_at = excluded.connected_at, host = excluded.host
  RETURNING 1)
SELECT * FROM old
"""


def _args(r: SessionRow) -> tuple[Any, ...]:
    return (r.mesh_id, r.pubkey, r.broker_id, r.session_id, r.display_name,
            json.dumps(r.profile) if r.profile else None, r.connected_at, r.host)


def _session(r: Sequence[Any]) -> SessionRow:
    return SessionRow(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]) if r[5] else {},
                      int(r[6]), r[7] if len(r) > 7 else None)


# Recipients with deliveries not acked, and those whose topics logged past what they were
# handed (counted one past their last seq: their pump has something to hand out and send).
# Each member's subscriptions by their index (``LATERAL … OFFSET 0``, as LAGS_SQL): the
# generic plan joined each member to every subscription of its topic, 1,000 × 1,000 rows
# for 1,000 members in 160 ms at every poll.
UNACKED_SQL = """
SELECT c.mesh_id, c.recipient_pubkey, c.epoch, c.last_seq
FROM mesh.recipient_cursor c JOIN unnest($1::text[], $2::text[]) AS k(m, p)
  ON c.mesh_id = k.m AND c.recipient_pubkey = k.p WHERE c.last_seq > c.acked_seq
UNION
SELECT DISTINCT s.mesh_id, s.member_pubkey, COALESCE(c.epoch, 1), COALESCE(c.last_seq, 0) + 1
FROM unnest($1::text[], $2::text[]) AS k(m, p)
CROSS JOIN LATERAL (SELECT * FROM mesh.topic_subscription s
                    WHERE s.mesh_id = k.m AND s.member_pubkey = k.p OFFSET 0) s
JOIN mesh.topic t ON t.mesh_id = s.mesh_id AND t.name = s.topic AND t.last_pos > s.log_pos
LEFT JOIN mesh.recipient_cursor c ON c.mesh_id = k.m AND c.recipient_pubkey = k.p
"""


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


def presence_payloads(broker_id: str, frames: list[dict[str, Any]]) -> Iterator[tuple[str, int]]:
    """The frames as JSON payloads under PAYLOAD_BUDGET bytes, with how many each holds."""
    chunk: list[str] = []
    size = 0
    for frame in frames:
        text = json.dumps(frame, separators=(",", ":"))
        if chunk and size + len(text) + 1 > PAYLOAD_BUDGET:
            yield f'{{"b":{json.dumps(broker_id)},"fs":[{",".join(chunk)}]}}', len(chunk)
            chunk, size = [], 0
        chunk.append(text)
        size += len(text) + 1
    if chunk:
        yield f'{{"b":{json.dumps(broker_id)},"fs":[{",".join(chunk)}]}}', len(chunk)
