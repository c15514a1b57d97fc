"""The MCP tools of ``tidemesh mcp``, as data: name, description, input and output schema.

Every name starts ``mesh_`` so that a model never confuses one with a client's built-in tool
of a similar name (``SendMessage``). ``handlers.py`` answers each by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_STR = {"type": "string"}
_OBJ: dict[str, Any] = {"type": "object"}
_ENTRIES = {"type": "array", "items": _OBJ}


def _input(required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


def _output(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "mesh_send",
        "Send a message over the tidemesh mesh. `to`: a member's display name or key "
        "prefix, MEMBER/SESSION for one session of a member, session:KEY/NAME, topic:NAME, "
        "queue:NAME or dm:KEY. Give `idempotency_key` so a retried call sends once.",
        _input(("to", "body"),
               to={"type": "string", "minLength": 1, "maxLength": 300},
               body={"type": "string", "maxLength": 262144},
               reply_to={"type": "string", "minLength": 1, "maxLength": 255},
               priority={"enum": ["now", "next", "low"]},
               idempotency_key={"type": "string", "minLength": 1, "maxLength": 200}),
        _output(to=_STR, client_message_id=_STR, outbox_id=_STR, status=_STR)),
    ToolSpec(
        "mesh_inbox",
        "Messages for this session not yet read, oldest first; they are marked read unless "
        "`peek` is true (a peek changes nothing). `all`: read ones too.",
        _input(peek={"type": "boolean"}, all={"type": "boolean"},
               limit={"type": "integer", "minimum": 1, "maximum": 200}),
        _output(messages=_ENTRIES, marked_read_up_to={"type": ["integer", "null"]})),
    ToolSpec(
        "mesh_mark_read",
        "Mark this session's messages read up to and including `seq` (senders of DMs get a "
        "read receipt).",
        _input(("seq",), seq={"type": "integer", "minimum": 1}),
        _output(read_up_to={"type": "integer"}, receipts_sent={"type": "integer"})),
    ToolSpec(
        "mesh_peers",
        "Members present in the mesh now, with their status, summary and sessions.",
        _input(),
        _output(peers=_ENTRIES)),
    ToolSpec(
        "mesh_set_status",
        "Set this member's status (idle, working, dnd, away) and summary, seen by peers.",
        _input(status={"enum": ["idle", "working", "dnd", "away"]},
               summary={"type": "string", "maxLength": 1024}),
        _output(profile=_OBJ)),
    ToolSpec(
        "mesh_subscribe",
        "Subscribe to a topic (created when missing).",
        _input(("topic",), topic={"type": "string", "minLength": 1, "maxLength": 128}),
        _output(topic=_STR, subscribed={"type": "boolean"})),
    ToolSpec(
        "mesh_unsubscribe",
        "Unsubscribe from a topic.",
        _input(("topic",), topic={"type": "string", "minLength": 1, "maxLength": 128}),
        _output(topic=_STR, subscribed={"type": "boolean"})),
    ToolSpec(
        "mesh_wait",
        "Block until a message for this session arrives, or `timeout_s` passes; returns the "
        "unread messages (not marked read).",
        _input(timeout_s={"type": "number", "minimum": 0, "maximum": 600}),
        _output(messages=_ENTRIES, timed_out={"type": "boolean"})),
    ToolSpec(
        "mesh_receipts",
        "What became of the messages this member sent, newest first: accepted by the "
        "daemon, at_broker, delivered (shown to the recipient session) or read, per "
        "recipient.",
        _input(limit={"type": "integer", "minimum": 1, "maximum": 200}),
        _output(receipts=_ENTRIES)),
    ToolSpec(
        "mesh_file_share",
        "Share a local file (absolute or relative path) with `to` (as mesh_send's `to`).",
        _input(("path", "to"), path={"type": "string", "minLength": 1, "maxLength": 4096},
               to={"type": "string", "minLength": 1, "maxLength": 300},
               message={"type": "string", "maxLength": 4096}),
        _output(file=_OBJ, announcement=_OBJ)),
    ToolSpec(
        "mesh_file_get",
        "Fetch a shared file by id to `out` (a path), verified by its SHA-256.",
        _input(("id", "out"), id={"type": "string", "minLength": 1, "maxLength": 64},
               out={"type": "string", "minLength": 1, "maxLength": 4096}),
        _output(file=_OBJ)),
)

BY_NAME = {t.name: t for t in TOOLS}
