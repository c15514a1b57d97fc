"""PostgreSQL adapter (asyncpg): tables in schema ``mesh``, group-committed accepts.

Concurrent sends are drained into batches by several writer connections (so batches
overlap each other's COMMIT; PostgreSQL flushes concurrent commits together). Each sender
belongs to one writer, which keeps its sends in arrival order: a recipient's seq follows the
order the broker received one sender's sends in. A batch runs
spec §4.7.2 as ``unnest()``-batched statements in one transaction, seven round trips
whatever its size: BEGIN; claim every key (``INSERT … ON CONFLICT DO NOTHING``); read them
all back ``FOR SHARE`` and branch each 201 / 200 / 409; check B2 for the claimed ones in one
query (a failure deletes its claim in the same transaction, which is the same as rolling it
back: nobody ever sees it); insert messages with their history rows; bump the recipients'
cursors and insert gapless delivery rows; COMMIT.

If any statement fails, the batch is redone in a new transaction with a savepoint per send
(``_accept_alone``), so only the send that fails again gets a 5xx. Sends of one key in one
batch are split: the later ones wait for the writer's next batch, so each is decided
against what the first one wrote. Claims are made in key order and cursor rows locked in
(mesh, recipient) order, so several brokers on one database cannot deadlock. Answers leave
only after COMMIT.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from tidemesh.broker.accept import (
    AcceptInput,
    AcceptResult,
    Branch,
    DedupeRow,
    Delivery,
    answer_existing,
    branch,
    created,
    failed,
    pick_queue_consumer,
    recipients_for,
)
from tidemesh.broker.store import migrate
from tidemesh.broker.store.base import (
    TABLES,
    Cursor,
    DeliveryRow,
    Member,
    Mesh,
    Reassigned,
    invite_refused,
)
from tidemesh.core.errors import (
    Conflict,
    NotFound,
    TidemeshError,
    Unavailable,
    UnknownDestination,
)
from tidemesh.core.ids import new_ulid

log = structlog.get_logger(__name__)
# InternalClientError: a connection left mid-operation by a server that went away (e.g. a
# shutdown during a statement) refuses the next one; it is an outage of that connection.
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
              OSError)
# Errors of the server or the connection, not of one send: a savepoint retry cannot help.
_CONNECTION_ERRORS = (asyncpg.exceptions.OperatorInterventionError,
                      asyncpg.exceptions.PostgresConnectionError)


@dataclass(slots=True)
class _Pending:
    item: AcceptInput
    future: asyncio.Future[AcceptResult]


class PostgresStore:
    """The ``Store`` on PostgreSQL; construct with ``PostgresStore.open``."""

    outage_errors: tuple[type[Exception], ...] = (Unavailable, *_DB_ERRORS)

    def __init__(self, dsn: str, pool: Any, batch_max: int, writers: int) -> None:
        self.dsn = dsn
        self.pool = pool
        self.batch_max = batch_max
        self.writers = writers
        # One queue per writer, chosen by sender: a sender's sends are committed by one writer
        # in the order they arrived, so each recipient sees them in that order.
        self._queues: list[asyncio.Queue[_Pending | None]] = [
            asyncio.Queue() for _ in range(writers)]
        self._tasks: list[asyncio.Task[None]] = []
        self.batches = 0
        self.items = 0
        self.on_batch: Callable[[int, float], None] | None = None

    @classmethod
    async def open(cls, dsn: str, *, pool_size: int = 4, batch_max: int = 512,
                   writers: int = 2, migrate_now: bool = True) -> PostgresStore:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=pool_size)
        try:
            async with pool.acquire() as conn:
                if migrate_now:
                    await migrate.apply_postgres(conn)
                else:
                    await migrate.require_current_postgres(conn)
        except BaseException:
            await pool.close()
            raise
        store = cls(dsn, pool, batch_max, writers)
        # Several writers overlap one batch's statements with others' COMMITs; PostgreSQL
        # flushes concurrent commits together, so the fsync is shared too.
        store._tasks = [asyncio.create_task(store._run(q), name=f"broker-pg-accept-{i}")
                        for i, q in enumerate(store._queues)]
        return store

    async def close(self) -> None:
        for q in self._queues:
            q.put_nowait(None)
        await asyncio.gather(*(t for t in self._tasks if not t.done()))
        await self.pool.close()

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        return self._tasks

    # -- accept (group commit) -----------------------------------------------------------

    async def accept(self, item: AcceptInput) -> AcceptResult:
        i = hash((item.mesh_id, item.sender_pubkey)) % self.writers
        if self._tasks[i].done():
            return failed(item, Unavailable("the broker store writer is not running"))
        fut: asyncio.Future[AcceptResult] = asyncio.get_running_loop().create_future()
        self._queues[i].put_nowait(_Pending(item, fut))
        return await fut

    async def _run(self, queue: asyncio.Queue[_Pending | None]) -> None:
        carry: list[_Pending] = []
        conn: Any = None
        stopping = False
        try:
            while not (stopping and not carry):
                batch, stopping = await self._next_batch(queue, carry, stopping)
                carry = []
                if not batch:
                    continue
                leaders: list[_Pending] = []
                seen: set[tuple[str, str, str]] = set()
                for p in batch:
                    if p.item.key in seen:
                        carry.append(p)  # decided after the first one commits
                    else:
                        seen.add(p.item.key)
                        leaders.append(p)
                started = time.perf_counter()
                conn, results = await self._commit(conn, [p.item for p in leaders])
                self.batches += 1
                self.items += len(leaders)
                if self.on_batch is not None:
                    self.on_batch(len(leaders), time.perf_counter() - started)
                for p, r in zip(leaders, results, strict=True):
                    if not p.future.done():
                        p.future.set_result(r)
        finally:
            if conn is not None:
                await conn.close()

    async def _next_batch(self, queue: asyncio.Queue[_Pending | None], carry: list[_Pending],
                          stopping: bool) -> tuple[list[_Pending], bool]:
        batch = list(carry)
        if stopping:
            return batch, True
        if not batch:
            first = await queue.get()
            if first is None:
                return [], True
            batch.append(first)
            # Let the sends that arrived with this one reach the queue: fewer, fuller batches.
            await asyncio.sleep(0)
        while len(batch) < self.batch_max and not queue.empty():
            nxt = queue.get_nowait()
            if nxt is None:
                stopping = True
                break
            batch.append(nxt)
        return batch, stopping

    async def _commit(self, conn: Any, items: list[AcceptInput]
                      ) -> tuple[Any, list[AcceptResult]]:
        try:
            if conn is None or conn.is_closed():
                conn = await asyncpg.connect(self.dsn)
            try:
                async with conn.transaction():
                    results = await _accept_many(conn, items)
                return conn, results
            except asyncpg.PostgresError as exc:
                if isinstance(exc, _CONNECTION_ERRORS):
                    raise
                # The batch rolled back whole; redo it with a savepoint per send so that
                # only the send that fails again gets the 5xx.
                log.warning("broker_batch_split", error=str(exc), items=len(items))
            async with conn.transaction():
                return conn, [await _accept_alone(conn, a) for a in items]
        except _DB_ERRORS as exc:
            log.error("broker_commit_failed", error=str(exc), items=len(items))
            if conn is not None:
                conn.terminate()
            err = Unavailable(f"the broker store could not commit: {exc}")
            return None, [failed(a, err) for a in items]

    # -- membership ----------------------------------------------------------------------

    async def create_mesh(self, name: str, now_ms: int) -> Mesh:
        mesh = Mesh(new_ulid(now_ms), name, now_ms)
        try:
            await self.pool.execute("INSERT INTO mesh.mesh (id, name, created_at)"
                                    " VALUES ($1, $2, $3)", mesh.id, name, now_ms)
        except asyncpg.UniqueViolationError as exc:
            raise Conflict(f"a mesh named {name!r} exists already", field="name") from exc
        return mesh

    async def find_mesh(self, name_or_id: str) -> Mesh | None:
        r = await self.pool.fetchrow("SELECT id, name, created_at FROM mesh.mesh"
                                     " WHERE id = $1 OR name = $1", name_or_id)
        return Mesh(*r) if r else None

    async def create_invite(self, mesh_id: str, token_sha256: bytes, max_uses: int,
                            expires_at: int | None, now_ms: int) -> str:
        invite_id = new_ulid(now_ms)
        await self.pool.execute(
            "INSERT INTO mesh.invite (id, mesh_id, token_sha256, max_uses, created_at,"
            " expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
            invite_id, mesh_id, token_sha256, max_uses, now_ms, expires_at)
        return invite_id

    async def redeem_invite(self, mesh_id: str, token_sha256: bytes, pubkey: str,
                            display_name: str | None, now_ms: int) -> Member:
        async with self.pool.acquire() as conn, conn.transaction():
            existing = await _member(conn, mesh_id, pubkey)
            if existing is not None and existing.revoked_at is None:
                return existing
            if existing is not None:
                raise NotFound("this key was revoked from the mesh", reason="member_revoked")
            invite_id = await conn.fetchval(
                "UPDATE mesh.invite SET uses = uses + 1 WHERE mesh_id = $1 AND token_sha256 = $2"
                " AND revoked_at IS NULL AND uses < max_uses"
                " AND (expires_at IS NULL OR expires_at > $3) RETURNING id",
                mesh_id, token_sha256, now_ms)
            if invite_id is None:
                state = await conn.fetchrow(INVITE_STATE_SQL, mesh_id, token_sha256)
                raise invite_refused(state, now_ms)
            await conn.execute(
                "INSERT INTO mesh.member (mesh_id, pubkey, display_name, invite_id, joined_at)"
                " VALUES ($1, $2, $3, $4, $5)", mesh_id, pubkey, display_name, invite_id, now_ms)
            return Member(mesh_id, pubkey, display_name, now_ms, None)

    async def add_member(self, mesh_id: str, pubkey: str, now_ms: int) -> None:
        await self.pool.execute("INSERT INTO mesh.member (mesh_id, pubkey, joined_at)"
                                " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                                mesh_id, pubkey, now_ms)

    async def get_member(self, mesh_id: str, pubkey: str) -> Member | None:
        async with self.pool.acquire() as conn:
            return await _member(conn, mesh_id, pubkey)

    async def list_members(self, mesh_id: str) -> list[Member]:
        rows = await self.pool.fetch(
            "SELECT mesh_id, pubkey, display_name, joined_at, revoked_at FROM mesh.member"
            " WHERE mesh_id = $1 ORDER BY joined_at, pubkey", mesh_id)
        return [Member(*r) for r in rows]

    async def revoke_member(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        done = await self.pool.execute(
            "UPDATE mesh.member SET revoked_at = $1 WHERE mesh_id = $2 AND pubkey = $3"
            " AND revoked_at IS NULL", now_ms, mesh_id, pubkey)
        return bool(done.endswith(" 1"))

    # -- destinations --------------------------------------------------------------------

    async def create_topic(self, mesh_id: str, name: str, by: str | None, now_ms: int) -> None:
        await self.pool.execute("INSERT INTO mesh.topic (mesh_id, name, created_by, created_at)"
                                " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                                mesh_id, name, by, now_ms)

    async def subscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        try:
            await self.pool.execute(
                "INSERT INTO mesh.topic_subscription (mesh_id, topic, member_pubkey,"
                " subscribed_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                mesh_id, topic, pubkey, now_ms)
        except asyncpg.ForeignKeyViolationError as exc:
            raise UnknownDestination(f"no topic {topic!r} in this mesh", field="name") from exc

    async def unsubscribe(self, mesh_id: str, topic: str, pubkey: str) -> None:
        await self.pool.execute("DELETE FROM mesh.topic_subscription WHERE mesh_id = $1"
                                " AND topic = $2 AND member_pubkey = $3", mesh_id, topic, pubkey)

    async def add_queue_consumer(self, mesh_id: str, queue: str, pubkey: str,
                                 now_ms: int) -> None:
        await self.pool.execute(
            "INSERT INTO mesh.queue_consumer (mesh_id, queue, member_pubkey, registered_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING", mesh_id, queue, pubkey, now_ms)

    async def remove_queue_consumer(self, mesh_id: str, queue: str, pubkey: str) -> None:
        await self.pool.execute("DELETE FROM mesh.queue_consumer WHERE mesh_id = $1"
                                " AND queue = $2 AND member_pubkey = $3", mesh_id, queue, pubkey)

    # -- receive path --------------------------------------------------------------------

    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor:
        r = await self.pool.fetchrow(
            "SELECT epoch, last_seq, acked_seq, compacted_seq FROM mesh.recipient_cursor"
            " WHERE mesh_id = $1 AND recipient_pubkey = $2", mesh_id, pubkey)
        return Cursor(*r) if r else Cursor(1, 0, 0, 0)

    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]:
        rows = await self.pool.fetch(DELIVERIES_SQL, mesh_id, pubkey, epoch, after_seq, limit)
        return [DeliveryRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bytes(r[8]), r[9],
                            r[10], json.loads(r[11]) if r[11] is not None else None, r[12],
                            r[13], bool(r[14])) for r in rows]

    async def reassign_lapsed(self, lease_before: int, now_ms: int,
                              limit: int = 500) -> list[Reassigned]:
        """Give each lapsed queue delivery to another live consumer. One delivery per
        transaction, so this never holds two recipient cursors at once and cannot deadlock
        with accept batches (which lock cursors in sorted order)."""
        moved = []
        for mesh_id, old, epoch, seq, bmid, queue in await self.pool.fetch(
                LAPSED_SQL, lease_before, limit):
            async with self.pool.acquire() as conn, conn.transaction():
                still = await conn.fetchval(
                    "SELECT 1 FROM mesh.delivery_queue WHERE mesh_id = $1"
                    " AND recipient_pubkey = $2 AND epoch = $3 AND seq = $4"
                    " AND acked_at IS NULL AND reassigned_at IS NULL FOR UPDATE SKIP LOCKED",
                    mesh_id, old, epoch, seq)
                others = [r[0] for r in await conn.fetch(
                    "SELECT c.member_pubkey FROM mesh.queue_consumer c JOIN mesh.member m"
                    " ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey"
                    " AND m.revoked_at IS NULL WHERE c.mesh_id = $1 AND c.queue = $2"
                    " AND c.member_pubkey != $3", mesh_id, queue, old)]
                if not still or not others:
                    continue  # acked meanwhile, or the only consumer keeps it
                new = pick_queue_consumer(others, bmid)
                await conn.execute(
                    "UPDATE mesh.delivery_queue SET reassigned_at = $1 WHERE mesh_id = $2"
                    " AND recipient_pubkey = $3 AND epoch = $4 AND seq = $5",
                    now_ms, mesh_id, old, epoch, seq)
                new_epoch, new_seq = await conn.fetchrow(
                    "INSERT INTO mesh.recipient_cursor (mesh_id, recipient_pubkey, last_seq,"
                    " updated_at) VALUES ($1, $2, 1, $3) ON CONFLICT (mesh_id, recipient_pubkey)"
                    " DO UPDATE SET last_seq = mesh.recipient_cursor.last_seq + 1,"
                    " updated_at = excluded.updated_at RETURNING epoch, last_seq",
                    mesh_id, new, now_ms)
                await conn.execute(
                    "INSERT INTO mesh.delivery_queue (mesh_id, recipient_pubkey, epoch, seq,"
                    " broker_message_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
                    mesh_id, new, new_epoch, new_seq, bmid, now_ms)
                moved.append(Reassigned(mesh_id, bmid, old, new))
        return moved

    async def ack(self, mesh_id: str, pubkey: str, epoch: int, seq: int, now_ms: int) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            done = await conn.execute(
                "UPDATE mesh.delivery_queue SET acked_at = $1 WHERE mesh_id = $2"
                " AND recipient_pubkey = $3 AND epoch = $4 AND seq <= $5 AND acked_at IS NULL",
                now_ms, mesh_id, pubkey, epoch, seq)
            await conn.execute(
                "UPDATE mesh.recipient_cursor SET acked_seq = GREATEST(acked_seq,"
                " LEAST($1, last_seq)), updated_at = $2 WHERE mesh_id = $3"
                " AND recipient_pubkey = $4 AND epoch = $5", seq, now_ms, mesh_id, pubkey, epoch)
            return int(done.rsplit(" ", 1)[1])

    # -- retention -----------------------------------------------------------------------

    async def delete_expired_dedupe(self, now_ms: int) -> int:
        done = await self.pool.execute("DELETE FROM mesh.client_message_dedupe"
                                       " WHERE expires_at IS NOT NULL AND expires_at < $1", now_ms)
        return int(done.rsplit(" ", 1)[1])

    async def prune_messages(self, created_before: int, stall_before: int) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            ids: list[str] = []
            for table in ("topic_message", "message_queue"):
                ids += [r[0] for r in await conn.fetch(
                    PRUNABLE_SQL.format(table=table), created_before, stall_before)]
            if not ids:
                return 0
            await conn.execute(
                "UPDATE mesh.recipient_cursor c SET compacted_seq = GREATEST(c.compacted_seq,"
                " x.top) FROM (SELECT mesh_id, recipient_pubkey, epoch, MAX(seq) AS top"
                " FROM mesh.delivery_queue WHERE broker_message_id = ANY($1)"
                " GROUP BY 1, 2, 3) x WHERE c.mesh_id = x.mesh_id"
                " AND c.recipient_pubkey = x.recipient_pubkey AND c.epoch = x.epoch", ids)
            for table, col in (("delivery_queue", "broker_message_id"),
                               ("message_history", "broker_message_id"),
                               ("topic_message", "id"), ("message_queue", "id")):
                await conn.execute(
                    f"DELETE FROM mesh.{table} WHERE {col} = ANY($1)", ids)  # noqa: S608
            await conn.execute("UPDATE mesh.client_message_dedupe SET history_available = FALSE"
                               " WHERE broker_message_id = ANY($1)", ids)
            return len(ids)

    async def set_info(self, key: str, value: str, now_ms: int) -> None:
        await self.pool.execute(
            "INSERT INTO mesh.broker_info (key, value, updated_at) VALUES ($1, $2, $3)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at", key, value, now_ms)

    async def get_info(self, key: str) -> str | None:
        value = await self.pool.fetchval("SELECT value FROM mesh.broker_info WHERE key = $1", key)
        return None if value is None else str(value)

    async def counts(self) -> dict[str, int]:
        out = {}
        for t in TABLES:
            out[t] = int(await self.pool.fetchval(f"SELECT count(*) FROM mesh.{t}"))  # noqa: S608
        return out


INVITE_STATE_SQL = ("SELECT uses, max_uses, expires_at, revoked_at FROM mesh.invite"
                    " WHERE mesh_id = $1 AND token_sha256 = $2")


async def _member(conn: Any, mesh_id: str, pubkey: str) -> Member | None:
    r = await conn.fetchrow("SELECT mesh_id, pubkey, display_name, joined_at, revoked_at"
                            " FROM mesh.member WHERE mesh_id = $1 AND pubkey = $2",
                            mesh_id, pubkey)
    return Member(*r) if r else None


PRUNABLE_SQL = """
SELECT id FROM mesh.{table} m WHERE m.created_at < $1
AND NOT EXISTS (SELECT 1 FROM mesh.delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= $2)
"""

DELIVERIES_SQL = """
SELECT d.epoch, d.seq, d.broker_message_id, h.history_id,
       COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), d.created_at, d.reassigned_at IS NOT NULL
