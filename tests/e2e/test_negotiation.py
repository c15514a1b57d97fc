"""The daemon refuses a broker whose dedupe window cannot cover its outbox max age (spec §4.9)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve

from tests.daemon.harness import run_cli, spawn, start_daemon
from tests.e2e.harness import Broker, connected, wait_for
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import daemon_paths


async def test_override_above_the_dedupe_window_stops_the_daemon_with_10(short_tmp: Path) -> None:
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db",
                    env={"TIDEMESH_DEDUPE_RETENTION_DAYS": "3"})
    broker.cli("mesh", "create", "team")
    broker.start()
    try:
        d = short_tmp / "d"
        d.mkdir()
        assert run_cli(d, "daemon", "join", broker.invite("team"), "--mesh", "m").returncode == 0
        # 3 days = 72 h; an override of 100 h would retry after the broker forgot the id.
        proc = spawn(d, "m", {"TIDEMESH_OUTBOX_MAX_AGE_HOURS_OVERRIDE": "100"})
        assert proc.wait(timeout=30) == Exit.FEATURE_UNAVAILABLE
        assert "outbox_max_age_above_dedupe_window" in (d / "m.out").read_text()
        # A shorter override inside the window is fine: the daemon gets past the
        # negotiation (connected) and keeps running. Waiting for that, not for a fixed
        # time, keeps a loaded machine from stopping it before it could start.
        ok = start_daemon(d, "m", {"TIDEMESH_OUTBOX_MAX_AGE_HOURS_OVERRIDE": "48"})
        try:
            await wait_for(lambda: connected(ok))
            assert ok.proc.poll() is None
        finally:
            assert ok.stop() == 0
    finally:
        broker.stop()


def _wait(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


async def test_a_broker_missing_a_required_feature_leaves_an_event_before_the_exit(
        short_tmp: Path) -> None:
    """The daemon exits 10 on a broker it cannot use; a program reading the event log learns
    why (a ``broker_status`` event, ``state: feature_negotiation_failed``), not only the
    process's exit code."""
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db")
    broker.cli("mesh", "create", "team")
    broker.start()
    d = short_tmp / "d"
    d.mkdir()
    try:
        assert run_cli(d, "daemon", "join", broker.invite("team"), "--mesh", "m").returncode == 0
    finally:
        broker.stop()
    mesh = json.loads(daemon_paths("m", {"TIDEMESH_HOME": str(d)}).mesh_file.read_text())

    async def lacking(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "challenge", "nonce": "ab" * 32, "protocol": 1}))
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "hello_ack", "mesh_id": mesh["mesh_id"],
                                  "mesh_name": "team", "pubkey": hello["pubkey"],
                                  "session_id": "01" + "A" * 24}))
        request = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "feature_negotiation_response", "id": request["id"],
                                  "supported": {}, "missing_required": ["dedupe"]}))
        await ws.wait_closed()

    async with serve(lacking, "127.0.0.1", broker.port):
        proc = spawn(d, "m")
        code = await asyncio.to_thread(_wait, proc)
        assert code == Exit.FEATURE_UNAVAILABLE, (d / "m.out").read_text()[-3000:]
    conn = sqlite3.connect(daemon_paths("m", {"TIDEMESH_HOME": str(d)}).inbox_db)
    rows = [json.loads(r[0]) for r in conn.execute(
        "SELECT data FROM events WHERE type = 'broker_status'").fetchall()]
    conn.close()
    failed = [r for r in rows if r.get("state") == "feature_negotiation_failed"]
    assert len(failed) == 1, rows
    assert failed[0]["reason"]["kind"] == "feature_unavailable"
