"""What each ``mesh_`` tool does, through the SDK (``AsyncClient``) only, as any local
program reaches its daemon.

A session's read state is one named consumer of the daemon's inbox
(``session.NAME.read``): the unread view, ``mesh_inbox``, ``mesh_wait`` and the ``read``
receipts all follow its cursor, so every view agrees, and a peek reads without moving it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from tidemesh.client.aio import AsyncClient
from tidemesh.core import agents
from tidemesh.core.errors import InvalidRequest, NotFound

Handler = Callable[["Session", dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Session:
    """One MCP server's view: its daemon, mesh, session name and member key."""

    client: AsyncClient
    mesh: str
    name: str
    member_key: str = ""
    receipts: bool = True
    since_ms: int = 0   # when the session first registered: member-wide entries from then
    # Set by the push loop whenever an entry for this session arrives (wakes mesh_wait).
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def read_consumer(self) -> str:
        return f"session.{self.name}.read"

    @property
    def push_consumer(self) -> str:
        return f"session.{self.name}.push"

    @property
    def address(self) -> str:
        return str(agents.SessionAddress(self.member_key, self.name))

    async def start(self) -> None:
        """Register with the daemon (it holds this session's messages from now on)."""
        self.member_key = str((await self.client.health())["member_pubkey"])
        registered = await self.client.session_register(self.name)
        self.since_ms = int(registered.get("created_at", 0))

    def shown(self, entry: dict[str, Any]) -> bool:
        return agents.for_session(entry, self.name, self.since_ms)

    async def unread(self, limit: int = 100) -> list[dict[str, Any]]:
        page = await self.client.inbox(limit=limit, consumer=self.read_consumer)
        if not self.member_key:
            await self.start()
        return [dict(e) for e in page["items"] if self.shown(dict(e))]

    async def send_receipt(self, entry: dict[str, Any], state: str) -> bool:
        if not self.receipts or not agents.wants_receipt(entry, self.member_key):
            return False
        message, key = agents.receipt_send(entry, state, self.name)
        await self.client.send(message, idempotency_key=key)
        return True


async def resolve(s: Session, to: str) -> tuple[str, str | None]:
    """``to`` as the daemon's destination, and the session it names (if any)."""
    if to.startswith(("topic:", "queue:", "dm:")):
        return to, None
    if (addr := agents.parse_session_address(to)) is not None:
        return f"dm:{addr.member}", addr.name
    member, _, session = to.partition("/")
    key = await _member_key(s, member.lstrip("@"))
    return f"dm:{key}", agents.check_session_name(session) if session else None


async def _member_key(s: Session, who: str) -> str:
    peers = (await s.client.peers())["peers"]
    named = [p["pubkey"] for p in peers if p.get("display_name") == who]
    if not named and len(who) >= 4:
        named = [p["pubkey"] for p in peers if str(p["pubkey"]).startswith(who.lower())]
    if len(named) == 1:
        return str(named[0])
    if not named:
        raise NotFound(f"no member present named {who!r} or with a key starting so; "
                       "mesh_peers lists who is there", field="to")
    raise InvalidRequest(f"{who!r} names {len(named)} members; give more of the key",
                         field="to")


async def send(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    to, session = await resolve(s, args["to"])
    meta: dict[str, Any] = {agents.FROM_SESSION_KEY: s.name}
    if session is not None:
        meta[agents.SESSION_KEY] = session
    message: dict[str, Any] = {"to": to, "body": args["body"], "meta": meta}
    for name in ("reply_to", "priority"):
        if name in args:
            message[name] = args[name]
    key = args.get("idempotency_key")
    result = await s.client.send(message, idempotency_key=f"mcp-{key}" if key else None)
    return {"to": to if session is None else f"session:{to[3:]}/{session}",
            "client_message_id": result["client_message_id"],
            "outbox_id": result["outbox_id"], "status": result["status"]}


async def inbox(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    limit = int(args.get("limit", 50))
    if args.get("all"):
        page = await s.client.inbox(limit=limit)
        if not s.member_key:
            await s.start()
        items = [dict(e) for e in page["items"] if s.shown(dict(e))]
        return {"messages": items, "marked_read_up_to": None}
    items = await s.unread(limit)
    if args.get("peek") or not items:
        return {"messages": items, "marked_read_up_to": None}
    done = await mark_read(s, {"seq": items[-1]["seq"]})
    return {"messages": items, "marked_read_up_to": done["read_up_to"]}


async def mark_read(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    up_to, sent = int(args["seq"]), 0
    # Receipts first, then the cursor: a server killed between them sends the same
    # receipts again (each once, by its key), never moves the cursor without them.
    for entry in await s.unread(limit=1000):
        if entry["seq"] <= up_to and await s.send_receipt(entry, "read"):
            sent += 1
    acked = await s.client.ack(s.read_consumer, up_to)
    return {"read_up_to": acked["cursor"], "receipts_sent": sent}


async def peers(s: Session, _args: dict[str, Any]) -> dict[str, Any]:
    """Members present; this member's own entry also lists its sessions (as session
    addresses), which only its daemon knows: presence carries no session yet."""
    if not s.member_key:
        await s.start()   # this session is among them even before its push loop ran
    out = []
    for p in (await s.client.peers())["peers"]:
        profile = p.get("profile") or {}
        entry = {"key": p["pubkey"], "name": p.get("display_name"),
                 "self": bool(p.get("self")), "status": profile.get("status"),
                 "summary": profile.get("summary")}
        if entry["self"]:
            entry["sessions"] = [f"session:{p['pubkey']}/{x['name']}"
                                 for x in await s.client.sessions()]
        out.append(entry)
    return {"peers": out}


async def set_status(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {k: args[k] for k in ("status", "summary") if k in args}
    if not patch:
        raise InvalidRequest("give status, summary or both", field="status")
    return {"profile": (await s.client.profile(patch)).get("profile", {})}


async def subscribe(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    await s.client.membership("topic", "subscribe", args["topic"], create=True)
    return {"topic": args["topic"], "subscribed": True}


async def unsubscribe(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    await s.client.membership("topic", "unsubscribe", args["topic"])
    return {"topic": args["topic"], "subscribed": False}


async def wait(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + float(args.get("timeout_s", 30))
    while True:
        s.arrived.clear()
        if items := await s.unread():
            return {"messages": items, "timed_out": False}
        left = deadline - loop.time()
        if left <= 0:
            return {"messages": [], "timed_out": True}
        # The push loop wakes it; the bound re-checks in case an arrival was missed.
        with suppress(TimeoutError):
            await asyncio.wait_for(s.arrived.wait(), min(left, 5.0))


async def receipts(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    return {"receipts": await s.client.receipts(int(args.get("limit", 20)))}


async def file_share(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    to, session = await resolve(s, args["to"])
    if session is not None:
        raise InvalidRequest("files go to a member, topic or queue, not one session",
                             field="to")
    res = await s.client.file_share(args["path"], to, message=args.get("message"))
    return {"file": res["file"], "announcement": res["announcement"]}


async def file_get(s: Session, args: dict[str, Any]) -> dict[str, Any]:
    res = await s.client.file_get(args["id"], args["out"])
    return {"file": res.get("file", res)}


HANDLERS: dict[str, Handler] = {
    "mesh_send": send, "mesh_inbox": inbox, "mesh_mark_read": mark_read,
    "mesh_peers": peers, "mesh_set_status": set_status, "mesh_subscribe": subscribe,
    "mesh_unsubscribe": unsubscribe, "mesh_wait": wait, "mesh_receipts": receipts,
    "mesh_file_share": file_share, "mesh_file_get": file_get,
}
