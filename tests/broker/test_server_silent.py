"""Members gone silent, against a real broker on port 0: the broker sends no keepalive pings
of its own, so a member whose host went away without a word is found by what it stopped
saying (its own pings included), closed 4015, and leaves nothing registered."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import LIMITS, now_ms, say_hello
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_store
from tidemesh.core.wire import CloseCode
from tidemesh.daemon.link.websocket import BrokerLink

IDLE_S = 0.5


async def _member(url: str, mesh_id: str, key: SigningKey,
                  ping_interval: float | None) -> ClientConnection:
    ws = await connect(url, ping_interval=ping_interval, ping_timeout=None)
    await say_hello(ws, mesh_id, key)
    return ws


async def test_a_silent_member_is_closed_4015_and_one_that_pings_stays(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'b.db'}")
    service = BrokerService(store, LIMITS)
    server = await BrokerServer(service, idle_timeout_s=IDLE_S).start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}"
    mesh = await store.create_mesh("team", now_ms())
    quiet_key, pinging_key = SigningKey.generate(), SigningKey.generate()
    for k in (quiet_key, pinging_key):
        await store.add_member(mesh.id, bytes(k.verify_key).hex(), now_ms())
    try:
        quiet = await _member(url, mesh.id, quiet_key, ping_interval=None)
        pinging = await _member(url, mesh.id, pinging_key, ping_interval=IDLE_S / 5)
        assert await server.close_silent() == 0   # both spoke just now

        await asyncio.sleep(IDLE_S * 2)
        assert await server.close_silent() == 1

        try:   # the quiet one hears why (presence about the other may come first)
            async with asyncio.timeout(5):
                while True:
                    await quiet.recv()
        except ConnectionClosed:
            pass
        assert quiet.close_code == CloseCode.SILENT
        async with asyncio.timeout(5):
            while service.connections.count != 1:
                await asyncio.sleep(0.02)
        assert pinging.state.name == "OPEN"
        assert service.metrics.registry.get_sample_value(
            "cm_broker_silent_connections_closed_total") == 1
        assert await server.close_silent() == 0   # its pings keep it heard
        await pinging.close()
    finally:
        await server.stop()
        await store.close()


async def test_an_idle_daemon_link_keeps_itself_heard(tmp_path: Path) -> None:
    """The daemon's link says nothing when there is nothing to say but its keepalive pings:
    those alone keep it open past the broker's idle timeout (the link's own interval scaled
    down with the broker's, as 20 s is to 60 s)."""
    store = await open_store(f"sqlite:///{tmp_path / 'b.db'}")
    service = BrokerService(store, LIMITS)
    server = await BrokerServer(service, idle_timeout_s=IDLE_S * 3).start("127.0.0.1", 0)
    mesh = await store.create_mesh("team", now_ms())
    key = SigningKey.generate()
    await store.add_member(mesh.id, bytes(key.verify_key).hex(), now_ms())
    try:
        async with await BrokerLink.connect(f"ws://127.0.0.1:{server.port}", mesh.id, key,
                                            keepalive_s=IDLE_S) as link:
            for _ in range(6):
                await asyncio.sleep(IDLE_S)
                assert await server.close_silent() == 0
            await link.request("topic_create", "still-here")
            assert service.connections.count == 1
    finally:
        await server.stop()
        await store.close()
