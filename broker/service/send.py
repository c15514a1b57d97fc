"""Accepting sends: the member's send budget (``ratelimit``), then B1 here (the schema of a
batch's item, ``broker/accept.prepare``) outside any transaction for the sends within it,
then those as one operation of the store's group-committed accept; a 201 wakes each
connected recipient's pump.

The budget counts new sends only. A frame that fits takes its tokens at once and gets back
those of sends that B1 rejected or the accept answered 200 or 409. A frame that does not fit
is looked up in the dedupe table first (B0): sends already there are answered from it
exactly as the accept would, the rest take tokens in item order, and those left over are
answered 429 ``rate_limited`` with ``retry_after_ms`` without B1 (a send over budget may so
hear 429 before the 400 its content would earn; sent again, it gets the 400).

A B1 reject gets its own error result and never reaches the store; the others of its frame
go on. ``send`` and ``send_batch`` must reach the store's queue before their first
suspension, or hold their member's turn until they do: the server starts them in arrival
order, and that is what keeps one connection's sends accepted in the order they arrived.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import structlog

from tidemesh.broker.accept import (
    AcceptInput,
    AcceptResult,
    Limits,
    answer_existing,
    prepare,
)
from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.service.ratelimit import Limiter, Member
from tidemesh.broker.store.base import Store
from tidemesh.core import tracing
from tidemesh.core.errors import RateLimited, TidemeshError
from tidemesh.core.ids import new_ulids
from tidemesh.core.ratelimit import Admission
from tidemesh.core.wire import InvalidFrame, check

log = structlog.get_logger(__name__)

Frame = dict[str, Any]
Valid = list[tuple[int, AcceptInput]]   # sends that passed B1, by their place in the frame
# A frame's B1 is done this many sends at a time, reading other frames between slices: at
# ~17 µs a send, no frame holds the broker's event loop much over half a millisecond for it.
B1_SLICE = 32
# The longest a connection goes unread after a 429 (keepalive pings must still get through).
READ_HOLD_MAX_MS = 1000


class Sends:
    def __init__(self, store: Store, limits: Limits, metrics: Metrics,
                 connections: Connections, limiter: Limiter) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.connections = connections
        self.limiter = limiter

    async def send(self, conn: Conn, frame: Frame) -> Frame:
        """One ``send`` frame (the server checked its schema) → its ``send_result`` frame
        (a batch of one)."""
        return (await self._accept(conn, [frame], checked=True))[0]

    async def send_batch(self, conn: Conn, frame: Frame) -> Frame:
        """A ``send_batch`` frame → one ``send_results`` frame, a result per item in order.
        Each item is checked on its own, so a bad one gets its own 400."""
        return {"type": "send_results", "id": frame["id"],
                "results": await self._accept(conn, frame["sends"], checked=False)}

    async def _accept(self, conn: Conn, sends: list[Frame], *, checked: bool) -> list[Frame]:
        """The budget, B1 for the sends it lets through, then those as one store operation.

        B1 (schema, fingerprint, ids) is the costly part of a refusal, so a frame over budget
        is refused before it: a flooding member's 429s cost the broker a dict lookup and one
        B0 query a frame, not the accept's CPU."""
        now = now_ms()
        member = (conn.mesh_id, conn.pubkey)
        answers: dict[int, Frame | AcceptResult] = {}
        admission = self.limiter.fast(member, len(sends), now)
        if admission is not None and len(sends) <= B1_SLICE:
            # No suspension before the store's queue: this frame keeps its place.
            self._filled(member, admission)
            valid = self._b1(conn, sends, range(len(sends)), checked, answers, now)
            self._refund_rejected(member, len(sends), valid)
            await self._store(conn, valid, answers)
        else:
            await self._in_turn(conn, member, sends, admission, checked, answers, now)
        frames: list[Frame] = []
        statuses: collections.Counter[int] = collections.Counter()
        for i, send in enumerate(sends):
            answer = answers[i]
            if isinstance(answer, AcceptResult):
                statuses[answer.status] += 1
                if answer.status == 409:
                    self._mismatched(conn, answer)
                answer = answer.to_frame(send["id"])
            frames.append(answer)
        self._count(conn, statuses)
        return frames

    async def _in_turn(self, conn: Conn, member: Member, sends: list[Frame],
                       admission: Admission | None, checked: bool,
                       answers: dict[int, Frame | AcceptResult], now: int) -> None:
        """A frame that suspends before it reaches the store: one that waits for B0, or one
        whose B1 is done a slice at a time so that other members' frames are read between
        slices (a big frame's B1 would hold the event loop for milliseconds). The member's
        turn keeps its frames in arrival order until this one is in the store's queue; the
        commit is awaited after the turn has passed on, so a member's frames still commit
        together."""
        # The turn is left first (the TaskGroup then waits for the commit).
        async with asyncio.TaskGroup() as tg, self.limiter.turn(member):
            if admission is None:
                waited = now_ms()
                if not self.limiter.owes(member, waited):
                    admission = self.limiter.if_fits(member, len(sends), waited)
            if admission is None:
                places = await self._budgeted(conn, member, sends, checked, answers, now)
            else:
                self._filled(member, admission)
                places = list(range(len(sends)))
            valid: Valid = []
            for start in range(0, len(places), B1_SLICE):
                if start:
                    await asyncio.sleep(0)
                valid += self._b1(conn, sends, places[start:start + B1_SLICE], checked,
                                  answers, now)
            self._refund_rejected(member, len(places), valid)
            tg.create_task(self._store(conn, valid, answers))
            await asyncio.sleep(0)  # the store task queues the frame before the turn passes

    def _refund_rejected(self, member: Member, admitted: int, valid: Valid) -> None:
        """Tokens back for the sends that took one and B1 rejected."""
        if len(valid) < admitted:
            self.limiter.refund(member, admitted - len(valid), now_ms())

    def _b1(self, conn: Conn, sends: list[Frame], places: Sequence[int], checked: bool,
            answers: dict[int, Frame | AcceptResult], now: int) -> Valid:
        """B1 for the sends at ``places``: the rejected ones answered into ``answers``."""
        valid: Valid = []
        ids = new_ulids(2 * len(places), now)
        for n, i in enumerate(places):
            send = sends[i]
            if not checked:
                try:
                    send = check({**send, "type": "send"})
                except InvalidFrame as exc:
                    self.metrics.bad_frames.inc()
                    answers[i] = _invalid(send, exc)
                    continue
            try:
                valid.append((i, prepare(send, conn.mesh_id, conn.pubkey, self.limits, now,
                                         (ids[2 * n], ids[2 * n + 1]))))
            except TidemeshError as exc:
                answers[i] = AcceptResult(exc.http_status, send["client_message_id"], error=exc)
        return valid

    async def _budgeted(self, conn: Conn, member: Member, sends: list[Frame], checked: bool,
                        answers: dict[int, Frame | AcceptResult], now: int) -> list[int]:
        """B0, then the budget (the sends the member owes first): answers the retries and the
        refused sends into ``answers``; returns the places of the sends that took a token."""
        keyed = {i: (member[0], member[1], c) for i, s in enumerate(sends)
                 if (c := _key_of(s)) is not None}
        known = await self.store.known(list(set(keyed.values())))
        retries = [i for i, key in keyed.items() if key in known]
        for i, a in self._b1(conn, sends, retries, checked, answers, now):
            answers[i] = answer_existing(a, known[a.key])
        self.limiter.forgive(member, [keyed[i][2] for i in retries])
        self.metrics.fast_path.inc(len(retries))
        # A send without a usable key is never a retry: it takes its turn, and B1 refuses it.
        fresh = [i for i in range(len(sends)) if i not in answers]
        admission = self.limiter.admit(member, [_key_of(sends[i]) for i in fresh], now_ms())
        self._filled(member, admission)
        over = fresh[admission.admitted:]
        for i, wait_ms in zip(over, admission.retry_after_ms, strict=True):
            answers[i] = AcceptResult(429, str(sends[i].get("client_message_id", "")),
                                      error=RateLimited(
                "over this member's send budget; send it again after retry_after_ms",
                retry_after_ms=wait_ms))
        if over:
            # Backpressure on a member that does not wait: its connection is not read until
            # the largest wait has passed (at most READ_HOLD_MAX_MS), so sending again at once
            # gains it nothing and costs the others nothing. A daemon waits that long anyway;
            # its delivery acks wait with it. What it sent meanwhile waits behind what it owes.
            conn.hold_until_ms = max(conn.hold_until_ms,
                                     now_ms() + min(admission.retry_after_ms[-1],
                                                    READ_HOLD_MAX_MS))
            self.metrics.rate_limited.labels(mesh_id=member[0]).inc(len(over))
            log.info("broker_send_rate_limited", mesh_id=member[0], sender=member[1],
                     refused=len(over), retry_after_ms=admission.retry_after_ms[-1])
        return fresh[:admission.admitted]

    async def _store(self, conn: Conn, sends: Valid,
                     results: dict[int, Frame | AcceptResult]) -> None:
        """The sends that took a token, as one store operation; tokens back for retries."""
        member = (conn.mesh_id, conn.pubkey)
        inputs = [a for _, a in sends]
        with tracing.span("tidemesh.broker.accept", _parents(inputs),
                          {"tidemesh.mesh": member[0], "tidemesh.batch_size": len(inputs)}
                          ) as hop:
            if len(inputs) == 1:
                inputs[0] = _traced(inputs[0], hop)
            accepted = await self.store.accept_batch(inputs)
            if len(accepted) == 1:
                hop.set("tidemesh.status", accepted[0].status)
                hop.set("tidemesh.broker_message_id", accepted[0].broker_message_id or "")
        for (i, _), result in zip(sends, accepted, strict=True):
            results[i] = result
        self._woken(conn, inputs, accepted)
        retries = sum(1 for r in accepted if r.status in (200, 409))
        if retries:
            self.limiter.refund(member, retries, now_ms())

    def _filled(self, member: Member, admission: Admission | None) -> None:
        if admission is not None and not self.limiter.rate(member[0]).unlimited:
            self.metrics.bucket_fill.observe(admission.fill)

    def _woken(self, conn: Conn, inputs: list[AcceptInput], accepted: list[AcceptResult]
               ) -> None:
        """Wake the DM and queue recipients' pumps once the sender's answer is queued: woken
        here, each pump's first step ran before the answer's writer did. A topic message's
        subscribers are not known yet (the accept does not read them): its topic waits on
        ``conn`` for ``wake_topics``, which the server calls after the answer."""
        given: set[tuple[str, str]] = set()
        for a, r in zip(inputs, accepted, strict=True):
            if r.status != 201:
                continue
            if a.kind == "topic":
                conn.logged_topics.add((a.mesh_id, a.ref))
            given.update((a.mesh_id, d.recipient_pubkey) for d in r.deliveries)
        if given:
            asyncio.get_running_loop().call_soon(self.connections.wake, given)

    async def wake_topics(self, conn: Conn) -> None:
        """Wake the pumps of the subscribers of the topics ``conn``'s sends logged, here
        and on the other brokers (after the sender's answer: reading 1,000 subscribers in
        the accept had been half of its time). The sender's own pump is not woken (its
        hand-out leaves its own messages out). When the read fails, every member of those
        meshes connected here is woken instead; the other brokers' poll finds theirs."""
        topics, conn.logged_topics = conn.logged_topics, set()
        if not topics:
            return
        try:
            subscribers = await self.store.topic_subscribers(sorted(topics))
        except Exception as exc:   # a store outage must not end the sender's connection
            self.metrics.background_errors.labels(task="topic_wake", kind="transient").inc()
            log.warning("broker_topic_wake_read_failed", error=str(exc), topics=len(topics))
            self.connections.wake_meshes({m for m, _ in topics})
            return
        self.connections.wake({(m, p) for (m, _), members in subscribers.items()
                               for p in members if p != conn.pubkey}, logged=True)

    def _count(self, conn: Conn, statuses: collections.Counter[int]) -> None:
        """A frame's answers in the metrics, once per status (a labelled child's lookup
        costs more than its increment)."""
        for status, n in statuses.items():
            self.metrics.accepts.labels(status=str(status)).inc(n)
        if statuses[200]:
            self.metrics.duplicates.labels(mesh_id=conn.mesh_id).inc(statuses[200])
        if statuses[409]:
            self.metrics.mismatch.labels(client_id=conn.pubkey, mesh_id=conn.mesh_id).inc(
                statuses[409])

    def _mismatched(self, conn: Conn, result: AcceptResult) -> None:
        log.warning("broker_fingerprint_mismatched", mesh_id=conn.mesh_id,
                    sender=conn.pubkey, client_message_id=result.client_message_id)


def _parents(inputs: list[AcceptInput]) -> list[str | None]:
    return [a.traceparent for a in inputs] if tracing.enabled() else []


def _traced(a: AcceptInput, hop: tracing.Hop) -> AcceptInput:
    """A lone send kept with the accept span's traceparent, so its deliveries are children
    of the accept (not part of the fingerprint: a retry is still the same send)."""
    hop.set("tidemesh.client_message_id", a.client_message_id)
    hop.set("tidemesh.kind", a.kind)
    onward = hop.onward(a.traceparent)
    return a if onward is a.traceparent else dataclasses.replace(a, traceparent=onward)


def _key_of(send: Frame) -> str | None:
    """The send's client_message_id, if it is one a dedupe key or the owed sends can hold (an
    unchecked batch item may carry anything there; B1 refuses it later)."""
    cmid = send.get("client_message_id")
    return cmid if isinstance(cmid, str) else None


def _invalid(item: Frame, exc: InvalidFrame) -> Frame:
    details = {k: v for k, v in exc.details.items() if k != "id"}
    return {"type": "send_result", "id": str(item["id"]), "status": 400,
            "client_message_id": str(item.get("client_message_id", "")),
            "error": {"code": exc.code, "message": exc.message, **details}}
