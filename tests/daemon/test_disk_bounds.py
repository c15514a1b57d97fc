"""Bounded disk on a real daemon: a large sweep under send load, the free-space floor, the
event stream's answers to ids it cannot serve, and the prune commands."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tidemesh.client import Client
from tidemesh.core.retention import DAY_MS, HOUR_MS, InboxPolicy
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings

OLD = 1_600_000_000_000           # far past every retention cutoff


def _fill_outbox(d: RunningDaemon, rows: int) -> None:
    """Old done rows, written behind the stopped daemon's back as years of traffic would."""
    conn = sqlite3.connect(d.paths.outbox_db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, dest_kind,"
            " dest_ref, enqueued_at, next_attempt_at, status, delivered_at, broker_message_id)"
            " VALUES (?, ?, zeroblob(32), ?, 'topic', 'ops', ?, ?, 'done', ?, 'b')",
            ((f"OLD{i:010d}", f"old-{i}", b"p" * 200, OLD + i, OLD + i, OLD + i)
             for i in range(rows)))
        conn.execute("INSERT INTO outbox_meta (key, value, updated_at) VALUES"
                     " ('max_age_ms', ?, 0)", (72 * HOUR_MS,))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _old_rows(d: RunningDaemon) -> int:
    conn = sqlite3.connect(d.paths.outbox_db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM outbox WHERE status = 'done'"
                                ).fetchone()[0])
    finally:
        conn.close()


@pytest.mark.slow
async def test_a_sweep_of_200k_rows_under_64_senders_keeps_every_202(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    assert d.stop() == 0
    _fill_outbox(d, 200_000)
    d = start_daemon(short_tmp, extra_env={"TIDEMESH_RETENTION_SWEEP_INTERVAL_S": "0.5"})
    answers: list[tuple[int, str]] = []
    sweeping = asyncio.Event()

    async def sender(s: aiohttp.ClientSession, n: int) -> None:
        i = 0
        while not sweeping.is_set() or i < 5:
            cid = f"live-{n}-{i}"
            async with s.post("/v1/send", json={"to": "topic:ops", "body": cid},
                              headers={"Idempotency-Key": cid}) as r:
                answers.append((r.status, cid))
            i += 1

    async def watch() -> None:
        deadline = time.monotonic() + 90
        while _old_rows(d) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        sweeping.set()

    try:
        async with d.session() as s:
            await asyncio.gather(watch(), *(sender(s, n) for n in range(64)))
        assert _old_rows(d) == 0, "the sweep finished"
        assert {status for status, _ in answers} == {202}
        kept = {r["client_message_id"] for r in d.outbox_rows()}
        assert {cid for _, cid in answers} <= kept, "every 202 is in the outbox"
        assert len(answers) >= 64 * 5
    finally:
        assert d.stop() == 0



async def _send(d: RunningDaemon, cid: str) -> tuple[int, dict[str, object]]:
    async with d.session() as s, s.post("/v1/send", json={"to": "topic:ops", "body": cid},
                                        headers={"Idempotency-Key": cid}) as r:
        return r.status, await r.json()


async def test_under_the_floor_sends_get_507_and_come_back_with_space(small_fs: Path) -> None:
    floor = 16 << 20
    d = start_daemon(small_fs, extra_env={"TIDEMESH_DISK_RESERVED_BYTES": str(floor)})
    filler = small_fs / "filler"
    try:
        assert (await _send(d, "before"))[0] == 202
        health = Client(d.paths.socket).health()
        assert health["disk"]["sends_refused"] is False
        assert set(health["disk"]["databases"]) == {"outbox", "inbox"}
        free = health["disk"]["free_bytes"]
        filler.write_bytes(b"\0" * (free - floor + (2 << 20)))
        await asyncio.sleep(0.3)
        status, body = await _send(d, "during")
        assert status == 507 and body["error"]["code"] == "insufficient_storage"
        assert "disk.reserved_bytes" in body["error"]["message"]
        assert Client(d.paths.socket).health()["disk"]["sends_refused"] is True
        assert "during" not in {r["client_message_id"] for r in d.outbox_rows()}
        metrics = Client(d.paths.socket).metrics()
        assert 'cm_daemon_disk_pct{kind="outbox",mesh="t"}' in metrics
        filler.unlink()
        await asyncio.sleep(0.3)
        assert (await _send(d, "after"))[0] == 202, "accepted again once space is back"
    finally:
        assert d.stop() == 0


def _events(d: RunningDaemon, since: int) -> list[tuple[str, dict[str, object]]]:
    return [(e.type, e.data)
            for e in Client(d.paths.socket).events(since=since, idle_timeout=0.5)]


async def _prune_events_later(d: RunningDaemon, later_ms: int) -> None:
    """Retention on the stopped daemon's real files, with the clock moved ``later_ms`` on."""
    out = await open_outbox(d.paths.outbox_db, 4, recover=False)
    inn = await open_inbox(d.paths.inbox_db)
    try:
        settings = RetentionSettings(inbox=InboxPolicy(DAY_MS, DAY_MS, DAY_MS))
        await RetentionService(out, inn, settings,
                               clock=lambda: time.time() + later_ms / 1000).prune_inbox()
    finally:
        await out.close()
        await inn.close()


async def test_event_ids_the_log_cannot_serve_get_a_notice_not_silence(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        ahead = _events(d, since=41)
        assert ahead[0] == ("cursor_ahead", {"requested_after": 41, "last_event_id": 0,
                                             "replay_from": 1})
    finally:
        assert d.stop() == 0
    db = await open_inbox(d.paths.inbox_db)
    svc = InboxService(db, EventBus(), clock=lambda: (time.time() - 2 * DAY_MS / 1000))
    for i in range(3):
        await svc.record_event("peer_join", {"n": i})
    await db.close()
    await _prune_events_later(d, 0)
    db = await open_inbox(d.paths.inbox_db)
    await InboxService(db, EventBus()).record_event("peer_join", {"n": 3})
    await db.close()
    d = start_daemon(short_tmp)
    try:
        got = _events(d, since=1)
        assert got[0] == ("history_truncated", {"requested_after": 1, "oldest_available": 4,
                                                "missed": 2})
        assert got[1:] == [("peer_join", {"n": 3})]
        assert _events(d, since=3) == [("peer_join", {"n": 3})], "a kept id resumes silently"
    finally:
        assert d.stop() == 0


def test_prune_commands_over_ipc_and_on_the_files(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        res = run_cli(short_tmp, "daemon", "outbox", "prune", "--mesh", "t", "--json")
        assert res.returncode == 0, res.stderr
        assert "not known" in json.loads(res.stdout)["skipped"]
    finally:
        assert d.stop() == 0
    _fill_outbox(d, 10)
    res = run_cli(short_tmp, "daemon", "outbox", "prune", "--mesh", "t", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["deleted"] == 10 and _old_rows(d) == 10
    res = run_cli(short_tmp, "daemon", "outbox", "prune", "--mesh", "t")
    assert res.returncode == 0 and "deleted 10 rows" in res.stdout and _old_rows(d) == 0
    d = start_daemon(short_tmp)
    try:
        res = run_cli(short_tmp, "daemon", "inbox", "prune", "--mesh", "t", "--dry-run", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["deleted"] == 0
        assert json.loads(res.stdout)["events_deleted"] == 0
        status = run_cli(short_tmp, "daemon", "status", "--mesh", "t", "--json")
        assert json.loads(status.stdout)["disk"]["databases"]["outbox"] > 0
    finally:
        assert d.stop() == 0
