"""The daemon's broker link treats a broken path to the broker as something to retry.

Found by the fault harness: with the broker down behind a TCP proxy, the proxy accepts the
connection and closes it at once, the WebSocket opening handshake fails with
``InvalidMessage``, and the relay stopped for good (the daemon exited 1) instead of retrying.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tidemesh.core.wire import CloseCode
from tidemesh.daemon.link.websocket import BrokerLink, HandshakeRejected, LinkError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _close_at_once(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.close()


async def _answer_502(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await w.drain()
    w.close()


async def _garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.readuntil(b"\r\n\r\n")
    w.write(b"SSH-2.0-OpenSSH_9.0\r\n\r\n")
    await w.drain()
    w.close()


@pytest.fixture(params=[_close_at_once, _answer_502, _garbage],
                ids=["closed", "http_502", "not_http"])
async def broken_broker(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    handler: Handler = request.param
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_failed_opening_handshake_is_a_retryable_link_error(broken_broker: str) -> None:
    with pytest.raises(LinkError) as info:
        await BrokerLink.connect(broken_broker, "mesh", SigningKey.generate(), open_timeout=5)
    # The relay stops for good only on a non-retryable HandshakeRejected.
    assert not isinstance(info.value, HandshakeRejected) or info.value.retryable


async def test_a_connection_lost_between_challenge_and_hello_is_retryable() -> None:
    """Found by the fault harness too: the proxy cut the socket after the broker's challenge,
    ``ws.send(hello)`` raised ``ConnectionClosedError`` past ``BrokerLink.connect``, and the
    relay task stopped (daemon exit 1)."""
    from websockets.asyncio.server import ServerConnection, serve

    async def challenge_then_close(ws: ServerConnection) -> None:
        await ws.send('{"type": "challenge", "nonce": "' + "ab" * 32 + '", "protocol": 1}')
        ws.transport.abort()  # the path to the broker dies right after the challenge

    async with serve(challenge_then_close, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        for _ in range(5):
            with pytest.raises(LinkError) as info:
                await BrokerLink.connect(f"ws://127.0.0.1:{port}", "mesh",
                                         SigningKey.generate(), open_timeout=5)
            assert not isinstance(info.value, HandshakeRejected) or info.value.retryable


async def test_a_connection_dropped_before_the_upgrade_request_is_retryable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the fault harness: a proxy whose upstream is down accepts and resets at once;
    on a busy machine the reset is processed before the upgrade request is written, and
    websockets raises ``ConnectionClosedError`` from ``connect()`` itself, which stopped the
    relay. The test makes the loop that slow on purpose: the handshake starts late."""
    from websockets.asyncio.client import ClientConnection

    original = ClientConnection.handshake

    async def late_handshake(self: ClientConnection, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.05)  # the reset arrives meanwhile
        await original(self, *args, **kwargs)

    monkeypatch.setattr(ClientConnection, "handshake", late_handshake)

    async def reset(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(LinkError):
            await BrokerLink.connect(f"ws://127.0.0.1:{port}", "mesh",
                                     SigningKey.generate(), open_timeout=5)
    finally:
        server.close()
        await server.wait_closed()


async def test_presence_that_arrives_during_the_handshake_does_not_fail_it(
    tmp_path: Path,
) -> None:
    """Found by a long stall in the fault harness: when all daemons reconnect at once, the
    broker may announce one member's ``peer_join`` to another that has its ``hello_ack`` but
    not yet its ``feature_negotiation_response``; the link refused the unexpected frame
    ("expected feature_negotiation_response, got peer_join") and the reconnect failed."""
    from websockets.asyncio.server import ServerConnection, serve

    from tests.broker.test_server import _start

    real, real_server = await _start(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        async with await real.link(real.alice) as probe:
            supported = probe.supported
    finally:
        await real_server.stop()
        await real.store.close()
    ulid = "01" + "A" * 24

    async def broker_with_news(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "challenge", "nonce": "ab" * 32, "protocol": 1}))
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "hello_ack", "mesh_id": ulid, "mesh_name": "team",
                                  "pubkey": hello["pubkey"], "session_id": ulid}))
        await ws.send(json.dumps({"type": "peer_join", "mesh_id": ulid, "pubkey": "cd" * 32,
                                  "at": 1}))
        request = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "feature_negotiation_response", "id": request["id"],
                                  "supported": supported, "missing_required": []}))
        await ws.wait_closed()

    async with serve(broker_with_news, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        link = await BrokerLink.connect(f"ws://127.0.0.1:{port}", ulid, SigningKey.generate(),
                                        open_timeout=5)
        await link.close()


async def test_a_hello_timeout_is_retryable() -> None:
    """Found by a long stall in the fault harness: the stall held the daemon's hello past the
    broker's auth.hello_timeout_s, the broker closed with 1008 "hello_timeout", and the
    daemon took that policy close for a permanent refusal and exited."""
    from websockets.asyncio.server import ServerConnection, serve

    async def slow_hello(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "challenge", "nonce": "ab" * 32, "protocol": 1}))
        await ws.recv()  # the hello arrived, but (held by the stall) after the deadline
        await ws.close(1008, "hello_timeout")

    async with serve(slow_hello, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        with pytest.raises(HandshakeRejected) as info:
            await BrokerLink.connect(f"ws://127.0.0.1:{port}", "mesh", SigningKey.generate(),
                                     open_timeout=5)
    assert info.value.reason == "hello_timeout"
    assert info.value.retryable, "a slow hello is a network problem, not a refusal"


def test_a_session_taken_over_by_another_broker_is_retryable() -> None:
    """4011: the member connected to another broker on the same database; the daemon whose
    session it was reconnects instead of exiting (docs/broker.md, "Several brokers")."""
    assert HandshakeRejected(CloseCode.TAKEN_OVER, "session_taken_over").retryable
