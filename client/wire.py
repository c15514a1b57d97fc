"""The JSON bodies of the IPC surface, typed; each mirrors its schema in ``schemas/``.

They stay plain dicts (``TypedDict``), so a result prints as the daemon sent it and a newer
daemon's extra fields pass through untouched.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Priority = Literal["now", "next", "low"]


class Destination(TypedDict):
    kind: Literal["topic", "dm", "queue"]
    ref: str


class SendRequest(TypedDict, total=False):
    """``to`` is ``{"kind", "ref"}`` or the short form ``"topic:ops"``, ``"dm:<hex>"``,
    ``"queue:jobs"``; ``body_encoding`` is ``utf8`` (default) or ``base64``."""

    to: Destination | str
    body: str
    body_encoding: Literal["utf8", "base64"]
    priority: Priority
    meta: dict[str, Any] | None
    reply_to: str | None
    client_message_id: str
    traceparent: str  # W3C trace context (docs/ipc.md); the daemon makes one when absent


class SendResult(TypedDict):
    """202 ``queued``/``inflight``: on disk, will be sent. 200 ``done`` with ``duplicate``:
    this id was already delivered, as ``broker_message_id``."""

    client_message_id: str
    outbox_id: str
    status: Literal["queued", "inflight", "done"]
    duplicate: NotRequired[bool]
    broker_message_id: NotRequired[str | None]
    history_id: NotRequired[str | None]


class BatchResult(TypedDict):
    """One send of ``send_many``: the ``status`` and ``body`` ``send`` would have got, a
    ``SendResult`` for 202/200, else the error body ``{"error": {"code", "message", ...}}``
    (400 not a valid send, 403 vetoed, 409 the accept table); ``core.errors.from_body(status,
    body)`` makes it the exception ``send`` would have raised."""

    status: int
    body: SendResult | dict[str, Any]


class RequeueResult(TypedDict):
    aborted_row_id: str
    new_row_id: str
    new_client_message_id: str


class PruneResult(TypedDict):
    dry_run: bool
    deleted: int
    events_deleted: NotRequired[int]
    skipped: NotRequired[str]


class OutboxPage(TypedDict):
    items: list[dict[str, Any]]
    counts: dict[str, int]


class Delivery(TypedDict):
    epoch: int
    seq: int


# "from" is a keyword, hence the functional form.
InboxEntry = TypedDict("InboxEntry", {
    "seq": int, "id": str, "mesh": str, "from": str, "sender_name": NotRequired[str | None],
    "client_message_id": str, "broker_message_id": str, "to": Destination, "body": str,
    "body_encoding": Literal["utf8", "base64"], "priority": Priority,
    "meta": dict[str, Any] | None, "reply_to": str | None, "sent_at": int, "received_at": int,
    "delivery": Delivery, "traceparent": NotRequired[str | None],
})


class Lost(TypedDict):
    count: int
    through_seq: int


class InboxPage(TypedDict):
    """A page (``next_after`` to read on), or a named consumer's entries (``consumer``,
    ``cursor``, and ``lost`` when retention removed entries it had not acked)."""

    items: list[InboxEntry]
    next_after: NotRequired[int]
    more: NotRequired[bool]   # the byte budget ended the page before limit: read on
    consumer: NotRequired[str]
    cursor: NotRequired[int]
    lost: NotRequired[Lost]


class AckResult(TypedDict):
    consumer: str
    cursor: int


class Membership(TypedDict):
    name: str
    since: int


class Memberships(TypedDict):
    kind: Literal["topic", "queue"]
    items: list[Membership]
