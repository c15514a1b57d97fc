"""Crashes and restarts of real processes lose nothing and deliver nothing twice."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.e2e.harness import Broker, Mesh, connected, inbox, wait_for

pytestmark = pytest.mark.slow


async def _send_many(d: object, n: int, prefix: str, topic: str = "load",
                     concurrency: int = 32) -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    sem = asyncio.Semaphore(concurrency)

    async with d.session() as s:  # type: ignore[attr-defined]
        async def one(cid: str) -> None:
            async with sem, s.post("/v1/send", json={"to": f"topic:{topic}", "body": cid},
                                   headers={"Idempotency-Key": cid}) as r:
                assert r.status == 202, await r.text()

        await asyncio.gather(*(one(c) for c in ids))
    return ids


async def _setup(mesh: Mesh, root: Path) -> tuple[object, object]:
    a, b = mesh.add("a", root), mesh.add("b", root)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "load", "create": True}) as r:
        assert r.status == 200
    return a, b


def _exactly_once_in_order(entries: list[dict[str, object]], ids: list[str]) -> None:
    got = [e["client_message_id"] for e in entries]
    assert len(got) == len(set(got)), "a message was stored twice"
    assert sorted(got) == sorted(ids), f"missing {sorted(set(ids) - set(got))[:5]}"
    seqs = [(e["delivery"]["epoch"], e["delivery"]["seq"]) for e in entries]  # type: ignore[index]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "inbox not in broker order"
    local = [e["seq"] for e in entries]
    assert local == list(range(local[0], local[0] + len(local))), "local seq has gaps"  # type: ignore[operator]


async def test_receiver_kill_9_at_random_moments_stores_each_once(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = await _setup(mesh, short_tmp)
    rng = random.Random(7)
    sending = asyncio.create_task(_send_many(a, 1000, "k"))

    async def chaos() -> int:
        kills = 0
        while not sending.done() or kills < 3:
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            mesh.daemons["b"].kill()
            kills += 1
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            await asyncio.to_thread(mesh.restart, "b")
        return kills

    ids, kills = await asyncio.gather(sending, chaos())
    assert kills >= 3
    b = mesh.daemons["b"]
    await wait_for(lambda: _has(b, 1000), timeout=120)
    _exactly_once_in_order(await inbox(b), ids)


async def _has(d: object, n: int) -> bool:
    return len(await inbox(d)) >= n  # type: ignore[arg-type]


async def _broker_restart_mid_stream(mesh: Mesh, root: Path) -> None:
    a, b = await _setup(mesh, root)
    sending = asyncio.create_task(_send_many(a, 600, "r"))
    await wait_for(lambda: _has(b, 100), timeout=60)
    mesh.broker.kill()
    await asyncio.sleep(0.5)
    await asyncio.to_thread(mesh.broker.start)
    ids = await sending
    await wait_for(lambda: _has(b, 600), timeout=120)
    _exactly_once_in_order(await inbox(b), ids)
    await wait_for(lambda: {r["status"] for r in a.outbox_rows()} == {"done"}, timeout=60)  # type: ignore[attr-defined]


async def test_broker_kill_9_and_restart_on_sqlite(mesh: Mesh, short_tmp: Path) -> None:
    await _broker_restart_mid_stream(mesh, short_tmp)


@pytest.mark.postgres
async def test_broker_kill_9_and_restart_on_postgres(pg_database: str, short_tmp: Path) -> None:
    home = short_tmp / "pgbroker"
    home.mkdir()
    broker = Broker(home, pg_database)
    broker.cli("mesh", "create", "team")
    broker.start()
    m = Mesh(broker, "team")
    try:
        await _broker_restart_mid_stream(m, short_tmp)
    finally:
        m.stop()
