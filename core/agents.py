"""Agent sessions (DESIGN §12): session addresses, what a session is pushed, and receipts.

A session is an address under a member: ``session:MEMBERKEY/NAME``. On the wire it is a DM
to the member whose sealed ``meta`` names the session (``tidemesh_session``), so the broker
routes to the member and never learns which session a message is for. The member's daemon
keeps it in its inbox until that session's MCP server reads it.

Receipts are DMs of their own kind back to the sender (``meta.tidemesh_receipt``): one
``delivered`` when the recipient session was shown the message, one ``read`` when it marked
it read. Each has an idempotency key derived from the original's broker id, the state and
the session, so a receipt is sent once however often it is asked for. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.paths import check_name

SESSION_KEY = "tidemesh_session"          # meta: the session a DM is for
FROM_SESSION_KEY = "tidemesh_from_session"  # meta: the session that sent it
RECEIPT_KEY = "tidemesh_receipt"          # meta: this DM is a receipt
STATES = ("accepted", "at_broker", "delivered", "read")

_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class SessionAddress:
    member: str   # the member's ed25519 key, 64 hex
    name: str

    def __str__(self) -> str:
        return f"session:{self.member}/{self.name}"


def check_session_name(name: str) -> str:
    return check_name(name, "session", field="session")   # the one pattern of core.paths


def session_name_for(folder: str) -> str:
    """The default session name: the working folder's last part, made a valid name."""
    base = PurePath(folder).name or "session"
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-._")[:64]
    return cleaned or "session"


def parse_session_address(text: str) -> SessionAddress | None:
    """``session:KEY/NAME`` as an address; None for anything that is not a session form."""
    if not text.startswith("session:"):
        return None
    member, sep, name = text[len("session:"):].partition("/")
    if not sep or not _KEY.fullmatch(member):
        raise InvalidRequest("a session address is session:MEMBERKEY/NAME, MEMBERKEY the "
                             f"member's 64-hex key: {text!r}", field="to")
    return SessionAddress(member, check_session_name(name))


def session_of(entry: dict[str, Any]) -> str | None:
    """The session an inbox entry is addressed to (None: the member as a whole)."""
    meta = entry.get("meta")
    if entry.get("to", {}).get("kind") != "dm" or not isinstance(meta, dict):
        return None
    name = meta.get(SESSION_KEY)
    return name if isinstance(name, str) else None


def receipt_of(entry: dict[str, Any]) -> dict[str, str] | None:
    """The receipt an inbox entry carries, if it is one (a DM with a well-formed receipt)."""
    meta = entry.get("meta")
    if entry.get("to", {}).get("kind") != "dm" or not isinstance(meta, dict):
        return None
    r = meta.get(RECEIPT_KEY)
    if not isinstance(r, dict) or r.get("state") not in ("delivered", "read"):
        return None
    if not isinstance(r.get("of"), str):
        return None
    return {k: str(v) for k, v in r.items() if isinstance(v, str)}


def for_session(entry: dict[str, Any], session: str, since_ms: int = 0) -> bool:
    """Whether a session is shown this entry: a DM naming it, whenever it came (it waited
    for the session); anything for its member as a whole (topics, queues, DMs naming no
    session) that came since the session first registered (``since_ms``: a new session is
    not flooded with its member's history); never a receipt."""
    if receipt_of(entry) is not None:
        return False
    target = session_of(entry)
    if target is None:
        return int(entry.get("received_at", 0)) >= since_ms
    return target == session


def channel_meta(entry: dict[str, Any], mesh: str) -> dict[str, str]:
    """The ``meta`` of a ``notifications/claude/channel``: strings only, since a client drops
    a notification whose meta holds anything else."""
    to = entry.get("to", {})
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    out = {
        "sender_key": str(entry.get("from", "")),
        "sender_name": str(entry.get("sender_name") or ""),
        "mesh": mesh,
        "to": f"{to.get('kind', '')}:{to.get('ref', '')}",
        "topic": str(to.get("ref", "")) if to.get("kind") == "topic" else "",
        "message_id": str(entry.get("broker_message_id", "")),
        "client_id": str(entry.get("client_message_id", "")),
        "reply_to": str(entry.get("reply_to") or ""),
        "priority": str(entry.get("priority", "")),
        "seq": str(entry.get("seq", "")),
    }
    if isinstance(meta, dict) and isinstance(meta.get(FROM_SESSION_KEY), str):
        out["from_session"] = f"session:{entry.get('from', '')}/{meta[FROM_SESSION_KEY]}"
    return {k: v for k, v in out.items() if v}


def channel_content(entry: dict[str, Any]) -> str:
    """The text a session is shown: the body, or a note that it is binary."""
    if entry.get("body_encoding") == "base64":
        return f"[binary message, {len(str(entry.get('body', '')))} base64 characters]"
    return str(entry.get("body", ""))


def receipt_send(entry: dict[str, Any], state: str, session: str) -> tuple[dict[str, Any], str]:
    """The DM (and its idempotency key) that tells an entry's sender it reached ``state``
    in ``session``; the key makes every ask for the same receipt one send."""
    of = str(entry["broker_message_id"])
    key = f"receipt-{state}-{of}-{session}"
    meta = {RECEIPT_KEY: {"of": of, "client_message_id": str(entry["client_message_id"]),
                          "state": state, "session": session}}
    return {"to": f"dm:{entry['from']}", "body": state, "meta": meta}, key


def wants_receipt(entry: dict[str, Any], self_key: str) -> bool:
    """Receipts go for DMs from another member, never for a receipt (no echo)."""
    return (entry.get("to", {}).get("kind") == "dm" and entry.get("from") != self_key
            and receipt_of(entry) is None and bool(entry.get("broker_message_id")))


def receipt_view(row: dict[str, Any], receipts: list[dict[str, str]]) -> dict[str, Any]:
    """One sent message's receipts: ``state`` the furthest reached, ``recipients`` each
    session's (or member's) furthest."""
    status = row.get("status")
    state = "at_broker" if status == "done" else "accepted"
    if status in ("dead", "aborted", "failed"):
        state = str(status)
    per: dict[str, str] = {}
    for r in receipts:
        who = f"{r.get('from', '')}/{r.get('session', '')}".rstrip("/")
        if STATES.index(r["state"]) > STATES.index(per.get(who, "accepted")):
            per[who] = r["state"]
    if per:
        state = max(per.values(), key=STATES.index)
    return {"outbox_id": row.get("id"), "client_message_id": row.get("client_message_id"),
            "to": row.get("to"), "broker_message_id": row.get("broker_message_id"),
            "state": state, "recipients": per}


def receipts_seen(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """The receipts among inbox entries, by the broker id of the message they are about."""
    seen: dict[str, list[dict[str, str]]] = {}
    for e in entries:
        if (r := receipt_of(e)) is not None:
            seen.setdefault(r["of"], []).append({**r, "from": str(e.get("from", ""))})
    return seen


def receipt_views(rows: list[dict[str, Any]], entries: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Each sent outbox row (receipts themselves left out) with its receipts."""
    seen = receipts_seen(entries)
    return [receipt_view(row, seen.get(str(row.get("broker_message_id")), []))
            for row in rows if not str(row.get("client_message_id", "")).startswith("receipt-")]