FROM mesh.delivery_queue d
LEFT JOIN mesh.topic_message t ON t.id = d.broker_message_id
LEFT JOIN mesh.message_queue q ON q.id = d.broker_message_id
LEFT JOIN mesh.message_history h ON h.broker_message_id = d.broker_message_id
WHERE d.mesh_id = $1 AND d.recipient_pubkey = $2 AND d.epoch = $3 AND d.seq > $4
  AND (t.id IS NOT NULL OR q.id IS NOT NULL)
ORDER BY d.seq LIMIT $5
"""

CLAIM_SQL = """
INSERT INTO mesh.client_message_dedupe (mesh_id, sender_pubkey, client_message_id,
    broker_message_id, history_id, request_fingerprint, destination_kind, destination_ref,
    first_seen_at, expires_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[],
                     $7::text[], $8::text[], $9::bigint[], $10::bigint[])
ON CONFLICT (mesh_id, sender_pubkey, client_message_id) DO NOTHING
"""

READBACK_SQL = """
SELECT d.mesh_id, d.sender_pubkey, d.client_message_id, d.broker_message_id, d.history_id,
       d.request_fingerprint, d.history_available, d.first_seen_at
FROM mesh.client_message_dedupe d
JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(m, s, c)
  ON d.mesh_id = k.m AND d.sender_pubkey = k.s AND d.client_message_id = k.c
