"""Every way a connection can end leaves nothing registered: a real broker on port 0 over a
real PostgreSQL store (so that members' sessions are rows, as with several brokers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import LIMITS, now_ms, say_hello
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_cluster, open_store
from tidemesh.broker.store.base import Store
from tidemesh.core.wire import decode
from tidemesh.daemon.link.websocket import BrokerLink

pytestmark = pytest.mark.postgres
HELLO_TIMEOUT_S = 0.5


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


@dataclass
class Broker:
    url: str
    dsn: str
    store: Store
    service: BrokerService
    mesh_id: str
    alice: SigningKey
    carol: SigningKey

    def active(self) -> float:
        return sum(v for _, v in self.service.connections.active())


@pytest.fixture
async def broker(pg_database: str) -> AsyncIterator[Broker]:
    store = await open_store(pg_database)
    service = BrokerService(store, LIMITS, cluster=open_cluster(store, "x"))
    await service.peering.heartbeat()
    server = await BrokerServer(service, hello_timeout_s=HELLO_TIMEOUT_S).start("127.0.0.1", 0)
    mesh = await store.create_mesh("team", now_ms())
    alice, carol = SigningKey.generate(), SigningKey.generate()
    for k in (alice, carol):
        await store.add_member(mesh.id, pub(k), now_ms())
    try:
        yield Broker(f"ws://127.0.0.1:{server.port}", pg_database, store, service, mesh.id,
                     alice, carol)
    finally:
        await server.stop()
        await store.close()


async def session_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM mesh.member_session"))
    finally:
        await conn.close()


async def hello(b: Broker, ws: ClientConnection) -> None:
    await say_hello(ws, b.mesh_id, b.alice, acked=False)


async def cut_before_hello(b: Broker) -> None:
    ws = await connect(b.url)
    await ws.recv()
    ws.transport.abort()


async def cut_right_after_hello(b: Broker) -> None:
    ws = await connect(b.url)
    await hello(b, ws)
    ws.transport.abort()


async def cut_after_hello_ack(b: Broker) -> None:
    ws = await connect(b.url)
    await hello(b, ws)
    assert decode(await ws.recv())["type"] == "hello_ack"
    ws.transport.abort()


async def timed_out_while_claiming_the_session(b: Broker) -> None:
    """The hello deadline passes while the session row is being claimed (another
    transaction holds the table): the member was registered by then."""
    locker = await asyncpg.connect(b.dsn)
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE mesh.member_session IN ACCESS EXCLUSIVE MODE")
        async with connect(b.url) as ws:
            await hello(b, ws)
            with contextlib.suppress(ConnectionClosed):
                async with asyncio.timeout(10):
                    async for _ in ws:
                        pass
            assert (ws.close_code, ws.close_reason) == (1008, "hello_timeout")
        await tx.rollback()
    finally:
        await locker.close()


async def closed_by_the_daemon(b: Broker) -> None:
    link = await BrokerLink.connect(b.url, b.mesh_id, b.alice)
    await link.close()


CUTS: list[Callable[[Broker], Awaitable[None]]] = [
    cut_before_hello, cut_right_after_hello, cut_after_hello_ack,
    timed_out_while_claiming_the_session, closed_by_the_daemon]


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: c.__name__)
async def test_a_connection_cut_at_any_step_leaves_nothing_registered(
    broker: Broker, cut: Callable[[Broker], Awaitable[None]]
) -> None:
    await cut(broker)
    async with asyncio.timeout(10):
        while broker.active() or await session_rows(broker.dsn):
            await asyncio.sleep(0.05)
    async with await BrokerLink.connect(broker.url, broker.mesh_id, broker.carol) as carol:
        peers: list[dict[str, Any]] = await carol.peers()
    assert [p["pubkey"] for p in peers] == [pub(broker.carol)]
