"""Retention (SQLite): expired dedupe rows, and old messages with their history and
deliveries."""

from __future__ import annotations

import sqlite3

from tidemesh.broker.store.sqlite.base import SqliteBase


class Retention(SqliteBase):
    async def delete_expired_dedupe(self, now_ms: int) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM client_message_dedupe WHERE expires_at IS NOT NULL"
                                " AND expires_at < ?", (now_ms,)).rowcount

        return await self._write(fn)

    async def prune_messages(self, created_before: int, stall_before: int) -> int:
        return await self._write(lambda c: _prune(c, created_before, stall_before))


# Messages from before the topic log, DMs and queue messages: by their delivery rows.
PRUNABLE_SQL = """
SELECT id FROM {table} m WHERE m.created_at < ? AND {only}
AND NOT EXISTS (SELECT 1 FROM delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= ?)
"""

# A topic log entry: old, and past every subscriber's cursor (handed out, and acked where
# handed out) or past the stall window; the same rule as a delivery row's.
LOG_PRUNABLE_SQL = """
SELECT t.id FROM topic_message t
WHERE t.created_at < ?1 AND t.log_pos IS NOT NULL
AND (t.created_at < ?2 OR (
  NOT EXISTS (SELECT 1 FROM topic_subscription s WHERE s.mesh_id = t.mesh_id
              AND s.topic = t.topic AND s.log_pos < t.log_pos
              AND s.member_pubkey <> t.sender_pubkey)
  AND NOT EXISTS (SELECT 1 FROM topic_delivery r JOIN recipient_cursor c
                  ON c.mesh_id = r.mesh_id AND c.recipient_pubkey = r.recipient_pubkey
                  AND c.epoch = r.epoch
                  WHERE r.mesh_id = t.mesh_id AND r.topic = t.topic
                    AND r.pos_first <= t.log_pos
                    AND r.pos_first + (r.seq_last - r.seq_first) >= t.log_pos
                    AND c.acked_seq < r.seq_first + (t.log_pos - r.pos_first))))
"""

# Each recipient's compacted_seq moves to the last seq its spans gave a pruned entry.
SPANS_COMPACTED_SQL = """
UPDATE recipient_cursor SET compacted_seq = MAX(compacted_seq, x.top)
FROM (SELECT r.mesh_id, r.recipient_pubkey, r.epoch,
             MAX(r.seq_first + (t.log_pos - r.pos_first)) AS top
      FROM topic_message t JOIN topic_delivery r ON r.mesh_id = t.mesh_id
        AND r.topic = t.topic AND r.pos_first <= t.log_pos
        AND r.pos_first + (r.seq_last - r.seq_first) >= t.log_pos
      WHERE t.id IN prune_ids GROUP BY 1, 2, 3) AS x
WHERE recipient_cursor.mesh_id = x.mesh_id
  AND recipient_cursor.recipient_pubkey = x.recipient_pubkey AND recipient_cursor.epoch = x.epoch
"""

# A span wholly compacted leads nowhere any more.
SPANS_DROPPED_SQL = """
DELETE FROM topic_delivery WHERE EXISTS (
  SELECT 1 FROM recipient_cursor c WHERE c.mesh_id = topic_delivery.mesh_id
    AND c.recipient_pubkey = topic_delivery.recipient_pubkey
    AND c.epoch = topic_delivery.epoch AND topic_delivery.seq_last <= c.compacted_seq)
  AND EXISTS (SELECT 1 FROM topic_message t WHERE t.id IN prune_ids
              AND t.mesh_id = topic_delivery.mesh_id AND t.topic = topic_delivery.topic)
"""


def _prune(conn: sqlite3.Connection, created_before: int, stall_before: int) -> int:
    """Delete old messages with their history and deliveries; flip their dedupe rows."""
    ids: list[str] = []
    for sql in (LOG_PRUNABLE_SQL,
                PRUNABLE_SQL.format(table="topic_message", only="m.log_pos IS NULL"),
                PRUNABLE_SQL.format(table="message_queue", only="1")):
        ids += [r[0] for r in conn.execute(sql, (created_before, stall_before))]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (id TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM prune_ids")
    conn.executemany("INSERT INTO prune_ids (id) VALUES (?)", [(i,) for i in ids])
    conn.execute(SPANS_COMPACTED_SQL)
    conn.execute(SPANS_DROPPED_SQL)
    # From the pruned messages' deliveries to their cursors (PostgreSQL's form): asked the
    # other way, per cursor, it walked each recipient's whole kept history (244 ms a sweep
    # at 1M kept deliveries, on the one writer).
    conn.execute(
        "UPDATE recipient_cursor SET compacted_seq = MAX(compacted_seq, x.top)"
        " FROM (SELECT mesh_id, recipient_pubkey, epoch, MAX(seq) AS top FROM delivery_queue"
        " WHERE broker_message_id IN prune_ids GROUP BY 1, 2, 3) AS x"
        " WHERE recipient_cursor.mesh_id = x.mesh_id"
        " AND recipient_cursor.recipient_pubkey = x.recipient_pubkey"
        " AND recipient_cursor.epoch = x.epoch")
    for table, col in (("delivery_queue", "broker_message_id"),
                       ("message_history", "broker_message_id"),
                       ("topic_message", "id"), ("message_queue", "id")):
        conn.execute(f"DELETE FROM {table} WHERE {col} IN prune_ids")  # noqa: S608
    conn.execute("UPDATE client_message_dedupe SET history_available = 0"
                 " WHERE broker_message_id IN prune_ids")
    conn.execute("DELETE FROM prune_ids")
    return len(ids)
