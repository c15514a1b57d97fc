"""Values the daemon's layers pass each other: read out of the stores by the services and
handed to the HTTP layer and the broker link, neither of which imports the stores (the
import contracts in pyproject.toml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tidemesh.core.errors import TidemeshError
from tidemesh.core.record import record
from tidemesh.core.send import SendRequest


@record
class Event:
    """One entry of the local event log (GET /v1/events)."""

    id: int
    type: str
    data: dict[str, Any]
    created_at: int


@record
class Delivery:
    """One message the broker delivered to this member, already decrypted."""

    id: str
    mesh: str
    sender_pubkey: str
    sender_name: str | None
    client_message_id: str
    broker_message_id: str
    dest_kind: str
    dest_ref: str
    body: bytes
    body_encoding: str
    priority: str
    meta: dict[str, Any] | None
    reply_to: str | None
    epoch: int
    seq: int
    sent_at: int
    received_at: int
    hooks: tuple[str, ...] = ()  # the hooks its event fires, recorded with it
    traceparent: str | None = None  # W3C trace context the send carried


@record
class Void:
    """A delivery that is not stored (a lapsed queue lease that went to another consumer):
    only the receive cursor moves past it, so the stream stays gapless."""

    epoch: int
    seq: int
    at: int


@record
class StoreResult:
    inbox_seq: int | None        # None: a redelivery of something already stored
    event: Event | None
    extra: tuple[Event, ...] = ()  # events after the message's (a shared file's file_shared)


@record
class Claimed:
    """A row the sender took (now inflight) to put on the wire."""

    id: str
    client_message_id: str
    payload: bytes
    attempts: int


@record
class OutboxRow:
    """One row of the outbox as the store reads it (times in ms since the epoch)."""

    id: str
    client_message_id: str
    request_fingerprint: bytes
    payload: bytes
    dest_kind: str
    dest_ref: str
    enqueued_at: int
    attempts: int
    next_attempt_at: int
    status: str
    last_error: str | None
    delivered_at: int | None
    broker_message_id: str | None
    history_id: str | None
    aborted_at: int | None
    aborted_by: str | None
    superseded_by: str | None
    supersedes: str | None


@dataclass(frozen=True, slots=True)
class Page:
    """A query of the inbox: entries after a seq, optionally of one topic or sender, or
    whose text body matches the FTS5 query ``q``."""

    after: int | None = None
    limit: int = 100
    topic: str | None = None
    sender: str | None = None
    q: str | None = None


class SendKind(StrEnum):
    """How the outbox took a send (spec §4.5.1); the HTTP layer turns it into a status."""

    NEW = "new"              # no row held the id: a new row, queued for the broker
    REPLAY = "replay"        # the same request again while its row is pending or inflight
    DUPLICATE = "duplicate"  # the same request again after the broker stored it
    CONFLICT = "conflict"    # the id is bound to another request, or its row ended


@record
class BoundRow:
    """The outbox row a client_message_id is bound to, as much as a send's answer names."""

    id: str
    status: str
    fingerprint_prefix: str
    broker_message_id: str | None = None
    history_id: str | None = None
    last_error: str | None = None
    dest_kind: str | None = None   # "dm": its content is sealed, its fingerprint never shown


@record
class SendOutcome:
    """What became of one send: the accept table's row, the request and the row it hit.

    ``queue_status`` is the row's state as the caller sees it (queued, inflight, done);
    a conflict names its ``conflict`` code and whether the row's broker id or last error
    explain it (``shows_broker_id``, ``shows_reason``).
    """

    kind: SendKind
    client_message_id: str
    fingerprint_prefix: str
    row: BoundRow
    queue_status: str | None = None
    conflict: str | None = None
    shows_broker_id: bool = False
    shows_reason: bool = False


# One send of a batch as the HTTP layer hands it over: parsed, or the 4xx that refused it.
BatchItem = SendRequest | TidemeshError
