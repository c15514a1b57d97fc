"""Queues are competing consumers with leases (DESIGN §5.4): a delivery its consumer does not
ack within the lease goes to another consumer, and the first never stores it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Broker, Mesh, connected, inbox, wait_for


async def _consume(d: RunningDaemon, queue: str) -> None:
    assert run_cli(d.home, "queue", "consume", "--mesh", "m", queue).returncode == 0


async def _ids(d: RunningDaemon) -> list[Any]:
    return [e["client_message_id"] for e in await inbox(d)]


async def test_a_lapsed_lease_moves_the_message_on_sqlite(short_tmp: Path) -> None:
    home = short_tmp / "broker"
    home.mkdir()
    await _lapsed_lease(home, f"sqlite://{home}/broker.db", short_tmp)


@pytest.mark.postgres
async def test_a_lapsed_lease_moves_the_message_on_postgres(
    short_tmp: Path, pg_database: str
) -> None:
    home = short_tmp / "broker"
    home.mkdir()
    await _lapsed_lease(home, pg_database, short_tmp)


async def _lapsed_lease(home: Path, url: str, short_tmp: Path) -> None:
    broker = Broker(home, url, env={"TIDEMESH_QUEUE_LEASE_S": "1",
                                    "TIDEMESH_QUEUE_LEASE_CHECK_INTERVAL_S": "0.3"})
    broker.cli("mesh", "create", "team")
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        sender, c1, c2 = (mesh.add(n, short_tmp) for n in ("s", "c1", "c2"))
        for d in (sender, c1, c2):
            await wait_for(lambda d=d: connected(d))
        await _consume(c1, "jobs")
        await _consume(c2, "jobs")
        assert c1.stop() == 0                      # c1 is away: its leases will lapse
        ids = [f"job{i}" for i in range(20)]
        async with sender.session() as s:
            for cid in ids:
                async with s.post("/v1/send", json={"to": "queue:jobs", "body": cid},
                                  headers={"Idempotency-Key": cid}) as r:
                    assert r.status == 202
        await wait_for(lambda: _count(c2, 20), timeout=60)
        assert sorted(await _ids(c2)) == sorted(ids)
        c1 = mesh.restart("c1")
        await wait_for(lambda: connected(c1))
        await asyncio.sleep(1.5)
        assert await _ids(c1) == [], "reassigned deliveries reach c1 void and are not stored"
        async with sender.session() as s, s.post(
            "/v1/send", json={"to": "queue:jobs", "body": "later"},
            headers={"Idempotency-Key": "later"}) as r:
            assert r.status == 202
        await wait_for(lambda: _total(c1, c2, 21))
        assert sorted(await _ids(c1) + await _ids(c2)) == sorted([*ids, "later"])
    finally:
        mesh.stop()


async def _count(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


async def _total(a: RunningDaemon, b: RunningDaemon, n: int) -> bool:
    return len(await inbox(a)) + len(await inbox(b)) >= n
