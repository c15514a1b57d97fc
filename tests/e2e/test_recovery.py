"""Operator-visible recovery, end to end: dead rows and requeue, resync after the broker or the
inbox was restored from a backup, resumable events across a daemon restart, DM secrecy."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Broker, Mesh, connected, inbox, pubkey, wait_for
from tidemesh.client import Client
from tidemesh.core.sealing import UnsealError, unseal
from tidemesh.daemon.link.websocket import BrokerLink
from tidemesh.daemon.membership.identity import load_or_create_keypair
from tidemesh.daemon.membership.join import MeshConfig

pytestmark = pytest.mark.slow


async def _subscribe(d: RunningDaemon, topic: str = "load") -> None:
    async with d.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": topic, "create": True}) as r:
        assert r.status == 200, await r.text()


async def _send(d: RunningDaemon, cid: str, body: str = "x", to: str = "topic:load") -> int:
    async with d.session() as s, s.post("/v1/send", json={"to": to, "body": body},
                                        headers={"Idempotency-Key": cid}) as r:
        return r.status


def _events(d: RunningDaemon, since: int = 0) -> list[Any]:
    return list(Client(d.paths.socket).events(since=since, idle_timeout=0.5))


async def _pair(mesh: Mesh, root: Path) -> tuple[RunningDaemon, RunningDaemon]:
    a, b = mesh.add("a", root), mesh.add("b", root)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    await _subscribe(b)
    return a, b


def _row(d: RunningDaemon, cid: str) -> dict[str, Any]:
    return next(r for r in d.outbox_rows() if r["client_message_id"] == cid)


async def test_409_4xx_and_max_age_end_dead_raise_events_and_requeue_once(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = await _pair(mesh, short_tmp)
    # 409: the same member already used "clash" at the broker with another body.
    cfg = MeshConfig.load(a.paths.mesh_file)
    key, _ = load_or_create_keypair(a.paths.keypair)
    async with await BrokerLink.connect(cfg.broker_url, cfg.mesh_id, key.signing_key) as link:
        first = await link.send("clash", {"to": {"kind": "topic", "ref": "load"}, "body": "v1",
                                          "body_encoding": "utf8", "priority": "next",
                                          "meta": None, "reply_to": None})
        assert first["status"] == 201
    assert await _send(a, "clash", "v2") == 202
    # 4xx: a topic that does not exist (a B2 failure at the broker).
    assert await _send(a, "nowhere", to="topic:no-such-topic") == 202
    await wait_for(lambda: _row(a, "clash")["status"] == "dead")
    await wait_for(lambda: _row(a, "nowhere")["status"] == "dead")
    assert "idempotency_key_reused" in _row(a, "clash")["last_error"]
    # Max age: a row that waited too long while the broker was away.
    mesh.broker.stop()
    await wait_for(lambda: _not(connected(a)))
    assert await _send(a, "stale-row", "late") == 202
    a.sql("UPDATE outbox SET enqueued_at = enqueued_at - 400 * 86400000"
          " WHERE client_message_id = 'stale-row'")
    await asyncio.to_thread(mesh.broker.start)
    await wait_for(lambda: _row(a, "stale-row")["status"] == "dead")
    assert _row(a, "stale-row")["last_error"].startswith("max_age_exceeded")

    failed = run_cli(a.home, "daemon", "outbox", "list", "--mesh", "m", "--failed", "--json")
    dead = {r["client_message_id"]: r["id"] for r in json.loads(failed.stdout)["items"]}
    assert set(dead) == {"clash", "nowhere", "stale-row"}
    dead_events = [e for e in _events(a) if e.type == "outbox_dead"]
    assert sorted(e.data["client_message_id"] for e in dead_events) == sorted(dead)

    patch = short_tmp / "fixed.json"
    patch.write_text(json.dumps({"to": "topic:load", "body": "rerouted"}))
    for cid, extra in (("clash", ()), ("stale-row", ()),
                       ("nowhere", ("--patch-payload", str(patch)))):
        res = run_cli(a.home, "daemon", "outbox", "requeue", dead[cid], "--mesh", "m", *extra)
        assert res.returncode == 0, res.stderr
    await wait_for(lambda: _bodies(b, 4))
    bodies = sorted(e["body"] for e in await inbox(b))
    assert bodies == ["late", "rerouted", "v1", "v2"]
    await asyncio.sleep(0.5)
    assert len(await inbox(b)) == 4, "each requeued row is delivered once"


async def _bodies(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


async def _not(aw: Any) -> bool:
    return not await aw


async def test_sse_client_resumes_across_a_daemon_restart(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await _pair(mesh, short_tmp)
    for i in range(5):
        assert await _send(a, f"e{i}", f"m{i}") == 202
    await wait_for(lambda: _bodies(b, 5))
    seen = _events(b)
    last = seen[-1].id
    assert b.stop() == 0
    for i in range(5, 10):
        assert await _send(a, f"e{i}", f"m{i}") == 202
    b = mesh.restart("b")
    await wait_for(lambda: _bodies(b, 10))
    missed = _events(b, since=last)
    assert [e.id for e in missed] == list(range(last + 1, last + 1 + len(missed)))
    got = [e.data["body"] for e in missed if e.type == "message"]
    assert got == [f"m{i}" for i in range(5, 10)] or sorted(got) == [f"m{i}" for i in range(5, 10)]
    assert not {e.id for e in missed} & {e.id for e in seen}


async def test_invalid_sequence_after_broker_restored_from_backup(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = await _pair(mesh, short_tmp)
    broker = mesh.broker
    broker.stop()
    backup = short_tmp / "broker-backup"
    shutil.copytree(broker.home, backup, ignore=shutil.ignore_patterns("*.out"))
    await asyncio.to_thread(broker.start)
    for i in range(5):
        assert await _send(a, f"before{i}", f"before{i}") == 202
    await wait_for(lambda: _bodies(b, 5))
    broker.stop()
    for f in backup.iterdir():
        if f.is_file():  # the broker's own folder holds running.json, not data
            shutil.copy2(f, broker.home / f.name)
    for extra in ("broker.db-wal", "broker.db-shm"):
        if not (backup / extra).exists():
            (broker.home / extra).unlink(missing_ok=True)
    await asyncio.to_thread(broker.start)
    await wait_for(lambda: connected(b))
    await wait_for(lambda: any(e.type == "broker_status" and
                               e.data.get("result") == "INVALID_SEQUENCE" for e in _events(b)))
    for i in range(3):
        assert await _send(a, f"after{i}", f"after{i}") == 202
    await wait_for(lambda: _bodies(b, 8))
    ids = [e["client_message_id"] for e in await inbox(b)]
    assert len(ids) == len(set(ids)) == 8


async def test_stale_sequence_after_inbox_restored_from_backup(short_tmp: Path) -> None:
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db",
                    env={"TIDEMESH_RETENTION_MESSAGE_DAYS": "0",
                         "TIDEMESH_RETENTION_SWEEP_INTERVAL_S": "0.3"})
    broker.cli("mesh", "create", "team")
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        a, b = await _pair(mesh, short_tmp)
        assert b.stop() == 0
        saved = short_tmp / "inbox-backup.db"
        shutil.copy2(b.paths.inbox_db, saved)
        b = mesh.restart("b")
        await wait_for(lambda: connected(b))
        for i in range(5):
            assert await _send(a, f"old{i}", f"old{i}") == 202
        await wait_for(lambda: _bodies(b, 5))
        await wait_for(lambda: _pruned(broker), timeout=30)
        assert b.stop() == 0
        for suffix in ("-wal", "-shm"):
            Path(str(b.paths.inbox_db) + suffix).unlink(missing_ok=True)
        shutil.copy2(saved, b.paths.inbox_db)
        b = mesh.restart("b")
        await wait_for(lambda: any(e.type == "broker_status" and
                                   e.data.get("result") == "STALE_SEQUENCE" for e in _events(b)))
        assert await _send(a, "new0", "new0") == 202
        await wait_for(lambda: _bodies(b, 1))
        assert [e["client_message_id"] for e in await inbox(b)] == ["new0"]
    finally:
        mesh.stop()


def _pruned(broker: Broker) -> bool:
    conn = sqlite3.connect(broker.home / "broker.db")
    try:
        return conn.execute("SELECT COUNT(*) FROM topic_message").fetchone()[0] == 0
    finally:
        conn.close()


async def test_a_dm_is_readable_only_by_its_recipient(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await _pair(mesh, short_tmp)
    c = mesh.add("c", short_tmp)
    await wait_for(lambda: connected(c))
    assert await _send(a, "dm-1", "for b only", to=f"dm:{pubkey(b)}") == 202
    await wait_for(lambda: _bodies(b, 1))
    assert (await inbox(b))[0]["body"] == "for b only"
    conn = sqlite3.connect(mesh.broker.home / "broker.db")
    (sealed,) = conn.execute("SELECT body FROM message_queue WHERE client_message_id='dm-1'"
                             ).fetchone()
    conn.close()
    assert b"for b only" not in bytes(sealed)
    c_key, _ = load_or_create_keypair(c.paths.keypair)
    with pytest.raises(UnsealError):
        unseal(c_key.signing_key, pubkey(a), bytes(sealed))
    b_key, _ = load_or_create_keypair(b.paths.keypair)
    assert unseal(b_key.signing_key, pubkey(a), bytes(sealed)).body == b"for b only"
    await asyncio.sleep(0.3)
    assert await inbox(c) == []



async def test_a_dm_keeps_its_meta_sealed_at_the_broker(mesh: Mesh, short_tmp: Path) -> None:
    """Issue 31 item 7: the broker stored a DM's meta in the clear."""
    a, b = await _pair(mesh, short_tmp)
    meta = {"invoice": "ACME-4711", "amount": "9000 EUR"}
    parent = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    send = {"to": f"dm:{pubkey(b)}", "body": "pay", "meta": meta, "reply_to": parent,
            "priority": "now"}
    async with a.session() as s, s.post("/v1/send", json=send,
                                        headers={"Idempotency-Key": "dm-meta"}) as r:
        assert r.status == 202, await r.text()
    async with a.session() as s, s.post("/v1/send", json={**send, "meta": {"invoice": "X"}},
                                        headers={"Idempotency-Key": "dm-meta"}) as r:
        assert r.status == 409, "another meta under the same id is another request"
    await wait_for(lambda: _bodies(b, 1))
    got = (await inbox(b))[0]
    assert (got["body"], got["meta"], got["reply_to"]) == ("pay", meta, parent)
    conn = sqlite3.connect(mesh.broker.home / "broker.db")
    stored = conn.execute("SELECT meta, reply_to, priority, body FROM message_queue "
                          "WHERE client_message_id='dm-meta'").fetchone()
    conn.close()
    assert stored[:3] == (None, None, "now")
    assert b"ACME" not in bytes(stored[3])
