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


PRUNABLE_SQL = """
SELECT id FROM {table} m WHERE m.created_at < ?
AND NOT EXISTS (SELECT 1 FROM delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= ?)
"""


def _prune(conn: sqlite3.Connection, created_before: int, stall_before: int) -> int:
    """Delete old messages with their history and deliveries; flip their dedupe rows."""
    ids: list[str] = []
    for table in ("topic_message", "message_queue"):
        ids += [r[0] for r in conn.execute(PRUNABLE_SQL.format(table=table),
                                           (created_before, stall_before))]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (id TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM prune_ids")
    conn.executemany("INSERT INTO prune_ids (id) VALUES (?)", [(i,) for i in ids])
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
