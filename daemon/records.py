"""Values the daemon's layers pass each other: read out of the stores by the services and
handed to the HTTP layer, which never imports the stores (the import contract in
pyproject.toml)."""

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
