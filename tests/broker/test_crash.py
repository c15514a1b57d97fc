"""kill -9 of a real broker process during a burst of accepts leaves no orphans (spec §4.7.3).

Every dedupe row has its message and history rows and vice versa, every delivery row has
its message, and every send that was answered 201 before the kill is in the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from tests.broker.conftest import now_ms
from tidemesh.broker.store import open_store
from tidemesh.daemon.link.websocket import BrokerLink, LinkError

ORPHAN_QUERIES = {
    "dedupe_without_message": """
        SELECT count(*) FROM {s}client_message_dedupe d WHERE d.history_available
        AND NOT EXISTS (SELECT 1 FROM {s}topic_message t WHERE t.id = d.broker_message_id)
        AND NOT EXISTS (SELECT 1 FROM {s}message_queue q WHERE q.id = d.broker_message_id)""",
    "dedupe_without_history": """
        SELECT count(*) FROM {s}client_message_dedupe d WHERE d.history_available
        AND NOT EXISTS (SELECT 1 FROM {s}message_history h
                        WHERE h.broker_message_id = d.broker_message_id)""",
    "message_without_dedupe": """
        SELECT count(*) FROM {s}topic_message t WHERE t.client_message_id IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM {s}client_message_dedupe d
                        WHERE d.broker_message_id = t.id)""",
    "history_without_message": """
        SELECT count(*) FROM {s}message_history h
        WHERE NOT EXISTS (SELECT 1 FROM {s}topic_message t WHERE t.id = h.broker_message_id)
        AND NOT EXISTS (SELECT 1 FROM {s}message_queue q WHERE q.id = h.broker_message_id)""",
    "delivery_without_message": """
        SELECT count(*) FROM {s}delivery_queue d
        WHERE NOT EXISTS (SELECT 1 FROM {s}topic_message t WHERE t.id = d.broker_message_id)
        AND NOT EXISTS (SELECT 1 FROM {s}message_queue q WHERE q.id = d.broker_message_id)""",
}


async def _orphans(url: str) -> dict[str, int]:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            return {k: conn.execute(q.format(s="")).fetchone()[0]
                    for k, q in ORPHAN_QUERIES.items()}
        finally:
            conn.close()
    import asyncpg

    pg = await asyncpg.connect(url)
    try:
        return {k: int(await pg.fetchval(q.format(s="mesh."))) for k, q in ORPHAN_QUERIES.items()}
    finally:
        await pg.close()


async def _committed_ids(url: str) -> set[str]:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            return {r[0] for r in conn.execute("SELECT broker_message_id FROM "
                                               "client_message_dedupe")}
        finally:
            conn.close()
    import asyncpg

    pg = await asyncpg.connect(url)
    try:
        return {r[0] for r in await pg.fetch("SELECT broker_message_id FROM "
                                             "mesh.client_message_dedupe")}
    finally:
        await pg.close()


async def _start_broker(url: str, home: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json",
           "TIDEMESH_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "broker", "up", "--store", url, "--listen",
         "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
    return proc, int(json.loads(line)["port"])


@pytest.mark.slow
async def test_kill_9_during_a_burst_leaves_no_orphans(store_url: str, tmp_path: Path) -> None:
    store = await open_store(store_url)
    mesh = await store.create_mesh("crash", now_ms())
    keys = [SigningKey.generate() for _ in range(3)]
    for k in keys:
        await store.add_member(mesh.id, bytes(k.verify_key).hex(), now_ms())
    await store.create_topic(mesh.id, "ops", None, now_ms())
    for k in keys:
        await store.subscribe(mesh.id, "ops", bytes(k.verify_key).hex(), now_ms())
    await store.close()

    proc, port = await _start_broker(store_url, tmp_path)
    answered: list[str] = []
    try:
        links = [await BrokerLink.connect(f"ws://127.0.0.1:{port}", mesh.id, k) for k in keys]

        async def sender(i: int) -> None:
            n = 0
            while True:
                n += 1
                payload = {"to": {"kind": "topic", "ref": "ops"}, "body": f"{i}-{n}",
                           "body_encoding": "utf8", "priority": "next"}
                try:
                    r = await links[i % 3].send(f"s{i}-{n}", payload)
                except LinkError:
                    return
                if r["status"] == 201:
                    answered.append(r["broker_message_id"])

        tasks = [asyncio.create_task(sender(i)) for i in range(24)]
        async with asyncio.timeout(60):  # a broker that never answers 201 fails, not hangs
            while len(answered) < 300:
                await asyncio.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        for link in links:
            await link.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert await _orphans(store_url) == dict.fromkeys(ORPHAN_QUERIES, 0)
    assert set(answered) <= await _committed_ids(store_url)
