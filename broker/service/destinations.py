"""``request`` frames: a member creates topics, subscribes to them and consumes queues, and
leaves the mesh (``member_leave``, naming its own key: the session's signed hello is what
makes the request the member's own)."""

from __future__ import annotations

from typing import Any

import structlog

from tidemesh.broker.service.connections import Conn, now_ms
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import InvalidRequest, NotFound

log = structlog.get_logger(__name__)


class Destinations:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def request(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        op, name, now = frame["op"], frame["name"], now_ms()
        if op == "member_leave":
            return await self._leave(conn, frame["id"], name, now)
        if op == "topic_create":
            await self.store.create_topic(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_subscribe":
            await self.store.subscribe(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_unsubscribe":
            await self.store.unsubscribe(conn.mesh_id, name, conn.pubkey, now)
            conn.wake.set()   # what was handed out with it goes now, not at the next message
        elif op == "queue_consume":
            await self.store.add_queue_consumer(conn.mesh_id, name, conn.pubkey, now)
        else:
            await self.store.remove_queue_consumer(conn.mesh_id, name, conn.pubkey)
        return {"type": "result", "id": frame["id"], "ok": True}

    async def _leave(self, conn: Conn, request_id: str, name: str, now: int) -> dict[str, Any]:
        """Revoke the member, as `broker member revoke` does, and drop its subscriptions,
        queue memberships and undelivered deliveries; its key can no longer hello. Its other
        connections are closed by the revocation's event (PostgreSQL) or the next recheck."""
        if name != conn.pubkey:
            raise InvalidRequest("member_leave names the leaving member's own key",
                                 field="name")
        conn.leaving = True   # the revocation's event spares this one: the answer goes first
        removed = await self.store.leave_member(conn.mesh_id, conn.pubkey, now)
        if removed is None:
            raise NotFound("this member is not in the mesh any more", reason="member_revoked")
        log.info("broker_member_left", mesh_id=conn.mesh_id, pubkey=conn.pubkey, **removed)
        return {"type": "result", "id": request_id, "ok": True, "left": True, **removed}
