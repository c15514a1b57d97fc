"""Topic subscriptions and queue consumption: asked of the broker over the live link, and
remembered locally once the broker confirms, for ``GET /v1/topics`` and ``/v1/queues``."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from tidemesh.core.errors import Unavailable
from tidemesh.core.send import Destination
from tidemesh.daemon.store import inbox
from tidemesh.daemon.store.db import Database


class Requester(Protocol):
    async def request(self, op: str, name: str) -> None: ...


class MembershipService:
    def __init__(self, db: Database, requester: Callable[[], Requester | None]) -> None:
        self.db = db
        self.requester = requester

    async def _ask(self, op: str, name: str) -> None:
        req = self.requester()
        if req is None:
            raise Unavailable("the daemon is not connected to the broker; try again shortly",
                              reason="broker_disconnected")
        await req.request(op, name)

    async def join(self, kind: str, name: str, create: bool = False) -> dict[str, Any]:
        Destination.checked(kind, name)
        if kind == "topic" and create:
            await self._ask("topic_create", name)
        await self._ask("topic_subscribe" if kind == "topic" else "queue_consume", name)
        now = int(time.time() * 1000)
        await self.db.write(partial(inbox.membership_add, kind=kind, name=name, now=now))
        return {"kind": kind, "name": name, "member": True}

    async def leave(self, kind: str, name: str) -> dict[str, Any]:
        Destination.checked(kind, name)
        await self._ask("topic_unsubscribe" if kind == "topic" else "queue_leave", name)
        await self.db.write(partial(inbox.membership_remove, kind=kind, name=name))
        return {"kind": kind, "name": name, "member": False}

    async def create_topic(self, name: str) -> dict[str, Any]:
        Destination.checked("topic", name)
        await self._ask("topic_create", name)
        return {"kind": "topic", "name": name, "created": True}

    async def list(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "items": await self.db.read(partial(inbox.memberships, kind=kind))}
