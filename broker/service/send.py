"""Accepting sends: B1 here (the schema of a batch's item, ``broker/accept.prepare``), outside
any transaction, then the frame's valid sends as one operation of the store's group-committed
accept; a 201 wakes each connected recipient's pump.

A B1 reject gets its own error result and never reaches the store; the others of its frame
go on. ``send`` and ``send_batch`` must reach the store's queue before their first
suspension: the server starts them in arrival order, and that is what keeps one
connection's sends accepted in the order they arrived.
"""

from __future__ import annotations

from typing import Any

import structlog

from tidemesh.broker.accept import AcceptInput, AcceptResult, Limits, prepare
from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import TidemeshError
from tidemesh.core.wire import InvalidFrame, check

log = structlog.get_logger(__name__)

Frame = dict[str, Any]


class Sends:
    def __init__(self, store: Store, limits: Limits, metrics: Metrics,
                 connections: Connections) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.connections = connections

    async def send(self, conn: Conn, frame: Frame) -> Frame:
        """One ``send`` frame → its ``send_result`` frame (a batch of one)."""
        return (await self._accept(conn, [frame], {}))[0]

    async def send_batch(self, conn: Conn, frame: Frame) -> Frame:
        """A ``send_batch`` frame → one ``send_results`` frame, a result per item in order.
        Each item is checked on its own, so a bad one gets its own 400."""
        sends: list[Frame] = []
        rejected: dict[int, Frame] = {}
        for i, item in enumerate(frame["sends"]):
            try:
                sends.append(check({**item, "type": "send"}))
            except InvalidFrame as exc:
                self.metrics.bad_frames.inc()
                rejected[i] = _invalid(item, exc)
                sends.append(item)
        return {"type": "send_results", "id": frame["id"],
                "results": await self._accept(conn, sends, rejected)}

    async def _accept(self, conn: Conn, sends: list[Frame], answered: dict[int, Frame]
                      ) -> list[Frame]:
        """B1 for each send not ``answered`` yet, then the rest as one store operation."""
        now = now_ms()
        results: dict[int, AcceptResult] = {}
        valid: list[tuple[int, AcceptInput]] = []
        for i, send in enumerate(sends):
            if i in answered:
                continue
            try:
                valid.append((i, prepare(send, conn.mesh_id, conn.pubkey, self.limits, now)))
            except TidemeshError as exc:
                results[i] = AcceptResult(exc.http_status, send["client_message_id"], error=exc)
        accepted = await self.store.accept_batch([a for _, a in valid])
        for (i, _), result in zip(valid, accepted, strict=True):
            results[i] = result
        self._woken(conn, accepted)
        for result in results.values():
            self._count(conn, result)
        return [answered[i] if i in answered else results[i].to_frame(send["id"])
                for i, send in enumerate(sends)]

    def _woken(self, conn: Conn, accepted: list[AcceptResult]) -> None:
        self.connections.wake({(conn.mesh_id, d.recipient_pubkey)
                               for r in accepted if r.status == 201 for d in r.deliveries})

    def _count(self, conn: Conn, result: AcceptResult) -> None:
        self.metrics.accepts.labels(status=str(result.status)).inc()
        if result.status == 200:
            self.metrics.duplicates.labels(mesh_id=conn.mesh_id).inc()
        elif result.status == 409:
            self.metrics.mismatch.labels(client_id=conn.pubkey, mesh_id=conn.mesh_id).inc()
            log.warning("broker_fingerprint_mismatched", mesh_id=conn.mesh_id,
                        sender=conn.pubkey, client_message_id=result.client_message_id)


def _invalid(item: Frame, exc: InvalidFrame) -> Frame:
    details = {k: v for k, v in exc.details.items() if k != "id"}
    return {"type": "send_result", "id": str(item["id"]), "status": 400,
            "client_message_id": str(item.get("client_message_id", "")),
            "error": {"code": exc.code, "message": exc.message, **details}}