FOR SHARE OF d
"""

UNCLAIM_SQL = """
DELETE FROM mesh.client_message_dedupe WHERE broker_message_id = ANY($1::text[])
"""

# One round trip for every destination check of the batch, tagged by kind.
B2_SQL = """
SELECT 'topic', k.m, k.n, s.member_pubkey
FROM unnest($1::text[], $2::text[]) AS k(m, n)
JOIN mesh.topic t ON t.mesh_id = k.m AND t.name = k.n
LEFT JOIN (mesh.topic_subscription s JOIN mesh.member mb ON mb.mesh_id = s.mesh_id
           AND mb.pubkey = s.member_pubkey AND mb.revoked_at IS NULL)
  ON s.mesh_id = t.mesh_id AND s.topic = t.name
UNION ALL
SELECT 'dm', k.m, k.p, k.p FROM unnest($3::text[], $4::text[]) AS k(m, p)
JOIN mesh.member mb ON mb.mesh_id = k.m AND mb.pubkey = k.p AND mb.revoked_at IS NULL
UNION ALL
SELECT 'queue', c.mesh_id, c.queue, c.member_pubkey FROM unnest($5::text[], $6::text[]) AS k(m, q)
JOIN mesh.queue_consumer c ON c.mesh_id = k.m AND c.queue = k.q
JOIN mesh.member mb ON mb.mesh_id = c.mesh_id AND mb.pubkey = c.member_pubkey
  AND mb.revoked_at IS NULL
