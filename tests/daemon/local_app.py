"""The daemon's IPC app composed in the test process over real SQLite files and a real Unix
socket, for receive-side tests that need deliveries injected before the broker link exists."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tidemesh.core.ids import new_ulid
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.daemon.api.keys import (
    BUS,
    INBOX,
    OUTBOX,
    STATE,
    DaemonInfo,
    IpcMetrics,
    IpcState,
)
from tidemesh.daemon.process.server import IpcServer, build_app
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.store.inbox import Delivery

SENDER = "ab" * 32


@dataclass
class LocalApp:
    socket: Path
    inbox: InboxService
    bus: EventBus
    outbox: OutboxService
    state: IpcState
    server: IpcServer

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(base_url="http://localhost",
                                     connector=aiohttp.UnixConnector(path=str(self.socket)))


def delivery(seq: int, cmid: str | None = None, topic: str = "ops", body: str = "hi",
             sender: str = SENDER, epoch: int = 1) -> Delivery:
    now = int(time.time() * 1000)
    return Delivery(
        id=new_ulid(), mesh="t", sender_pubkey=sender, sender_name="alice",
        client_message_id=cmid or f"m{seq}", broker_message_id=new_ulid(), dest_kind="topic",
        dest_ref=topic, body=body.encode(), body_encoding="utf8", priority="next",
        meta={"n": seq}, reply_to=None, epoch=epoch, seq=seq, sent_at=now, received_at=now,
    )


@asynccontextmanager
async def local_app(folder: Path, **state: Any) -> AsyncIterator[LocalApp]:
    outbox_db = await open_outbox(folder / "outbox.db", 64)
    search = bool(state.pop("fts_enabled", True))
    inbox_db = await open_inbox(folder / "inbox.db", search)
    bus = EventBus(state.pop("max_streams", 32), state.pop("sse_buffer", 1000))
    app = build_app(1 << 20)
    registry = CollectorRegistry()
    app[OUTBOX] = OutboxService(outbox_db)
    app[INBOX] = InboxService(inbox_db, bus, search_enabled=search)
    app[BUS] = bus
    app[STATE] = IpcState(token="t", max_inflight=256, public_health_check=False,
                          info=DaemonInfo("t"), registry=registry,
                          metrics=IpcMetrics.register(registry), **state)
    server = IpcServer(app, folder / "sock", None, 2.0)
    await server.start()
    try:
        yield LocalApp(folder / "sock", app[INBOX], bus, app[OUTBOX], app[STATE], server)
    finally:
        await server.stop()
        await outbox_db.close()
        await inbox_db.close()
