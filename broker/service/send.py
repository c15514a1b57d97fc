"""Accepting sends: B1 here (the schema of a batch's item, ``broker/accept.prepare``), outside
any transaction, then the member's send budget (``ratelimit``), then the frame's sends within
it as one operation of the store's group-committed accept; a 201 wakes each connected
recipient's pump.

The budget counts new sends only. A frame that fits takes its tokens at once and gets back
those of sends the accept answered 200 or 409. A frame that does not fit is looked up in the
dedupe table first (B0): sends already there are answered from it exactly as the accept
would, the rest take tokens in item order, and those left over are answered 429
``rate_limited`` with ``retry_after_ms``.

A B1 reject gets its own error result and never reaches the store; the others of its frame
go on. ``send`` and ``send_batch`` must reach the store's queue before their first
suspension: the server starts them in arrival order, and that is what keeps one
connection's sends accepted in the order they arrived.
"""

from __future__ import annotations

from typing import Any

import structlog

from tidemesh.broker.accept import (
    AcceptInput,
    AcceptResult,
    Limits,
    answer_existing,
    failed,
    prepare,
)
from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.service.ratelimit import Limiter, Member
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import RateLimited, TidemeshError
from tidemesh.core.ratelimit import Admission
from tidemesh.core.wire import InvalidFrame, check

log = structlog.get_logger(__name__)

Frame = dict[str, Any]
Valid = list[tuple[int, AcceptInput]]   # sends that passed B1, by their place in the frame


class Sends:
    def __init__(self, store: Store, limits: Limits, metrics: Metrics,
                 connections: Connections, limiter: Limiter) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.connections = connections
        self.limiter = limiter

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
        """B1 for each send not ``answered`` yet, the budget, then the sends within it as one
        store operation."""
        now = now_ms()
        results: dict[int, AcceptResult] = {}
        valid: Valid = []
        for i, send in enumerate(sends):
            if i in answered:
                continue
            try:
                valid.append((i, prepare(send, conn.mesh_id, conn.pubkey, self.limits, now)))
            except TidemeshError as exc:
                results[i] = AcceptResult(exc.http_status, send["client_message_id"], error=exc)
        member = (conn.mesh_id, conn.pubkey)
        admission = self.limiter.fast(member, len(valid), now) if valid else None
        if admission is not None or not valid:
            # No suspension before the store's queue: this frame keeps its place.
            self._filled(member, admission)
            await self._store(member, valid, results)
        else:
            async with self.limiter.turn(member):
                await self._store(member, await self._budgeted(member, valid, results), results)
        for result in results.values():
            self._count(conn, result)
        return [answered[i] if i in answered else results[i].to_frame(send["id"])
                for i, send in enumerate(sends)]

    async def _budgeted(self, member: Member, valid: Valid, results: dict[int, AcceptResult]
                        ) -> Valid:
        """B0, then the budget: answers the retries and the sends over budget into
        ``results``; returns the sends that took a token."""
        known = await self.store.known([a.key for _, a in valid])
        fresh = [(i, a) for i, a in valid if a.key not in known]
        for i, a in valid:
            if a.key in known:
                results[i] = answer_existing(a, known[a.key])
        self.metrics.fast_path.inc(len(valid) - len(fresh))
        admission = self.limiter.admit(member, len(fresh), now_ms())
        self._filled(member, admission)
        over = fresh[admission.admitted:]
        for (i, a), wait_ms in zip(over, admission.retry_after_ms, strict=True):
            results[i] = failed(a, RateLimited(
                "over this member's send budget; send it again after retry_after_ms",
                retry_after_ms=wait_ms))
        if over:
            self.metrics.rate_limited.labels(mesh_id=member[0]).inc(len(over))
            log.info("broker_send_rate_limited", mesh_id=member[0], sender=member[1],
                     refused=len(over), retry_after_ms=admission.retry_after_ms[-1])
        return fresh[:admission.admitted]

    async def _store(self, member: Member, sends: Valid, results: dict[int, AcceptResult]
                     ) -> None:
        """The sends that took a token, as one store operation; tokens back for retries."""
        accepted = await self.store.accept_batch([a for _, a in sends])
        for (i, _), result in zip(sends, accepted, strict=True):
            results[i] = result
        self._woken(member, accepted)
        retries = sum(1 for r in accepted if r.status in (200, 409))
        if retries:
            self.limiter.refund(member, retries, now_ms())

    def _filled(self, member: Member, admission: Admission | None) -> None:
        if admission is not None and not self.limiter.rate(member[0]).unlimited:
            self.metrics.bucket_fill.observe(admission.fill)

    def _woken(self, member: Member, accepted: list[AcceptResult]) -> None:
        self.connections.wake({(member[0], d.recipient_pubkey)
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
