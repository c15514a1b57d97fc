"""The receive path (SQLite): cursors, delivery pages, acks, and lapsed queue leases."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from tidemesh.broker.accept import pick_queue_consumer
from tidemesh.broker.store.base import Cursor, DeliveryRow, Reassigned, latest_acks
from tidemesh.broker.store.sqlite.base import SqliteBase
from tidemesh.broker.store.sqlite.topiclog import hand_out_on
from tidemesh.storage.engine import BatchOp

Ack = tuple[str, str, int, int, int]   # mesh, member, epoch, seq, now_ms
Key = tuple[str, str]


class Delivery(SqliteBase):
    _ack_op: BatchOp[Ack, int]
    _hand_out_op: BatchOp[tuple[Key, int], bool]

    def _init_delivery(self) -> None:
        # Pumps and acks of many members share the writer's transactions (issue #30).
        self._ack_op = BatchOp("ack", _ack_batch)
        self._hand_out_op = BatchOp("hand_out", _hand_out_batch)

    async def hand_out(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        return await self._submit(self._hand_out_op, ((mesh_id, pubkey), now_ms))

    async def hand_out_page(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                            limit: int, now_ms: int, logged: bool = False
                            ) -> tuple[bool, list[DeliveryRow]]:
        more = await self.hand_out(mesh_id, pubkey, now_ms)
        return more, await self.deliveries_after(mesh_id, pubkey, epoch, after_seq, limit)

    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor:
        def fn(conn: sqlite3.Connection) -> Cursor:
            row = conn.execute(
                "SELECT epoch, last_seq, acked_seq, compacted_seq FROM recipient_cursor"
                " WHERE mesh_id = ? AND recipient_pubkey = ?", (mesh_id, pubkey)).fetchone()
            return Cursor(*row) if row else Cursor(1, 0, 0, 0)

        return await self._read(fn)

    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]:
        def fn(conn: sqlite3.Connection) -> list[DeliveryRow]:
            rows = conn.execute(DELIVERIES_SQL, (mesh_id, pubkey, epoch, after_seq, limit))
            return [DeliveryRow.of_record(r) for r in rows.fetchall()]

        return await self._read(fn)

    async def reassign_lapsed(self, lease_before: int, now_ms: int,
                              limit: int = 500) -> list[Reassigned]:
        return await self._write(lambda c: _reassign(c, lease_before, now_ms, limit))

    async def ack(self, mesh_id: str, pubkey: str, epoch: int, seq: int, now_ms: int) -> int:
        return await self._submit(self._ack_op, (mesh_id, pubkey, epoch, seq, now_ms))


def _hand_out_batch(conn: sqlite3.Connection, args: Sequence[tuple[Key, int]]) -> list[bool]:
    more = hand_out_on(conn, [k for k, _ in args], max(t for _, t in args)).more
    return [k in more for k, _ in args]


def _ack_batch(conn: sqlite3.Connection, acks: Sequence[Ack]) -> list[int]:
    """A cumulative ack moves the cursor and stamps the DM and queue rows it covers (queue
    leases and pruning read acked_at); topic spans are never touched."""
    now = max(a[4] for a in acks)
    moved = {}
    for (mesh_id, pubkey, epoch), seq in latest_acks(acks).items():
        row = conn.execute("SELECT acked_seq, MIN(?, last_seq) FROM recipient_cursor"
                           " WHERE mesh_id = ? AND recipient_pubkey = ? AND epoch = ?",
                           (seq, mesh_id, pubkey, epoch)).fetchone()
        if row is None or row[1] is None or row[1] <= row[0]:
            continue
        conn.execute(ACK_SQL, (now, mesh_id, pubkey, epoch, row[1], row[0]))
        conn.execute("UPDATE recipient_cursor SET acked_seq = ?, updated_at = ?"
                     " WHERE mesh_id = ? AND recipient_pubkey = ?",
                     (row[1], now, mesh_id, pubkey))
        moved[(mesh_id, pubkey, epoch, seq)] = row[1] - row[0]
    return [moved.pop((m, p, e, s), 0) for m, p, e, s, _ in acks]


ACK_SQL = """
UPDATE delivery_queue SET acked_at = ?1
WHERE mesh_id = ?2 AND recipient_pubkey = ?3 AND epoch = ?4 AND seq <= ?5 AND seq > ?6
  AND acked_at IS NULL
