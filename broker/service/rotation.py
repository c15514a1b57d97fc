"""``key_rotate``: a member moves to a new key in one step signed by the old and the new key
(docs/broker.md, "Key rotation").

The session's own key must be the old one (its signed hello proved it holds it); both
signatures cover ``handshake.rotation_bytes``. The store moves the member in one
transaction; the step is idempotent, so a daemon that lost the answer (or crashed) asks
again and hears ``already: true``. After the commit the others in the mesh are told
(``peer_key_rotated``); the old key's connections are closed by the periodic member recheck
(close 4014), or by the daemon itself, which hangs up once it has the answer.
"""

from __future__ import annotations

from typing import Any

import structlog

from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.store.base import Store
from tidemesh.core import handshake
from tidemesh.core.errors import InvalidRequest

log = structlog.get_logger(__name__)


class Rotations:
    def __init__(self, store: Store, connections: Connections) -> None:
        self.store = store
        self.connections = connections

    async def rotate(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        old, new = frame["old_pubkey"], frame["new_pubkey"]
        if old != conn.pubkey:
            raise InvalidRequest("key_rotate rotates the session's own key",
                                 field="old_pubkey")
        if old == new:
            raise InvalidRequest("the new key is the old one", field="new_pubkey")
        if not handshake.verify_rotation(conn.mesh_id, frame):
            raise InvalidRequest("a key_rotate signature does not verify",
                                 field="new_signature")
        now = now_ms()
        moved = await self.store.rotate_member(conn.mesh_id, old, new, now)
        for c in self.connections.conns.get((conn.mesh_id, old), ()):
            c.rotated_out = True
        log.info("broker_member_key_rotated", mesh_id=conn.mesh_id, old_pubkey=old,
                 new_pubkey=new, **moved)
        if not moved["already"]:
            self.connections.tell_rotated({
                "type": "peer_key_rotated", "mesh_id": conn.mesh_id, "pubkey": new,
                "old_pubkey": old, "display_name": conn.display_name, "at": now})
        return {"type": "key_rotated", "id": frame["id"], "old_pubkey": old,
                "new_pubkey": new, **moved, **({} if moved["already"] else {"rotated_at": now})}
