"""Presence: who is connected (the link's own set, kept from the broker's presence snapshot
and changes, or the broker's list asked for), this member's profile, and the directory that
a DM's ``@name`` or key prefix is resolved against (``core/names``).

The profile lives in inbox.db and is authoritative here: it is sent to the broker on every
connect and on every change, so the broker's in-memory copy can always be rebuilt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from tidemesh.core.errors import NotJoined, TidemeshError, Unavailable
from tidemesh.core.names import Known, is_key, resolve
from tidemesh.core.send import Destination, DestinationKind
from tidemesh.daemon.store import inbox
from tidemesh.daemon.store.db import Database


class PresenceLink(Protocol):
    async def peers(self) -> list[dict[str, Any]]: ...
    async def set_profile(self, profile: dict[str, Any]) -> None: ...


class PresenceService:
    def __init__(self, db: Database, link: Callable[[], PresenceLink | None],
                 self_pubkey: str) -> None:
        self.db = db
        self.link = link
        self.self_pubkey = self_pubkey

    async def profile(self) -> dict[str, Any]:
        return await self.db.read(inbox.profile_get)

    async def update_profile(self, patch: dict[str, Any]) -> dict[str, Any]:
        """Store the change, then tell the broker if connected (else on the next connect)."""
        now = int(time.time() * 1000)
        merged = await self.db.write(partial(inbox.profile_merge, patch=patch, now=now))
        try:
            link = self.link()
        except NotJoined:   # kept here, and sent on the first connect after a join
            link = None
        if link is not None:
            await link.set_profile(merged)
        return {"profile": merged, "published": link is not None}

    async def peers(self) -> dict[str, Any]:
        link = self.link()
        if link is None:
            raise Unavailable("the daemon is not connected to the broker; presence is unknown",
                              reason="broker_disconnected")
        peers = await link.peers()
        for p in peers:
            p["self"] = p["pubkey"] == self.self_pubkey
        return {"peers": peers}

    async def resolved(self, dest: Destination) -> Destination:
        """``dest`` with a DM's name or key prefix replaced by the one key it names."""
        if dest.kind is not DestinationKind.DM or is_key(dest.ref):
            return dest
        return Destination(DestinationKind.DM, resolve(dest.ref, await self.directory()))

    async def directory(self) -> list[Known]:
        """The members this daemon knows: connected now (their live names first), then
        everyone with a message in the inbox (the name it last came under)."""
        known = [Known(p["pubkey"], p.get("display_name")) for p in await self._present()]
        senders = await self.db.read(inbox.sender_names)
        return known + [Known(key, name) for key, name in senders]

    async def _present(self) -> list[dict[str, Any]]:
        """The connected members, or none when the link cannot say (offline, not joined):
        the inbox still names everyone who wrote."""
        try:
            link = self.link()
            return [] if link is None else await link.peers()
        except TidemeshError:
            return []