"""

# Messages and their history rows in one statement.
MESSAGES_SQL = """
WITH tm AS (
  INSERT INTO mesh.topic_message (id, mesh_id, sender_pubkey, client_message_id, topic, body,
      body_encoding, priority, meta, reply_to, created_at)
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                       $6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[],
                       $11::bigint[])
), mq AS (
  INSERT INTO mesh.message_queue (id, mesh_id, sender_pubkey, client_message_id,
      destination_kind, destination_ref, body, body_encoding, priority, meta, reply_to,
      created_at)
  SELECT * FROM unnest($12::text[], $13::text[], $14::text[], $15::text[], $16::text[],
                       $17::text[], $18::bytea[], $19::text[], $20::text[], $21::text[],
                       $22::text[], $23::bigint[])
)
INSERT INTO mesh.message_history (history_id, broker_message_id, mesh_id, sender_pubkey,
    destination_kind, destination_ref, created_at)
SELECT * FROM unnest($24::text[], $25::text[], $26::text[], $27::text[], $28::text[],
                     $29::text[], $30::bigint[])
"""

# Bump each recipient's cursor by its number of new deliveries (rows locked in
# (mesh, pubkey) order, so concurrent batches cannot deadlock), then number the batch's
# deliveries for that recipient in batch order just below the new last_seq: gapless.
DELIVERIES_INSERT_SQL = """
WITH c AS (
  INSERT INTO mesh.recipient_cursor (mesh_id, recipient_pubkey, last_seq, updated_at)
  SELECT m, p, count(*), $5::bigint FROM unnest($1::text[], $2::text[]) AS u(m, p)
  GROUP BY m, p ORDER BY m, p
  ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE
    SET last_seq = mesh.recipient_cursor.last_seq + EXCLUDED.last_seq,
        updated_at = EXCLUDED.updated_at
  RETURNING mesh_id, recipient_pubkey, epoch, last_seq
), x AS (
  SELECT m, p, bm, at, count(*) OVER (PARTITION BY m, p) AS n,
         row_number() OVER (PARTITION BY m, p ORDER BY ord) AS rn
  FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
       WITH ORDINALITY AS u(m, p, bm, at, ord)
)
INSERT INTO mesh.delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,
    created_at)
