"""A few hundred members storm in and out of one real broker, round after round, leaving
by every exit (close, reset, a hello never sent, a cut in the middle of the handshake, the
broker's own stop): nothing leaks, nobody haunts (issue #30.3), and every handshake of a
storm succeeds the first time (issue #30.2)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import LIMITS, now_ms
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_cluster, open_store
from tidemesh.core import handshake
from tidemesh.core.wire import decode, encode
from tidemesh.daemon.link.websocket import BrokerLink

STAYERS = 20        # connected through every round
STORM = 200         # connect at once each round, then leave
CUT = 20            # send a hello and reset at once, each round
SQUATTERS = 10      # never say hello, each round
ROUNDS = 3
# The squatters' wait; long enough for a loaded machine to answer a challenge in time.
HELLO_TIMEOUT_S = 3.0


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


async def session_rows(url: str) -> int | None:
    """Members with a session row; None on SQLite (one broker: no session table)."""
    if url.startswith("sqlite"):
        return None
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM mesh.member_session"))
    finally:
        await conn.close()


async def cut_after_hello(url: str, mesh_id: str, key: SigningKey) -> None:
    ws = await connect(url)
    nonce = decode(await ws.recv())["nonce"]
    pk, sig = handshake.sign(key, mesh_id, nonce)
    await ws.send(encode({"type": "hello", "mesh_id": mesh_id, "pubkey": pk, "nonce": nonce,
                          "signature": sig}))
    ws.transport.abort()


async def closed_reason(ws: ClientConnection) -> str | None:
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(30):
            async for _ in ws:
                pass
    return ws.close_reason


async def test_storms_in_and_out_leave_nothing_registered_and_nobody_present(
    store_url: str,
) -> None:
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS, cluster=open_cluster(store, "storm"))
    await service.peering.heartbeat()
    server = await BrokerServer(service, hello_timeout_s=HELLO_TIMEOUT_S,
                                handshake_concurrency=8).start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}"
    mesh = await store.create_mesh("storm", now_ms())
    keys = [SigningKey.generate() for _ in range(STAYERS + STORM + CUT + 1)]
    for k in keys:
        await store.add_member(mesh.id, pub(k), now_ms())
    stayers, storm = keys[:STAYERS], keys[STAYERS:STAYERS + STORM]
    cut, fresh = keys[STAYERS + STORM:-1], keys[-1]

    def active() -> float:
        return sum(v for _, v in service.connections.active())

    async def settled(open_conns: int, members: int) -> None:
        async with asyncio.timeout(20):
            while (active() != open_conns
                   or (await session_rows(store_url)) not in (None, members)):
                await asyncio.sleep(0.05)

    async def join(key: SigningKey) -> BrokerLink:
        # open_timeout as long as a member would wait: a refusal or a hello_timeout
        # raises, so gather fails unless every handshake succeeds the first time.
        return await BrokerLink.connect(url, mesh.id, key, open_timeout=60)

    async def beating() -> None:
        # The heartbeat, as fast as it goes, and each beat late enough to put every live
        # session row back (the path that once resurrected sessions ending meanwhile).
        service.peering.expiry_ms = 1
        while True:
            await service.peering.heartbeat()
            await asyncio.sleep(0.02)

    kept: list[BrokerLink] = []
    heart = asyncio.create_task(beating())
    try:
        kept = list(await asyncio.gather(*(join(k) for k in stayers)))
        for _ in range(ROUNDS):
            squatters = [await connect(url) for _ in range(SQUATTERS)]
            links: list[Any] = await asyncio.gather(
                *(join(k) for k in storm), *(cut_after_hello(url, mesh.id, k) for k in cut))
            links = links[:STORM]
            await settled(STAYERS + STORM, STAYERS + STORM)
            # Out: half close, half reset; the squatters are closed by the hello clock.
            await asyncio.gather(*(link.close() for link in links[::2]))
            for link in links[1::2]:
                link.ws.transport.abort()
            assert {await closed_reason(ws) for ws in squatters} == {"hello_timeout"}
            await settled(STAYERS, STAYERS)
            await asyncio.gather(*(link.close() for link in links[1::2]),
                                 return_exceptions=True)

        async with await join(fresh) as newcomer:
            peers = {p["pubkey"] for p in await newcomer.peers()}
        assert peers == {pub(k) for k in (*stayers, fresh)}
        await settled(STAYERS, STAYERS)
    finally:
        heart.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heart
        await server.stop()
        for link in kept:
            await link.close()
    # The broker's own stop is an exit too.
    assert active() == 0
    assert (await session_rows(store_url)) in (None, 0)
    await store.close()


async def waiting_on_locks(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"))
    finally:
        await conn.close()


async def until_waiting(url: str, n: int) -> None:
    async with asyncio.timeout(10):
        while await waiting_on_locks(url) < n:
            await asyncio.sleep(0.02)


@pytest.mark.postgres
async def test_waiting_for_a_handshake_slot_is_not_on_the_hello_clock(
    pg_database: str,
) -> None:
    """One handshake slot; the session table is held by one transaction, then by a second
    queued behind it (HOLD_S each). The first member's claim waits out the first hold, every
    later one the second: together longer than the hello clock, each in turn within it
    once admitted. Before the admission all of them were on the clock from their hello."""
    hold_s, members = 0.8, 6
    store = await open_store(pg_database)
    service = BrokerService(store, LIMITS, cluster=open_cluster(store, "slot"))
    await service.peering.heartbeat()
    server = await BrokerServer(service, hello_timeout_s=1.2,
                                handshake_concurrency=1).start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}"
    mesh = await store.create_mesh("slot", now_ms())
    keys = [SigningKey.generate() for _ in range(members)]
    for k in keys:
        await store.add_member(mesh.id, pub(k), now_ms())
    first, second = await asyncpg.connect(pg_database), await asyncpg.connect(pg_database)
    links: list[BrokerLink] = []
    try:
        tx = first.transaction()
        await tx.start()
        await first.execute("LOCK TABLE mesh.member_session IN ACCESS EXCLUSIVE MODE")
        head = asyncio.create_task(BrokerLink.connect(url, mesh.id, keys[0], open_timeout=30))
        await until_waiting(pg_database, 1)
        tx2 = second.transaction()
        await tx2.start()
        relock = asyncio.create_task(
            second.execute("LOCK TABLE mesh.member_session IN ACCESS EXCLUSIVE MODE"))
        await until_waiting(pg_database, 2)
        rest = [asyncio.create_task(BrokerLink.connect(url, mesh.id, k, open_timeout=30))
                for k in keys[1:]]
        await asyncio.sleep(hold_s)
        await tx.commit()
        await relock
        await asyncio.sleep(hold_s)
        await tx2.commit()
        links = list(await asyncio.gather(head, *rest))
        assert len(links) == members
    finally:
        for link in links:
            await link.close()
        await first.close()
        await second.close()
        await server.stop()
        await store.close()
