"""A delivery pump whose store goes away keeps its connection: a real broker on port 0
over a real PostgreSQL store that stops taking connections for a while."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from nacl.signing import SigningKey

from tests.broker.conftest import LIMITS, now_ms
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_store
from tidemesh.daemon.link.websocket import BrokerLink

pytestmark = pytest.mark.postgres


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


async def _admin(dsn: str, sql: str, *args: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def test_a_pump_rides_out_a_database_that_refuses_connections(
    pg_dsn: str, pg_database: str
) -> None:
    name = pg_database.rsplit("/", 1)[1]
    store = await open_store(pg_database)
    service = BrokerService(store, LIMITS)
    server = await BrokerServer(service).start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}"
    mesh = await store.create_mesh("team", now_ms())
    alice, bob = SigningKey.generate(), SigningKey.generate()
    for k in (alice, bob):
        await store.add_member(mesh.id, pub(k), now_ms())
    await store.create_topic(mesh.id, "ops", None, now_ms())
    await store.subscribe(mesh.id, "ops", pub(bob), now_ms())
    try:
        async with await BrokerLink.connect(url, mesh.id, bob) as link:
            await link.resume(0, 0)
            # The database stops taking connections, as while PostgreSQL restarts, and bob's
            # pump is woken: its read fails.
            await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await _admin(pg_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                 " WHERE datname = $1", name)
            service.connections.wake([(mesh.id, pub(bob))])
            async with asyncio.timeout(10):
                while not service.metrics.registry.get_sample_value(
                        "cm_broker_background_errors_total",
                        {"task": "pump", "kind": "transient"}):
                    await asyncio.sleep(0.05)
            await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            async with await BrokerLink.connect(url, mesh.id, alice) as sender:
                result = await sender.send("c1", {
                    "to": {"kind": "topic", "ref": "ops"}, "body": "after the outage",
                    "body_encoding": "utf8", "priority": "next", "meta": None,
                    "reply_to": None})
                assert result["status"] == 201
            got = await asyncio.wait_for(link.deliveries.get(), 10)
            assert [d["body"] for d in got] == ["after the outage"]
            assert not link.closed
    finally:
        await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await server.stop()
        await store.close()