SELECT x.m, x.p, c.epoch, c.last_seq - x.n + x.rn, x.bm, x.at
FROM x JOIN c ON c.mesh_id = x.m AND c.recipient_pubkey = x.p
RETURNING broker_message_id, recipient_pubkey, epoch, seq
"""


def _col(items: list[AcceptInput], attr: str) -> list[Any]:
    return [getattr(a, attr) for a in items]


async def _accept_alone(conn: Any, a: AcceptInput) -> AcceptResult:
    try:
        async with conn.transaction():
            return (await _accept_many(conn, [a]))[0]
    except asyncpg.PostgresError as exc:
        log.error("broker_accept_failed", error=str(exc), client_message_id=a.client_message_id)
        return failed(a, Unavailable(f"the broker store rejected this send: {exc}"))


async def _accept_many(conn: Any, items: list[AcceptInput]) -> list[AcceptResult]:
    """Spec §4.7.2 for a batch of distinct keys, in the caller's transaction."""
    # Claims are made in key order, so that brokers sharing the database cannot deadlock on
    # them; everything after keeps arrival order, which is the order recipients see.
    keyed = sorted(items, key=lambda a: a.key)
    await conn.execute(CLAIM_SQL, *(_col(keyed, attr) for attr in (
        "mesh_id", "sender_pubkey", "client_message_id", "broker_message_id", "history_id",
        "fingerprint", "kind", "ref", "now_ms", "expires_at")))
    meshes, senders, cmids = _col(items, "mesh_id"), _col(items, "sender_pubkey"), _col(
        items, "client_message_id")
    rows = {(r[0], r[1], r[2]): DedupeRow(r[3], r[4], bytes(r[5]), r[6], r[7])
            for r in await conn.fetch(READBACK_SQL, meshes, senders, cmids)}
    results: dict[int, AcceptResult] = {}
    claimed: list[int] = []
    for i, a in enumerate(items):
        row = rows[a.key]
        if branch(a, row) is Branch.CREATED:
            claimed.append(i)
        else:
            results[i] = answer_existing(a, row)
    recipients, errors = await _b2(conn, [items[i] for i in claimed])
    if errors:
        await conn.execute(UNCLAIM_SQL, [items[claimed[j]].broker_message_id for j in errors])
        for j, err in errors.items():
            results[claimed[j]] = failed(items[claimed[j]], err)
    accepted = [(i, recipients[j]) for j, i in enumerate(claimed) if j not in errors]
    for i, deliveries in await _insert_accepted(conn, [(items[i], r) for i, r in accepted]):
        results[accepted[i][0]] = created(items[accepted[i][0]], deliveries)
    return [results[i] for i in range(len(items))]


