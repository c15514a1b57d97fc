"""The receive path (PostgreSQL): cursors, delivery pages, acks, and lapsed queue leases."""

from __future__ import annotations

from tidemesh.broker.accept import pick_queue_consumer
from tidemesh.broker.store.base import Cursor, DeliveryRow, Reassigned
from tidemesh.broker.store.postgres.base import PostgresBase


class Delivery(PostgresBase):
    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor:
        r = await self.pool.fetchrow(
            "SELECT epoch, last_seq, acked_seq, compacted_seq FROM mesh.recipient_cursor"
            " WHERE mesh_id = $1 AND recipient_pubkey = $2", mesh_id, pubkey)
        return Cursor(*r) if r else Cursor(1, 0, 0, 0)

    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]:
        rows = await self.pool.fetch(DELIVERIES_SQL, mesh_id, pubkey, epoch, after_seq, limit)
        return [DeliveryRow.of_record(r) for r in rows]

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
            done = await conn.execute(ACK_SQL, now_ms, mesh_id, pubkey, epoch, seq)
            await conn.execute(
                "UPDATE mesh.recipient_cursor SET acked_seq = GREATEST(acked_seq,"
                " LEAST($1, last_seq)), updated_at = $2 WHERE mesh_id = $3"
                " AND recipient_pubkey = $4 AND epoch = $5", seq, now_ms, mesh_id, pubkey, epoch)
            return int(done.rsplit(" ", 1)[1])


# Every row at or below the cursor's acked_seq was acked by the ack that moved it (in the
# same transaction): the range starts above it, so an ack reads the rows it acks, not the
# recipient's whole kept history (which made each ack cost O(history) rows).
ACK_SQL = """
UPDATE mesh.delivery_queue SET acked_at = $1
WHERE mesh_id = $2 AND recipient_pubkey = $3 AND epoch = $4 AND seq <= $5
  AND seq > (SELECT COALESCE(max(acked_seq), 0) FROM mesh.recipient_cursor
             WHERE mesh_id = $2 AND recipient_pubkey = $3 AND epoch = $4)
  AND acked_at IS NULL
"""

DELIVERIES_SQL = """
SELECT d.epoch, d.seq, d.broker_message_id, h.history_id,
       COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), d.created_at, d.reassigned_at IS NOT NULL,
       m.display_name, COALESCE(t.traceparent, q.traceparent)
FROM mesh.delivery_queue d
LEFT JOIN mesh.topic_message t ON t.id = d.broker_message_id
LEFT JOIN mesh.message_queue q ON q.id = d.broker_message_id
LEFT JOIN mesh.message_history h ON h.broker_message_id = d.broker_message_id
LEFT JOIN mesh.member m ON m.mesh_id = d.mesh_id
  AND m.pubkey = COALESCE(t.sender_pubkey, q.sender_pubkey)
WHERE d.mesh_id = $1 AND d.recipient_pubkey = $2 AND d.epoch = $3 AND d.seq > $4
  AND (t.id IS NOT NULL OR q.id IS NOT NULL)
ORDER BY d.seq LIMIT $5
"""

# Only deliveries another live consumer could take: the ones the only consumer keeps would
# otherwise fill the page, oldest first, and keep every later lapsed lease from moving.
LAPSED_SQL = """
SELECT d.mesh_id, d.recipient_pubkey, d.epoch, d.seq, d.broker_message_id, q.destination_ref
FROM mesh.delivery_queue d JOIN mesh.message_queue q ON q.id = d.broker_message_id
WHERE q.destination_kind = 'queue' AND d.acked_at IS NULL AND d.reassigned_at IS NULL
  AND d.created_at < $1
  AND EXISTS (SELECT 1 FROM mesh.queue_consumer c JOIN mesh.member m
              ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL
              WHERE c.mesh_id = d.mesh_id AND c.queue = q.destination_ref
                AND c.member_pubkey != d.recipient_pubkey)
ORDER BY d.created_at LIMIT $2
"""
