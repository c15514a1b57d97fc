"""The daemon ⇄ broker WebSocket frames (DESIGN §5.1): names, schema checks, constructors.

Every frame is one JSON text message with a ``type``; requests carry an ``id`` that the
answer echoes. Each frame type has a JSON Schema in ``schemas/ws/<type>.schema.json``;
``check`` validates against it and raises ``InvalidFrame`` naming the failing field.
Shared by the broker and the daemon's link; imports nothing from either.
"""

from __future__ import annotations

import json
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any, cast

import orjson

from tidemesh.core import jsonbounds
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.schemas import Schema

PROTOCOL = 1
# The transports bound a frame first (websockets' max_size); this is the parse's own budget.
MAX_FRAME_BYTES = 16 << 20
# A frame before the handshake (hello or join) is under 1 KB: an unauthenticated peer gets
# no more than this to parse.
HELLO_MAX_BYTES = 4096
_BASE = "https://tidemesh.dev/schemas/ws/"


class FrameType(StrEnum):
    CHALLENGE = "challenge"
    HELLO = "hello"
    JOIN = "join"
    HELLO_ACK = "hello_ack"
    FEATURE_REQUEST = "feature_negotiation_request"
    FEATURE_RESPONSE = "feature_negotiation_response"
    SEND = "send"
    SEND_RESULT = "send_result"
    SEND_BATCH = "send_batch"
    SEND_RESULTS = "send_results"
    ERROR = "error"
    REQUEST = "request"
    RESULT = "result"
    DELIVER = "deliver"
    DELIVER_BATCH = "deliver_batch"
    ACK = "ack"
    RESUME = "resume"
    RESUME_ACK = "resume_ack"
    PEERS = "peers"
    PROFILE = "profile"
    PEER_JOIN = "peer_join"
    PEER_LEAVE = "peer_leave"
    PRESENCE_BATCH = "presence_batch"
    PRESENCE_SNAPSHOT = "presence_snapshot"
    PEER_UPDATE = "peer_update"
    CLONE_SUSPECTED = "clone_suspected"
    KEY_ROTATE = "key_rotate"
    KEY_ROTATED = "key_rotated"
    PEER_KEY_ROTATED = "peer_key_rotated"
    # Shared files (core/files.py): the upload, in order, and the fetch of a chunk.
    FILE_OPEN = "file_open"
    FILE_CHUNK = "file_chunk"
    FILE_CLOSE = "file_close"
    FILE_FETCH = "file_fetch"
    FILE_STATE = "file_state"
    FILE_DATA = "file_data"


class CloseCode:
    """WebSocket close codes of the protocol (documented in docs/broker.md)."""

    POLICY = 1008             # bad signature, replayed nonce, protocol violation, frame flood
    TOO_BIG = 1009
    INTERNAL = 1011
    TRY_AGAIN_LATER = 1013    # the broker's database is down or restarting
    AUTH = 4002               # unknown or revoked member, bad or used-up invite
    FEATURE = 4010            # spec §15.5: feature_unavailable (+ structured close_reason)
    TAKEN_OVER = 4011         # the member connected again, to another broker: reconnect
    SLOW_READER = 4012        # the connection took no frame for limits.slow_reader_s: reconnect
    CLONE = 4013              # another host holds this member's key (clone.policy): back off
    ROTATED_OUT = 4014        # the key was rotated out (daemon rotate-keypair): use the new one
    SILENT = 4015             # nothing heard in server.idle_timeout_s, not a ping: reconnect


class InvalidFrame(InvalidRequest):
    code = "invalid_frame"


def load_schema(frame_type: str) -> dict[str, Any]:
    path = resources.files("tidemesh.schemas") / "ws" / f"{frame_type}.schema.json"
    return cast(dict[str, Any], json.loads(path.read_text(encoding="utf-8")))


def _local_ref(uri: str) -> dict[str, Any]:
    """Resolve a ``$ref`` to another frame's schema from the package, never the network."""
    if not uri.startswith(_BASE):
        raise ValueError(f"schema $ref outside the frame schemas: {uri}")
    return load_schema(uri.removeprefix(_BASE).removesuffix(".schema.json"))


@cache
def _schema(frame_type: str) -> Schema:
    return Schema(load_schema(frame_type), _local_ref)


def decode(raw: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """Parse one frame within ``max_bytes`` and ``jsonbounds.MAX_DEPTH`` levels, then check
    it against its type's schema. A frame over either bound is an ``InvalidFrame`` like any
    other bad frame: answered with an error frame, counted towards the bad-frame close."""
    try:
        data = jsonbounds.loads(raw, max_bytes=max_bytes)
    except (jsonbounds.TooLarge, jsonbounds.TooDeep) as exc:
        raise InvalidFrame(f"frame refused: {exc}", field="frame") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidFrame(f"frame is not valid JSON: {exc}", field="frame") from exc
    if not isinstance(data, dict):
        raise InvalidFrame("frame must be a JSON object", field="frame")
    return check(data)


def check(data: dict[str, Any]) -> dict[str, Any]:
    kind = data.get("type")
    if kind not in FrameType.__members__.values():
        raise InvalidFrame(f"unknown frame type {kind!r}", field="type", id=_id_of(data))
    found = _schema(str(kind)).problem(data)
    if found is not None:
        field, message = found[0] or "frame", found[1]
        raise InvalidFrame(f"{kind}.{field}: {message}", field=field, id=_id_of(data))
    return data


def _id_of(data: dict[str, Any]) -> str | None:
    value = data.get("id")
    return value if isinstance(value, str) else None


def encode(frame: dict[str, Any]) -> str:
    return orjson.dumps(frame).decode("utf-8")


def error_frame(
    code: str, message: str, request_id: str | None = None, **details: Any
) -> dict[str, Any]:
    return {"type": "error", "id": request_id,
            "error": {"code": code, "message": message, **details}}