async def _b2(conn: Any, items: list[AcceptInput]
              ) -> tuple[list[list[str]], dict[int, TidemeshError]]:
    """Destination checks for claimed sends: their recipients, or the B2 error by index."""
    found = await _lookup(conn, items)
    recipients: list[list[str]] = []
    errors: dict[int, TidemeshError] = {}
    for j, a in enumerate(items):
        members = found.get((a.kind, a.mesh_id, a.ref))
        if not members and a.kind == "queue":
            members = None  # a queue exists only while it has a consumer
        if members is None:
            errors[j] = UnknownDestination(
                {"topic": f"no topic {a.ref!r} in this mesh", "dm": "no such member in this mesh",
                 "queue": f"no queue {a.ref!r} (it has no consumer)"}[a.kind], field="to.ref")
            recipients.append([])
            continue
        recipients.append(recipients_for(a.kind, a.ref, a.sender_pubkey, members, members,
                                         a.broker_message_id))
    return recipients, errors


async def _lookup(conn: Any, items: list[AcceptInput]) -> dict[tuple[str, str, str], list[str]]:
    """(kind, mesh, ref) → member pubkeys; a key is present iff the destination exists."""
    if not items:
        return {}
    args: list[list[str]] = []
    for kind in ("topic", "dm", "queue"):
        keys = sorted({(a.mesh_id, a.ref) for a in items if a.kind == kind})
        args += [[k[0] for k in keys], [k[1] for k in keys]]
    out: dict[tuple[str, str, str], list[str]] = {}
    for kind, mesh_id, ref, pubkey in await conn.fetch(B2_SQL, *args):
        members = out.setdefault((kind, mesh_id, ref), [])
        if pubkey is not None:  # a topic without subscribers still exists
            members.append(pubkey)
    return out


