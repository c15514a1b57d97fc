"""Accepting sends: B1 here (``broker/accept.prepare``, outside any transaction), the
rest in the store's group-committed accept; a 201 wakes each connected recipient's pump."""

from __future__ import annotations

from typing import Any

import structlog

from tidemesh.broker.accept import AcceptResult, Limits, prepare
from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import TidemeshError
from tidemesh.core.wire import InvalidFrame, check

log = structlog.get_logger(__name__)


class Sends:
    def __init__(self, store: Store, limits: Limits, metrics: Metrics,
                 connections: Connections) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.connections = connections

    async def send(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """One ``send`` frame → its ``send_result`` frame."""
        try:
            item = prepare(frame, conn.mesh_id, conn.pubkey, self.limits, now_ms())
        except TidemeshError as exc:
            result = AcceptResult(exc.http_status, frame["client_message_id"], error=exc)
        else:
            result = await self.store.accept(item)
            if result.status == 201:
                self.connections.wake({(conn.mesh_id, d.recipient_pubkey)
                                       for d in result.deliveries})
        self._count(conn, result)
        return result.to_frame(frame["id"])

    async def one_of_batch(self, conn: Conn, item: dict[str, Any]) -> dict[str, Any]:
        """One send of a ``send_batch``: checked on its own, so one bad send gets its own 400
        and the others are accepted."""
        try:
            send = check({**item, "type": "send"})
        except InvalidFrame as exc:
            self.metrics.bad_frames.inc()
            details = {k: v for k, v in exc.details.items() if k != "id"}
            return {"type": "send_result", "id": str(item["id"]), "status": 400,
                    "client_message_id": str(item.get("client_message_id", "")),
                    "error": {"code": exc.code, "message": exc.message, **details}}
        return await self.send(conn, send)

    def _count(self, conn: Conn, result: AcceptResult) -> None:
        self.metrics.accepts.labels(status=str(result.status)).inc()
        if result.status == 200:
            self.metrics.duplicates.labels(mesh_id=conn.mesh_id).inc()
        elif result.status == 409:
            self.metrics.mismatch.labels(client_id=conn.pubkey, mesh_id=conn.mesh_id).inc()
            log.warning("broker_fingerprint_mismatched", mesh_id=conn.mesh_id,
                        sender=conn.pubkey, client_message_id=result.client_message_id)
