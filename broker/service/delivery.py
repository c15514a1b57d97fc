"""Getting committed messages to recipients: resume (where a daemon's stream picks up), the
per-connection pump, acks, and moving lapsed queue leases to another consumer.

The pump reads committed delivery rows in seq order, so deliveries are gapless and in order
no matter which connection accepted the message; frames go out only after the store commits.
"""

from __future__ import annotations

import base64
from typing import Any

import structlog

from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.session import ResumeResult, decide_resume
from tidemesh.broker.store.base import DeliveryRow, Store

log = structlog.get_logger(__name__)
PUMP_PAGE = 256


class Deliveries:
    def __init__(self, store: Store, metrics: Metrics, connections: Connections) -> None:
        self.store = store
        self.metrics = metrics
        self.connections = connections

    async def resume(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        cur = await self.store.cursor(conn.mesh_id, conn.pubkey)
        result = decide_resume(frame["epoch"], frame["last_seq"], cur.epoch, cur.last_seq,
                               cur.compacted_seq)
        answer = {"type": "resume_ack", "id": frame["id"], "result": result.value,
                  "epoch": cur.epoch, "broker_last_seq": cur.last_seq,
                  "compacted_seq": cur.compacted_seq}
        if result is ResumeResult.OK:
            last = frame["last_seq"] if frame["epoch"] else 0
            answer["last_seq"] = last
            if last:  # what the daemon stored is acked by the resume itself
                await self.store.ack(conn.mesh_id, conn.pubkey, cur.epoch, last, now_ms())
            conn.epoch, conn.sent_seq, conn.pumping = cur.epoch, last, True
            conn.wake.set()
        else:
            log.warning("broker_resume_refused", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                        result=result.value, epoch=frame["epoch"], last_seq=frame["last_seq"])
        return answer

    async def ack(self, conn: Conn, frame: dict[str, Any]) -> None:
        await self.store.ack(conn.mesh_id, conn.pubkey, frame["epoch"], frame["seq"], now_ms())

    async def pump(self, conn: Conn) -> None:
        """Send committed deliveries after ``conn.sent_seq``, in order, whenever woken."""
        while True:
            await conn.wake.wait()
            conn.wake.clear()
            if not conn.pumping:
                continue
            while True:
                rows = await self.store.deliveries_after(conn.mesh_id, conn.pubkey, conn.epoch,
                                                         conn.sent_seq, PUMP_PAGE)
                for row in rows:
                    await conn.peer.send_frame(deliver_frame(row))
                    conn.sent_seq = row.seq
                    self.metrics.delivered.inc()
                if len(rows) < PUMP_PAGE:
                    break

    async def reassign_lapsed(self, lease_s: float) -> int:
        """Queue leases (DESIGN §5.4): deliveries not acked within the lease go to another
        consumer; both recipients' pumps are woken (the old one gets a void delivery)."""
        now = now_ms()
        moved = await self.store.reassign_lapsed(now - int(lease_s * 1000), now)
        for m in moved:
            log.info("broker_queue_lease_lapsed", mesh_id=m.mesh_id,
                     broker_message_id=m.broker_message_id, from_pubkey=m.from_pubkey,
                     to_pubkey=m.to_pubkey)
        self.connections.wake({(m.mesh_id, m.to_pubkey) for m in moved})
        return len(moved)


def deliver_frame(row: DeliveryRow) -> dict[str, Any]:
    body = (row.body.decode("utf-8") if row.body_encoding == "utf8"
            else base64.b64encode(row.body).decode("ascii"))
    frame: dict[str, Any] = {
        "type": "deliver", "epoch": row.epoch, "seq": row.seq,
        "broker_message_id": row.broker_message_id, "sender_pubkey": row.sender_pubkey,
        "client_message_id": row.client_message_id, "to": {"kind": row.kind, "ref": row.ref},
        "body": body, "body_encoding": row.body_encoding, "priority": row.priority,
        "meta": row.meta, "reply_to": row.reply_to, "created_at": row.created_at,
    }
    if row.history_id is not None:
        frame["history_id"] = row.history_id
    if row.reassigned:
        frame["reassigned"] = True
    if row.sender_name is not None:
        frame["sender_name"] = row.sender_name
    return frame