def _message_args(items: list[AcceptInput]) -> list[list[Any]]:
    metas = {a.broker_message_id: json.dumps(a.meta, separators=(",", ":")) if a.meta else None
             for a in items}
    t = [a for a in items if a.kind == "topic"]
    q = [a for a in items if a.kind != "topic"]
    return [
        _col(t, "broker_message_id"), _col(t, "mesh_id"), _col(t, "sender_pubkey"),
        _col(t, "client_message_id"), _col(t, "ref"), _col(t, "body"), _col(t, "body_encoding"),
        _col(t, "priority"), [metas[a.broker_message_id] for a in t], _col(t, "reply_to"),
        _col(t, "now_ms"),
        _col(q, "broker_message_id"), _col(q, "mesh_id"), _col(q, "sender_pubkey"),
        _col(q, "client_message_id"), _col(q, "kind"), _col(q, "ref"), _col(q, "body"),
        _col(q, "body_encoding"), _col(q, "priority"), [metas[a.broker_message_id] for a in q],
        _col(q, "reply_to"), _col(q, "now_ms"),
        _col(items, "history_id"), _col(items, "broker_message_id"), _col(items, "mesh_id"),
        _col(items, "sender_pubkey"), _col(items, "kind"), _col(items, "ref"),
        _col(items, "now_ms"),
    ]


