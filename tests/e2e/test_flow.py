"""The whole job: a broker, two daemons joined by invite, a topic message and a DM."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from tests.e2e.harness import Mesh, inbox, pubkey, two_on_topic, wait_for


async def test_topic_message_and_dm_arrive_once(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    async with a.session() as s:
        async with s.post("/v1/send", json={"to": "topic:ops", "body": "deploy done"},
                          headers={"Idempotency-Key": "t-1"}) as r:
            assert r.status == 202
        async with s.post("/v1/send", json={"to": f"dm:{pubkey(b)}", "body": "secret plan"},
                          headers={"Idempotency-Key": "dm-1"}) as r:
            assert r.status == 202
        for _ in range(3):  # retries of the same sends change nothing
            async with s.post("/v1/send", json={"to": "topic:ops", "body": "deploy done"},
                              headers={"Idempotency-Key": "t-1"}) as r:
                assert r.status in (200, 202)
    await wait_for(lambda: _count(inbox(b), 2))
    entries = await inbox(b)
    assert sorted(e["body"] for e in entries) == ["deploy done", "secret plan"]
    assert {e["client_message_id"] for e in entries} == {"t-1", "dm-1"}
    assert all(e["from"] == pubkey(a) for e in entries)
    await wait_for(lambda: _all_done(a))
    # The broker holds the DM sealed: its body is not the plaintext.
    store = mesh.broker.home / "broker.db"
    conn = sqlite3.connect(store)
    bodies = [bytes(r[0]) for r in conn.execute("SELECT body FROM message_queue")]
    conn.close()
    assert bodies and all(b"secret plan" not in body for body in bodies)
    await asyncio.sleep(0.5)
    assert len(await inbox(b)) == 2, "nothing arrives twice"
    a_metrics, b_metrics = a.client.metrics(), b.client.metrics()
    assert 'cm_daemon_send_total{kind="topic",mesh="m",status="done"} 1.0' in a_metrics
    assert 'cm_daemon_send_total{kind="dm",mesh="m",status="done"} 1.0' in a_metrics
    assert 'cm_daemon_outbox_depth{mesh="m",status="done"} 2.0' in a_metrics
    assert 'cm_daemon_recv_total{from_type="peer",kind="topic",mesh="m"} 1.0' in b_metrics
    assert 'cm_daemon_recv_total{from_type="peer",kind="dm",mesh="m"} 1.0' in b_metrics
    assert 'cm_daemon_connected{mesh="m"} 1.0' in b_metrics
    assert a.client.health()["lag_ms"] == 0


async def _count(items: object, n: int) -> bool:
    return len(await items) >= n  # type: ignore[misc,arg-type]


async def _all_done(d: object) -> bool:
    rows = d.outbox_rows()  # type: ignore[attr-defined]
    return bool(rows) and {r["status"] for r in rows} == {"done"}