"""

# A recipient's rows (DMs, queue messages, and topic messages from before the topic log)
# and its topic spans, expanded to their positions (seq = seq_first + pos - pos_first), in
# one seq order. Only the spans and positions the page can reach are read.
DELIVERIES_SQL = """
WITH d AS (
  SELECT * FROM (
    SELECT d.epoch, d.seq, d.broker_message_id AS bm, d.created_at, d.reassigned_at
    FROM delivery_queue d
    WHERE d.mesh_id = ?1 AND d.recipient_pubkey = ?2 AND d.epoch = ?3 AND d.seq > ?4
    ORDER BY d.seq LIMIT ?5)
  UNION ALL
  SELECT r.epoch, r.seq_first + (e.log_pos - r.pos_first), e.id, e.created_at, NULL
  FROM (SELECT * FROM topic_delivery r
        WHERE r.mesh_id = ?1 AND r.recipient_pubkey = ?2 AND r.epoch = ?3 AND r.seq_last > ?4
        ORDER BY r.seq_last LIMIT ?5) r
  JOIN topic_message e ON e.mesh_id = r.mesh_id AND e.topic = r.topic
    AND e.log_pos >= r.pos_first + MAX(0, ?4 + 1 - r.seq_first)
    AND e.log_pos <= r.pos_first + (MIN(r.seq_last, ?4 + ?5) - r.seq_first)
)
SELECT d.epoch, d.seq, d.bm, h.history_id,
       COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), d.created_at, d.reassigned_at IS NOT NULL,
       m.display_name, COALESCE(t.traceparent, q.traceparent)
FROM d
LEFT JOIN topic_message t ON t.id = d.bm
LEFT JOIN message_queue q ON q.id = d.bm
LEFT JOIN message_history h ON h.broker_message_id = d.bm
LEFT JOIN member m ON m.mesh_id = ?1
  AND m.pubkey = COALESCE(t.sender_pubkey, q.sender_pubkey)
WHERE t.id IS NOT NULL OR q.id IS NOT NULL
ORDER BY d.seq LIMIT ?5
"""


# Only deliveries another live consumer could take: the ones the only consumer keeps would
# otherwise fill the page, oldest first, and keep every later lapsed lease from moving.
LAPSED_SQL = """
SELECT d.mesh_id, d.recipient_pubkey, d.epoch, d.seq, d.broker_message_id, q.destination_ref
FROM delivery_queue d JOIN message_queue q ON q.id = d.broker_message_id
WHERE q.destination_kind = 'queue' AND d.acked_at IS NULL AND d.reassigned_at IS NULL
  AND d.created_at < ?
  AND EXISTS (SELECT 1 FROM queue_consumer c JOIN member m
              ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL
              WHERE c.mesh_id = d.mesh_id AND c.queue = q.destination_ref
                AND c.member_pubkey != d.recipient_pubkey)
ORDER BY d.created_at LIMIT ?
"""


def _reassign(conn: sqlite3.Connection, lease_before: int, now_ms: int,
              limit: int) -> list[Reassigned]:
    """Give each lapsed queue delivery to another live consumer, in one transaction: the old
    row is marked (it stays in its recipient's gapless stream), the new one appended."""
    moved = []
    for mesh_id, old, epoch, seq, bmid, queue in conn.execute(LAPSED_SQL,
                                                              (lease_before, limit)).fetchall():
        others = [r[0] for r in conn.execute(
            "SELECT c.member_pubkey FROM queue_consumer c JOIN member m"
            " ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL"
            " WHERE c.mesh_id = ? AND c.queue = ? AND c.member_pubkey != ?", (mesh_id, queue, old))]
        if not others:
            continue  # the only consumer keeps it; it gets it when it comes back
        new = pick_queue_consumer(others, bmid)
        conn.execute("UPDATE delivery_queue SET reassigned_at = ? WHERE mesh_id = ?"
                     " AND recipient_pubkey = ? AND epoch = ? AND seq = ?",
                     (now_ms, mesh_id, old, epoch, seq))
        new_epoch, new_seq = conn.execute(
            "INSERT INTO recipient_cursor (mesh_id, recipient_pubkey, last_seq, updated_at)"
            " VALUES (?, ?, 1, ?) ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE"
            " SET last_seq = last_seq + 1, updated_at = excluded.updated_at"
            " RETURNING epoch, last_seq", (mesh_id, new, now_ms)).fetchone()
        conn.execute("INSERT INTO delivery_queue (mesh_id, recipient_pubkey, epoch, seq,"
                     " broker_message_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                     (mesh_id, new, new_epoch, new_seq, bmid, now_ms))
        moved.append(Reassigned(mesh_id, bmid, old, new))
    return moved
