"""The accept decision of spec §4.6.2 / §4.7.2, as pure functions (no I/O, no clock).

``prepare`` is phase B1 (before any transaction): shape, size, fingerprint, ids.
``branch`` is the step after claiming the dedupe row and reading it back: the row is ours
(201, go on to B2 and the inserts), someone's earlier matching send (200 duplicate), or an
earlier send with other content (409). ``pick_queue_consumer`` chooses a competing consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tidemesh.core.errors import InvalidRequest, PayloadTooLarge, RateLimited, TidemeshError
from tidemesh.core.fingerprint import prefix, request_fingerprint
from tidemesh.core.ids import new_ulid
from tidemesh.core.record import record
from tidemesh.core.send import frame_content

DAY_MS = 86_400_000


@record
class AcceptInput:
    """One send that passed B1, with its ids made in code before the transaction."""

    mesh_id: str
    sender_pubkey: str
    client_message_id: str
    kind: str
    ref: str
    body: bytes
    body_encoding: str
    priority: str
    meta: dict[str, Any] | None
    reply_to: str | None
    fingerprint: bytes
    broker_message_id: str
    history_id: str
    now_ms: int
    expires_at: int | None
    traceparent: str | None = None   # W3C trace context, kept with the message, not fingerprinted

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.mesh_id, self.sender_pubkey, self.client_message_id)


@record
class DedupeRow:
    broker_message_id: str
    history_id: str
    request_fingerprint: bytes
    history_available: bool
    first_seen_at: int


@record
class Delivery:
    """A recipient of an accepted send. A topic message's subscribers are given their seq
    when each is handed the topic's log (``broker/topiclog.py``): epoch and seq are 0 here."""

    recipient_pubkey: str
    epoch: int
    seq: int


@record
class AcceptResult:
    status: int                         # 201, 200 (duplicate), 409, 4xx, 5xx
    client_message_id: str
    broker_message_id: str | None = None
    history_id: str | None = None
    history_available: bool = True
    first_seen_at: int | None = None
    broker_fingerprint: bytes | None = None
    error: TidemeshError | None = None
    deliveries: tuple[Delivery, ...] = field(default=())

    def to_frame(self, request_id: str) -> dict[str, Any]:
        """The ``send_result`` frame (spec §4.5b bodies, one error shape)."""
        frame: dict[str, Any] = {"type": "send_result", "id": request_id, "status": self.status,
                                 "client_message_id": self.client_message_id}
        if self.status in (200, 201):
            frame.update(broker_message_id=self.broker_message_id, history_id=self.history_id,
                         duplicate=self.status == 200)
            if self.status == 200:
                frame.update(history_available=self.history_available,
                             first_seen_at=self.first_seen_at)
        elif self.status == 409 and self.broker_fingerprint is not None:
            frame.update(conflict="request_fingerprint_mismatch",
                         broker_fingerprint_prefix=prefix(self.broker_fingerprint),
                         error={"code": "idempotency_key_reused",
                                "message": "this client_message_id was used for a different "
                                           "request; it is final, send under a new id"})
        elif self.error is not None:
            frame["error"] = self.error.to_body()["error"]
            if isinstance(self.error, RateLimited):
                frame["retry_after_ms"] = self.error.retry_after_ms
        return frame


class Branch(StrEnum):
    CREATED = "created"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


def branch(ours: AcceptInput, row: DedupeRow) -> Branch:
    """Decide from the dedupe row read back inside the transaction."""
    if row.broker_message_id == ours.broker_message_id:
        return Branch.CREATED
    if row.request_fingerprint == ours.fingerprint:
        return Branch.DUPLICATE
    return Branch.CONFLICT


def answer_existing(ours: AcceptInput, row: DedupeRow) -> AcceptResult:
    """The 200 or 409 answer for a key that an earlier send already claimed."""
    if branch(ours, row) is Branch.DUPLICATE:
        return AcceptResult(200, ours.client_message_id, row.broker_message_id, row.history_id,
                            row.history_available, row.first_seen_at)
    return AcceptResult(409, ours.client_message_id, broker_fingerprint=row.request_fingerprint)


def created(ours: AcceptInput, deliveries: list[Delivery]) -> AcceptResult:
    return AcceptResult(201, ours.client_message_id, ours.broker_message_id, ours.history_id,
                        True, ours.now_ms, deliveries=tuple(deliveries))


def failed(ours: AcceptInput, error: TidemeshError) -> AcceptResult:
    return AcceptResult(error.http_status, ours.client_message_id, error=error)


@dataclass(frozen=True, slots=True)
class Limits:
    inline_bytes: int
    dedupe_mode: str            # retention_scoped | permanent
    dedupe_retention_days: int


def prepare(
    frame: dict[str, Any], mesh_id: str, sender: str, limits: Limits, now_ms: int,
    ids: tuple[str, str] | None = None,
) -> AcceptInput:
    """Phase B1 on a schema-valid ``send`` frame; raises (4xx, no side effects). ``ids``
    (broker_message_id, history_id) are minted here unless the caller minted them in bulk.
    The frame is read as it is (``core/send.frame_content``): the rules its schema cannot
    say, then its own strings kept, with no ``SendRequest`` built and turned back into them."""
    body, meta, cmid, meta_jcs, traceparent = frame_content(frame)
    if cmid is None:  # the send schema requires it; frame_content allows its absence
        raise InvalidRequest("client_message_id is required", field="client_message_id")
    if len(body) > limits.inline_bytes:
        raise PayloadTooLarge(
            f"body is {len(body)} bytes, over max_payload.inline_bytes={limits.inline_bytes}",
            field="body",
        )
    to, priority = frame["to"], frame["priority"]
    kind, ref, reply_to = to["kind"], to["ref"], frame.get("reply_to") or None
    expires = (None if limits.dedupe_mode == "permanent"
               else now_ms + limits.dedupe_retention_days * DAY_MS)
    return AcceptInput(
        mesh_id=mesh_id, sender_pubkey=sender, client_message_id=cmid,
        kind=kind, ref=ref, body=body, body_encoding=frame["body_encoding"],
        priority=priority, meta=meta, reply_to=reply_to,
        fingerprint=request_fingerprint(kind, ref, body, priority, meta, reply_to,
                                        meta_jcs),
        broker_message_id=ids[0] if ids else new_ulid(now_ms),
        history_id=ids[1] if ids else new_ulid(now_ms),
        now_ms=now_ms, expires_at=expires, traceparent=traceparent,
    )


def queue_pick_key(broker_message_id: str) -> int:
    """A non-negative 62-bit number from the id's tail; mesh.accept_batch() picks alike."""
    return int.from_bytes(broker_message_id[-8:].encode(), "big") & ((1 << 62) - 1)


def pick_queue_consumer(consumers: list[str], broker_message_id: str) -> str:
    """Spread a queue's messages over its consumers (code-point order), stable per id."""
    ordered = sorted(consumers)
    return ordered[queue_pick_key(broker_message_id) % len(ordered)]


def recipients_for(kind: str, ref: str, queue_consumers: list[str],
                   broker_message_id: str) -> list[str]:
    """Who gets a delivery row: the DM target, or one of a queue's consumers. A topic's
    message gets none: it takes the next place in its topic's log, and each subscriber but
    the sender reads it from there (``broker/topiclog``)."""
    if kind == "topic":
        return []
    if kind == "dm":
        return [ref]
    return [pick_queue_consumer(queue_consumers, broker_message_id)]
