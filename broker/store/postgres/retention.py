"""Retention (PostgreSQL): expired dedupe rows, and old messages with their history and
deliveries."""

from __future__ import annotations

from tidemesh.broker.store.postgres.base import PostgresBase


class Retention(PostgresBase):
    # On a connection without the command timeout (``Database.unbounded``): a first sweep
    # over a long backlog may rightly take minutes, and bounded it would never get done.

    async def delete_expired_dedupe(self, now_ms: int) -> int:
        async with self.db.unbounded() as conn:
            done = await conn.execute("DELETE FROM mesh.client_message_dedupe"
                                      " WHERE expires_at IS NOT NULL AND expires_at < $1",
                                      now_ms)
        return int(done.rsplit(" ", 1)[1])

    async def prune_messages(self, created_before: int, stall_before: int) -> int:
        async with self.db.unbounded() as conn, conn.transaction():
            ids: list[str] = []
            for sql in (LOG_PRUNABLE_SQL,
                        PRUNABLE_SQL.format(table="topic_message", only="m.log_pos IS NULL"),
                        PRUNABLE_SQL.format(table="message_queue", only="TRUE")):
                ids += [r[0] for r in await conn.fetch(sql, created_before, stall_before)]
            if not ids:
                return 0
            await conn.execute(SPANS_COMPACTED_SQL, ids)
            await conn.execute(SPANS_DROPPED_SQL, ids)
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


# Messages from before the topic log, DMs and queue messages: by their delivery rows.
PRUNABLE_SQL = """
SELECT id FROM mesh.{table} m WHERE m.created_at < $1 AND {only}
AND NOT EXISTS (SELECT 1 FROM mesh.delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= $2)
"""

# A topic log entry: old, and past every subscriber's cursor (handed out, and acked where
# handed out) or past the stall window; the same rule as a delivery row's.
LOG_PRUNABLE_SQL = """
SELECT t.id FROM mesh.topic_message t
WHERE t.created_at < $1 AND t.log_pos IS NOT NULL
AND (t.created_at < $2 OR (
  NOT EXISTS (SELECT 1 FROM mesh.topic_subscription s WHERE s.mesh_id = t.mesh_id
              AND s.topic = t.topic AND s.log_pos < t.log_pos
              AND s.member_pubkey <> t.sender_pubkey)
  AND NOT EXISTS (SELECT 1 FROM mesh.topic_delivery r JOIN mesh.recipient_cursor c
                  ON c.mesh_id = r.mesh_id AND c.recipient_pubkey = r.recipient_pubkey
                  AND c.epoch = r.epoch
                  WHERE r.mesh_id = t.mesh_id AND r.topic = t.topic
                    AND r.pos_first <= t.log_pos
                    AND r.pos_first + (r.seq_last - r.seq_first) >= t.log_pos
                    AND c.acked_seq < r.seq_first + (t.log_pos - r.pos_first))))
"""

# Each recipient's compacted_seq moves to the last seq its spans gave a pruned entry.
SPANS_COMPACTED_SQL = """
UPDATE mesh.recipient_cursor c SET compacted_seq = GREATEST(c.compacted_seq, x.top)
FROM (SELECT r.mesh_id, r.recipient_pubkey, r.epoch,
             MAX(r.seq_first + (t.log_pos - r.pos_first)) AS top
      FROM mesh.topic_message t JOIN mesh.topic_delivery r ON r.mesh_id = t.mesh_id
        AND r.topic = t.topic AND r.pos_first <= t.log_pos
        AND r.pos_first + (r.seq_last - r.seq_first) >= t.log_pos
      WHERE t.id = ANY($1) GROUP BY 1, 2, 3) x
WHERE c.mesh_id = x.mesh_id AND c.recipient_pubkey = x.recipient_pubkey AND c.epoch = x.epoch
"""

# A span wholly compacted leads nowhere any more.
SPANS_DROPPED_SQL = """
DELETE FROM mesh.topic_delivery r USING mesh.recipient_cursor c
WHERE c.mesh_id = r.mesh_id AND c.recipient_pubkey = r.recipient_pubkey AND c.epoch = r.epoch
  AND r.seq_last <= c.compacted_seq
  AND (r.mesh_id, r.topic) IN (SELECT mesh_id, topic FROM mesh.topic_message
                               WHERE id = ANY($1))
"""
