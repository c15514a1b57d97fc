"""Retention (PostgreSQL): expired dedupe rows, and old messages with their history and
deliveries."""

from __future__ import annotations

from tidemesh.broker.store.postgres.base import PostgresBase


class Retention(PostgresBase):
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


PRUNABLE_SQL = """
SELECT id FROM mesh.{table} m WHERE m.created_at < $1
AND NOT EXISTS (SELECT 1 FROM mesh.delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= $2)
"""
