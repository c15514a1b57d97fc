"""The send request: destination, body and options, normalized and checked.

Structure (types, required fields, enums) is checked against ``schemas/send_request``
by the adapter before this module sees the data; here live the rules a schema cannot
say: the id grammar, strict base64, destination refs, meta's depth (``jsonbounds.META_DEPTH``)
and canonical-JSON-ability.
"""

from __future__ import annotations

import base64
import binascii
import re
from enum import StrEnum
from typing import Any

import rfc8785

from tidemesh.core.errors import IdempotencyKeyMismatch, InvalidRequest
from tidemesh.core.fingerprint import meta_canonical
from tidemesh.core.ids import client_message_id_problem
from tidemesh.core.jsonbounds import META_DEPTH, deeper_than
from tidemesh.core.names import is_name_ref
from tidemesh.core.record import record
from tidemesh.core.trace import checked_traceparent, new_traceparent


class DestinationKind(StrEnum):
    TOPIC = "topic"
    DM = "dm"
    QUEUE = "queue"


class Priority(StrEnum):
    NOW = "now"
    NEXT = "next"
    LOW = "low"


# Members by value, looked up directly: calling the enum class costs ~0.5 µs, twice per send.
# An unknown value still goes through the call, which raises as before.
_KINDS = {k.value: k for k in DestinationKind}
_PRIORITIES = {p.value: p for p in Priority}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_PUBKEY = re.compile(r"[0-9a-f]{64}")


@record
class Destination:
    kind: DestinationKind
    ref: str

    @classmethod
    def parse(cls, text: str) -> Destination:
        """Parse the CLI form ``topic:NAME``, ``dm:MEMBER`` or ``queue:NAME``."""
        kind, sep, ref = text.partition(":")
        if not sep or kind not in DestinationKind.__members__.values():
            raise InvalidRequest(
                "destination must be topic:NAME, dm:MEMBER or queue:NAME (MEMBER: a key, a key "
                "prefix or @name)", field="to"
            )
        return cls.checked(kind, ref)

    @classmethod
    def checked(cls, kind: str, ref: str) -> Destination:
        dest = cls(_KINDS.get(kind) or DestinationKind(kind), ref)
        if dest.kind is DestinationKind.DM:
            if not _PUBKEY.fullmatch(ref) and not is_name_ref(ref):
                raise InvalidRequest(
                    "dm ref must be a member's ed25519 public key (64 lowercase hex), a prefix "
                    "of at least 16 hex digits of it, or @ and its display name", field="to.ref"
                )
        elif not _NAME.fullmatch(ref):
            raise InvalidRequest(
                f"{kind} name must be 1-128 of A-Z a-z 0-9 . _ : - starting with a letter or digit",
                field="to.ref",
            )
        return dest

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "ref": self.ref}


@record
class SendRequest:
    """A validated send. ``body`` is the exact bytes that are fingerprinted and sent."""

    to: Destination
    body: bytes
    body_encoding: str
    priority: Priority
    meta: dict[str, Any] | None
    reply_to: str | None
    client_message_id: str | None
    meta_jcs: bytes = b""        # RFC 8785 form of meta, computed once (empty when no meta)
    # W3C traceparent; not fingerprinted, so a retry carrying another one is the same send.
    traceparent: str | None = None

    def to_payload(self) -> dict[str, Any]:
        """The form stored in the outbox and sent to the broker (body as text or base64)."""
        body = (
            self.body.decode("utf-8")
            if self.body_encoding == "utf8"
            else base64.b64encode(self.body).decode("ascii")
        )
        return {
            "to": self.to.to_dict(),
            "body": body,
            "body_encoding": self.body_encoding,
            "priority": self.priority.value,
            "meta": self.meta,
            "reply_to": self.reply_to,
            "traceparent": self.traceparent,
        }


def pick_client_message_id(header: str | None, body_id: str | None) -> str | None:
    """Header and body may both carry the id; they must agree when both are present."""
    if header is not None and body_id is not None and header != body_id:
        raise IdempotencyKeyMismatch(
            "Idempotency-Key header and body client_message_id differ",
            header=header, body=body_id,
        )
    chosen = header if header is not None else body_id
    if chosen is not None:
        problem = client_message_id_problem(chosen)
        if problem:
            raise InvalidRequest(f"client_message_id {problem}", field="client_message_id")
    return chosen


def pick_traceparent(header: str | None, field: str | None) -> str:
    """The send's traceparent: the header's, else the body's, else a new one."""
    if header is not None:
        return checked_traceparent(header)
    if field is not None:
        return checked_traceparent(field)
    return new_traceparent()


def parse_send_request(data: dict[str, Any], header_id: str | None = None,
                       header_traceparent: str | None = None) -> SendRequest:
    """Build a SendRequest from schema-valid JSON; raises InvalidRequest naming the field."""
    to = data["to"]
    dest = (
        Destination.parse(to) if isinstance(to, str) else Destination.checked(to["kind"], to["ref"])
    )
    encoding = data.get("body_encoding", "utf8")
    body, meta, cmid, meta_jcs, traceparent = _content(data, encoding, header_id,
                                                       header_traceparent)
    return SendRequest(
        to=dest,
        body=body,
        body_encoding=encoding,
        priority=_priority(data.get("priority", Priority.NEXT.value)),
        meta=meta,
        reply_to=data.get("reply_to") or None,
        client_message_id=cmid,
        meta_jcs=meta_jcs,
        traceparent=traceparent,
    )


# What the rules a schema cannot say make of a send: (body, meta, client_message_id, meta's
# canonical form, traceparent). A tuple: a value built per send on the hot path.
Content = tuple[bytes, dict[str, Any] | None, str | None, bytes, str]


def frame_content(frame: dict[str, Any]) -> Content:
    """A schema-checked ``send`` frame (or ``send_batch`` item) held to the rules its schema
    cannot say, as ``parse_send_request`` holds it, read off the frame: its destination, body
    encoding and priority are the frame's own strings, with no ``SendRequest`` built and
    turned back into them (the broker's B1)."""
    to = frame["to"]
    Destination.checked(to["kind"], to["ref"])
    return _content(frame, frame["body_encoding"], None, None)


def _content(data: dict[str, Any], encoding: str, header_id: str | None,
             header_traceparent: str | None) -> Content:
    """The body, meta's depth, the id, meta's canonical form and the traceparent, checked in
    that order (a send with several faults is refused for the first)."""
    body = _decode_body(data["body"], encoding)
    meta = data.get("meta") or None
    if meta is not None and deeper_than(meta, META_DEPTH):
        # Before the canonicaliser, which recurses once per level (core/jsonbounds).
        raise InvalidRequest(f"meta nests deeper than {META_DEPTH} levels", field="meta")
    cmid = pick_client_message_id(header_id, data.get("client_message_id"))
    return (body, meta, cmid, _canonical_meta(meta),
            pick_traceparent(header_traceparent, data.get("traceparent")))


def _priority(value: str) -> Priority:
    return _PRIORITIES.get(value) or Priority(value)


def _decode_body(body: str, encoding: str) -> bytes:
    if encoding == "utf8":
        try:
            return body.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates survive JSON parsing
            raise InvalidRequest("body is not valid UTF-8 text", field="body") from exc
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("body is not valid base64", field="body") from exc


def _canonical_meta(meta: dict[str, Any] | None) -> bytes:
    try:
        return meta_canonical(meta)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        raise InvalidRequest(f"meta cannot be canonicalized: {exc}", field="meta") from exc