async def _insert_accepted(conn: Any, accepted: list[tuple[AcceptInput, list[str]]]
                           ) -> list[tuple[int, list[Delivery]]]:
    """Message, history, cursor and delivery rows for the accepted sends, in batch order."""
    if not accepted:
        return []
    items = [a for a, _ in accepted]
    await conn.execute(MESSAGES_SQL, *_message_args(items))
    rows = [(a, p) for a, recips in accepted for p in recips]
    by_message: dict[str, list[Delivery]] = {}
    if rows:
        now = max(a.now_ms for a in items)
        for bm, pubkey, epoch, seq in await conn.fetch(
            DELIVERIES_INSERT_SQL, [a.mesh_id for a, _ in rows], [p for _, p in rows],
            [a.broker_message_id for a, _ in rows], [a.now_ms for a, _ in rows], now,
        ):
            by_message.setdefault(bm, []).append(Delivery(pubkey, epoch, seq))
    return [(i, sorted(by_message.get(a.broker_message_id, []), key=lambda d: d.recipient_pubkey))
            for i, a in enumerate(items)]


LAPSED_SQL = """
SELECT d.mesh_id, d.recipient_pubkey, d.epoch, d.seq, d.broker_message_id, q.destination_ref
FROM mesh.delivery_queue d JOIN mesh.message_queue q ON q.id = d.broker_message_id
WHERE q.destination_kind = 'queue' AND d.acked_at IS NULL AND d.reassigned_at IS NULL
  AND d.created_at < $1 ORDER BY d.created_at LIMIT $2
"""
