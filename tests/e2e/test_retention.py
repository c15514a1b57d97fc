"""A send whose outbox row retention removed, retried under the same id: the daemon queues it
afresh, the broker's dedupe answers it duplicate, and the recipient still has it once."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, wait_for
from tidemesh.client import Client
from tidemesh.core.retention import HOUR_MS
from tidemesh.daemon.process.stores import open_outbox
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings

pytestmark = pytest.mark.slow


async def _send(d: RunningDaemon, cid: str, body: str) -> tuple[int, dict[str, Any]]:
    async with d.session() as s, s.post("/v1/send", json={"to": "topic:ops", "body": body},
                                        headers={"Idempotency-Key": cid}) as r:
        return r.status, await r.json()


def _row(d: RunningDaemon, cid: str) -> dict[str, object] | None:
    return next((r for r in d.outbox_rows() if r["client_message_id"] == cid), None)


def _max_age_ms(d: RunningDaemon) -> int:
    conn = sqlite3.connect(d.paths.outbox_db)
    try:
        return int(conn.execute("SELECT value FROM outbox_meta WHERE key = 'max_age_ms'"
                                ).fetchone()[0])
    finally:
        conn.close()


async def _prune_later(db_path: Path, later_ms: int) -> int:
    """Retention on the stopped daemon's real file, with the clock moved ``later_ms`` on."""
    db = await open_outbox(db_path, 8, recover=False)
    try:
        svc = RetentionService(db, None, RetentionSettings(),
                               clock=lambda: time.time() + later_ms / 1000)
        return int((await svc.prune_outbox())["deleted"])
    finally:
        await db.close()


async def test_a_pruned_id_retried_is_answered_duplicate_and_delivered_once(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "ops", "create": True}) as r:
        assert r.status == 200
    assert (await _send(a, "report-7", "nightly report"))[0] == 202
    await wait_for(lambda: (_row(a, "report-7") or {}).get("status") == "done")
    first = _row(a, "report-7")
    assert first is not None
    await wait_for(lambda: _count(b, "report-7"))
    assert a.stop() == 0
    margin = RetentionSettings().outbox_margin_ms
    assert await _prune_later(a.paths.outbox_db, _max_age_ms(a) + margin + HOUR_MS) == 1
    assert _row(a, "report-7") is None
    a = mesh.restart("a")
    await wait_for(lambda: connected(a))
    status, body = await _send(a, "report-7", "nightly report")
    assert status == 202 and body["outbox_id"] != first["id"], "a fresh row, queued"
    await wait_for(lambda: (_row(a, "report-7") or {}).get("status") == "done")
    again = _row(a, "report-7")
    assert again is not None and again["broker_message_id"] == first["broker_message_id"], (
        "the broker answered the retry from its dedupe row")
    await asyncio.sleep(1.0)
    assert await _count(b, "report-7") == 1, "delivered once"


async def _count(d: RunningDaemon, cid: str) -> int:
    return sum(1 for e in await inbox(d) if e["client_message_id"] == cid)



async def test_under_the_floor_a_daemon_refuses_sends_and_keeps_receiving(
        mesh: Mesh, short_tmp: Path, small_fs: Path) -> None:
    floor = 16 << 20
    a = mesh.add("a", short_tmp)
    b = mesh.add("b", small_fs)
    b.stop()
    b = mesh.daemons["b"] = start_daemon(
        b.home, "m", extra_env={"TIDEMESH_DISK_RESERVED_BYTES": str(floor)})
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "ops", "create": True}) as r:
        assert r.status == 200
    free = Client(b.paths.socket).health()["disk"]["free_bytes"]
    (small_fs / "filler").write_bytes(b"\0" * (free - floor + (2 << 20)))
    await asyncio.sleep(0.3)
    assert (await _send(b, "from-b", "refused"))[0] == 507
    for i in range(20):
        assert (await _send(a, f"to-b-{i}", "still arriving"))[0] == 202
    await wait_for(lambda: _all_there(b, 20))
    (small_fs / "filler").unlink()
    await asyncio.sleep(0.3)
    assert (await _send(b, "from-b", "accepted"))[0] == 202


async def _all_there(d: RunningDaemon, n: int) -> bool:
    return sum(1 for e in await inbox(d) if e["client_message_id"].startswith("to-b-")) == n
