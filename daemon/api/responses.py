"""What a send's outcome looks like on the wire: the HTTP status and JSON body of each row
of the accept table (spec §4.5.1; docs/ipc.md). Pure: no aiohttp, no I/O.

A conflict is the error envelope of ``IdempotencyConflict`` (409), raised for the middleware
to render like every other error. In a batch each send's answer is that same status and body,
carried as one item of the 200 (``batch_item``).
"""

from __future__ import annotations

from typing import Any

from tidemesh.core.errors import IdempotencyConflict, TidemeshError
from tidemesh.daemon.records import SendKind, SendOutcome

_STATUS = {SendKind.NEW: 202, SendKind.REPLAY: 202, SendKind.DUPLICATE: 200}


def send_response(out: SendOutcome) -> tuple[int, dict[str, Any]]:
    """The (status, body) of an accepted send; raises ``IdempotencyConflict`` for a 409."""
    if out.kind is SendKind.CONFLICT:
        raise send_conflict(out)
    body: dict[str, Any] = {"client_message_id": out.client_message_id, "outbox_id": out.row.id}
    if out.kind is SendKind.DUPLICATE:
        body.update(status="done", duplicate=True, broker_message_id=out.row.broker_message_id,
                    history_id=out.row.history_id)
    else:
        body["status"] = out.queue_status
    return _STATUS[out.kind], body


def send_conflict(out: SendOutcome) -> IdempotencyConflict:
    """The 409 for an id already bound to another request or to a row that ended."""
    row = out.row
    details: dict[str, Any] = {
        "conflict": out.conflict,
        "client_message_id": out.client_message_id,
        "outbox_id": row.id,
        "daemon_fingerprint_prefix": out.fingerprint_prefix,
    }
    if row.dest_kind != "dm":
        # An unkeyed hash of a DM's plaintext would let a guess at its content be
        # confirmed offline; the caller's own prefix is of what it just sent.
        details["stored_fingerprint_prefix"] = row.fingerprint_prefix
    if out.shows_broker_id:
        details["broker_message_id"] = row.broker_message_id
    if out.shows_reason:
        details["reason"] = row.last_error
    return IdempotencyConflict(
        f"client_message_id {out.client_message_id!r} is already bound to outbox row "
        f"{row.id} ({row.status}); a 409 is final, send again under a new id",
        **details,
    )


def scoped_outcome(out: SendOutcome, owned: bool) -> SendOutcome:
    """What a hook's reply token may learn of a send: everything about a row its own token
    made; of any other row bound to the id, only that the id is taken (a 409 naming no
    row, no status and no fingerprint but the caller's own)."""
    if owned or out.kind is SendKind.NEW:
        return out
    raise IdempotencyConflict(
        f"client_message_id {out.client_message_id!r} is already bound to a send this reply "
        "token did not make; send again under a new id",
        conflict="bound_to_another_send", client_message_id=out.client_message_id,
        daemon_fingerprint_prefix=out.fingerprint_prefix)


def batch_item(out: SendOutcome | TidemeshError) -> dict[str, Any]:
    """One send of a batch as ``{"status", "body"}``: exactly what POST /v1/send would have
    answered it, the error envelope included."""
    if isinstance(out, SendOutcome):
        if out.kind is not SendKind.CONFLICT:
            status, body = send_response(out)
            return {"status": status, "body": body}
        out = send_conflict(out)
    return {"status": out.http_status, "body": out.to_body()}
