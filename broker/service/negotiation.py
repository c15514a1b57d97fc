"""``feature_negotiation_request``: what this broker supports, and what it lacks of what the
daemon requires."""

from __future__ import annotations

from typing import Any

from tidemesh.broker.accept import Limits
from tidemesh.broker.service.connections import Conn
from tidemesh.core import features


class Negotiation:
    def __init__(self, limits: Limits) -> None:
        self.supported = features.advertise(limits.dedupe_mode, limits.dedupe_retention_days,
                                            limits.inline_bytes)

    async def negotiate(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        missing = [f for f in frame["require"] if f not in self.supported]
        # Frames a daemon did not ask for would be invalid to it: batches only on request.
        asked = (*frame["require"], *frame.get("optional", ()))
        conn.negotiated = True
        conn.batch_deliveries = features.DELIVER_BATCH in asked
        conn.trace_context = features.TRACE_CONTEXT in asked
        conn.presence_batch = features.PRESENCE_BATCH in asked
        conn.key_rotation = features.KEY_ROTATION in asked
        # No presence at all: it asks ``peers`` when it wants to know.
        conn.presence_feed = features.PRESENCE_ON_DEMAND not in asked
        # Numbered batches with updates make sense only after a snapshot (server.py sends it).
        conn.presence_snapshot = (conn.presence_feed and conn.presence_batch
                                  and features.PRESENCE_SNAPSHOT in asked)
        return {"type": "feature_negotiation_response", "id": frame["id"],
                "supported": self.supported, "missing_required": missing}
