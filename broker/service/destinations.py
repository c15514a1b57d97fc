"""``request`` frames: a member creates topics, subscribes to them and consumes queues."""

from __future__ import annotations

from typing import Any

from tidemesh.broker.service.connections import Conn, now_ms
from tidemesh.broker.store.base import Store


class Destinations:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def request(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        op, name, now = frame["op"], frame["name"], now_ms()
        if op == "topic_create":
            await self.store.create_topic(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_subscribe":
            await self.store.subscribe(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_unsubscribe":
            await self.store.unsubscribe(conn.mesh_id, name, conn.pubkey)
        elif op == "queue_consume":
            await self.store.add_queue_consumer(conn.mesh_id, name, conn.pubkey, now)
        else:
            await self.store.remove_queue_consumer(conn.mesh_id, name, conn.pubkey)
        return {"type": "result", "id": frame["id"], "ok": True}
