"""A resume over the daemon's broker link, against a scripted broker on a real socket.

What the broker pushed before it read the resume it sends again after answering, so the link
drops that and keeps, in order, what came after the answer. Found by CI: the receiver
dropped deliveries itself while it waited, and one that arrived with the answer was dropped
too; a lone DM waiting for a restarted daemon was never stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from nacl.signing import SigningKey
from structlog.testing import capture_logs
from websockets.asyncio.server import ServerConnection, serve

from tidemesh.core import features
from tidemesh.daemon.link.websocket import BrokerLink

ULID = "01" + "A" * 24
Script = Callable[[ServerConnection, dict[str, Any]], Awaitable[None]]


def deliver(seq: int) -> str:
    return json.dumps({"type": "deliver", "broker_message_id": f"01{seq:024d}",
                       "sender_pubkey": "cd" * 32, "to": {"kind": "topic", "ref": "ops"},
                       "body": f"m{seq}", "body_encoding": "utf8", "priority": "next",
                       "epoch": 1, "seq": seq, "created_at": 1})


def resume_ack(frame: dict[str, Any]) -> str:
    return json.dumps({"type": "resume_ack", "id": frame["id"], "result": "OK", "epoch": 1,
                       "last_seq": frame["last_seq"], "broker_last_seq": 9,
                       "compacted_seq": 0})


@asynccontextmanager
async def linked(script: Script, delivery_buffer: int = 1024,
                 link_class: type[BrokerLink] = BrokerLink,
                 supported: dict[str, Any] | None = None) -> AsyncIterator[BrokerLink]:
    """A link to a broker that shakes hands and then runs ``script`` with the resume frame
    once the daemon sends it."""
    async def broker(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "challenge", "nonce": "ab" * 32, "protocol": 1}))
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "hello_ack", "mesh_id": ULID, "mesh_name": "team",
                                  "pubkey": hello["pubkey"], "session_id": ULID}))
        request = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "feature_negotiation_response", "id": request["id"],
                                  "supported": supported or features.advertise(
                                      "retention_scoped", 7, 4096),
                                  "missing_required": []}))
        await script(ws, {})
        await ws.wait_closed()

    async with serve(broker, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        link = await link_class.connect(f"ws://127.0.0.1:{port}", ULID, SigningKey.generate(),
                                        open_timeout=5, delivery_buffer=delivery_buffer)
        try:
            yield link
        finally:
            await link.close()


def seqs(link: BrokerLink) -> list[int]:
    out = []
    while not link.deliveries.empty():
        out.extend(d["seq"] for d in link.deliveries.get_nowait())
    return out


async def test_a_delivery_sent_right_after_the_answer_is_kept() -> None:
    async def answer_then_deliver(ws: ServerConnection, _: dict[str, Any]) -> None:
        frame = json.loads(await ws.recv())
        # Back to back: the answer and the delivery reach the daemon's reader together.
        await ws.send(resume_ack(frame))
        await ws.send(deliver(1))

    async with linked(answer_then_deliver) as link:
        answer = await asyncio.wait_for(link.resume(0, 0), 5)
        assert answer["result"] == "OK"
        await asyncio.sleep(0.1)
        assert seqs(link) == [1]


async def test_pushes_before_the_answer_are_dropped_and_a_full_queue_does_not_block_it(
        ) -> None:
    """The broker pushed more than the daemon's queue holds before it read the resume: the
    reader, blocked on the full queue, must still reach the answer."""
    pushed = asyncio.Event()

    async def flood_then_answer(ws: ServerConnection, _: dict[str, Any]) -> None:
        for seq in range(1, 9):
            await ws.send(deliver(seq))
        pushed.set()
        frame = json.loads(await ws.recv())
        await ws.send(resume_ack(frame))
        for seq in range(frame["last_seq"] + 1, 10):   # everything after the cursor again
            await ws.send(deliver(seq))

    async with linked(flood_then_answer, delivery_buffer=2) as link:
        await asyncio.wait_for(pushed.wait(), 5)
        await asyncio.sleep(0.2)   # the reader fills the queue and waits on it
        assert link.deliveries.full()
        answer = await asyncio.wait_for(link.resume(1, 3), 5)
        assert answer["last_seq"] == 3
        got: list[int] = []
        while len(got) < 6:
            got.extend(d["seq"] for d in await asyncio.wait_for(link.deliveries.get(), 5))
        assert got == [4, 5, 6, 7, 8, 9]


async def test_an_optional_feature_with_unusable_params_is_logged_and_left_out() -> None:
    async def idle(ws: ServerConnection, _: dict[str, Any]) -> None:
        await asyncio.sleep(0)

    odd = {**features.advertise("retention_scoped", 7, 4096),
           features.DELIVER_BATCH: {"params": {"version": 99}}}
    with capture_logs() as logs:
        async with linked(idle, supported=odd) as link:
            assert features.DELIVER_BATCH not in link.negotiated
            assert set(features.REQUIRED) <= set(link.negotiated)
    names = [e["event"] for e in logs]
    assert "feature_optional_param_invalid" in names and "features_negotiated" in names
