"""What a hook's reply token learns of rows it did not make (issue 31 item 10).

A reply token reaching POST /v1/send with another send's client_message_id got a 409 naming
that row's outbox id, status, broker id and ``stored_fingerprint_prefix``: an unkeyed hash
of a DM's plaintext, so a guess at its content could be confirmed offline. A token now sees
only the rows its own sends made, and no 409 carries the fingerprint of sealed content.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nacl.signing import SigningKey

from tidemesh.core.hooks import ReplyScope
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.core.sealing import seal_request
from tidemesh.daemon.api.keys import (
    BUS,
    CAPABILITIES,
    INBOX,
    OUTBOX,
    STATE,
    DaemonInfo,
    IpcMetrics,
    IpcState,
)
from tidemesh.daemon.hooks.capability import Capabilities
from tidemesh.daemon.process.server import IpcServer, build_app
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService

PEER = SigningKey(b"\x01" * 32).verify_key.encode().hex()
LOCAL = "local-token-0123"


@dataclass
class App:
    port: int
    caps: Capabilities

    async def send(self, bearer: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{self.port}/v1/send", json=body,
                headers={"Authorization": f"Bearer {bearer}"}) as r:
            return r.status, await r.json()


@pytest.fixture
async def app(short_tmp: Path) -> AsyncIterator[App]:
    outbox_db = await open_outbox(short_tmp / "outbox.db", 64)
    inbox_db = await open_inbox(short_tmp / "inbox.db")
    key = SigningKey(b"\x02" * 32)
    web_app = build_app(1 << 20)
    registry = CollectorRegistry()
    caps, bus = Capabilities(), EventBus()
    web_app[OUTBOX] = OutboxService(
        outbox_db, sealer=lambda req, cmid: seal_request(key, req, cmid))
    web_app[INBOX], web_app[BUS], web_app[CAPABILITIES] = InboxService(inbox_db, bus), bus, caps
    web_app[STATE] = IpcState(token=LOCAL, max_inflight=8,
                              public_health_check=False, info=DaemonInfo("t"),
                              registry=registry, metrics=IpcMetrics.register(registry))
    server = IpcServer(web_app, short_tmp / "sock", 0, 1.0)
    await server.start()
    try:
        assert server.bound_port is not None
        yield App(server.bound_port, caps)
    finally:
        await server.stop()
        await outbox_db.close()
        await inbox_db.close()


async def test_a_reply_token_sees_nothing_of_a_row_it_did_not_make(app: App) -> None:
    dm = f"dm:{PEER}"
    assert (await app.send(LOCAL, {"to": dm, "body": "invoice 4711", "client_message_id": "x"}
                           ))[0] == 202
    token = app.caps.issue(ReplyScope("dm", PEER, "e1"), "on-dm")
    for guess in ("invoice 4711", "invoice 4712"):  # the same request, and another
        status, body = await app.send(token, {"to": dm, "body": guess,
                                              "client_message_id": "x"})
        assert status == 409, body
        error = body["error"]
        assert set(error) == {"code", "message", "conflict", "client_message_id",
                              "daemon_fingerprint_prefix"}, error
    # Its own send, and its own retry, are answered in full.
    status, body = await app.send(token, {"to": dm, "body": "pong", "client_message_id": "y"})
    assert status == 202, body
    status, again = await app.send(token, {"to": dm, "body": "pong", "client_message_id": "y"})
    assert (status, again["outbox_id"]) == (202, body["outbox_id"])


async def test_no_409_carries_the_fingerprint_of_a_dm_but_a_topic_409_keeps_it(
    app: App,
) -> None:
    dm = f"dm:{PEER}"
    assert (await app.send(LOCAL, {"to": dm, "body": "a", "client_message_id": "d"}))[0] == 202
    status, body = await app.send(LOCAL, {"to": dm, "body": "b", "client_message_id": "d"})
    assert status == 409 and "stored_fingerprint_prefix" not in body["error"], body
    assert "daemon_fingerprint_prefix" in body["error"]  # the caller's own request's
    assert (await app.send(LOCAL, {"to": "topic:ops", "body": "a",
                                   "client_message_id": "t"}))[0] == 202
    status, body = await app.send(LOCAL, {"to": "topic:ops", "body": "b",
                                          "client_message_id": "t"})
    assert status == 409 and "stored_fingerprint_prefix" in body["error"], body
    assert body["error"]["outbox_id"]
