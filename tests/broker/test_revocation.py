"""A revoked member's connections close without a query per member: at the revocation's
commit on PostgreSQL (NOTIFY, from whichever process revoked), and on SQLite at the next
recheck, which is one statement for all members."""

from __future__ import annotations

import asyncio
import contextlib

from nacl.signing import SigningKey

from tests.broker.conftest import LIMITS, now_ms
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_cluster, open_store
from tidemesh.daemon.link.websocket import BrokerLink


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


async def test_a_revocation_by_another_process_closes_the_members_connections(
    store_url: str,
) -> None:
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS, cluster=open_cluster(store, "rv"))
    await service.peering.heartbeat()
    listening = asyncio.create_task(service.peering.run())
    server = await BrokerServer(service).start("127.0.0.1", 0)
    mesh = await store.create_mesh("team", now_ms())
    alice, bob = SigningKey.generate(), SigningKey.generate()
    for k in (alice, bob):
        await store.add_member(mesh.id, pub(k), now_ms())
    url = f"ws://127.0.0.1:{server.port}"
    try:
        a = await BrokerLink.connect(url, mesh.id, alice)
        b = await BrokerLink.connect(url, mesh.id, bob)
        await asyncio.sleep(0.3)   # the LISTEN connection is up
        other = await open_store(store_url)   # the CLI's `member revoke`
        try:
            assert await other.revoke_member(mesh.id, pub(bob), now_ms())
        finally:
            await other.close()
        if store_url.startswith("sqlite"):
            await service.recheck_members()
        async with asyncio.timeout(10):
            await b.wait_closed()
        assert (b.ws.close_code, b.ws.close_reason) == (4002, "member_revoked")
        assert not a.closed
        await service.recheck_members()   # looked at again: alice stays
        assert not a.closed
        await a.close()
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        await server.stop()
        await store.close()
