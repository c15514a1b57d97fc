"""Graceful lifecycle of real daemon processes: SIGTERM under load, the drain deadline,
SIGHUP reload with a live broker link, and the rotating log of a detached daemon."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli, start_daemon
from tests.e2e.harness import Broker, Mesh, connected, wait_for
from tidemesh.client import Client
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import daemon_paths
from tidemesh.storage.lock import holder_pid

BURST = 200  # below ipc.max_inflight, so none is refused as busy


async def _send(s: aiohttp.ClientSession, cid: str) -> tuple[str, int | None]:
    try:
        async with s.post("/v1/send", json={"to": "topic:ops", "body": cid},
                          headers={"Idempotency-Key": cid}) as r:
            return cid, r.status
    except (aiohttp.ClientError, OSError):
        return cid, None  # refused or cut: the daemon was already stopping


async def test_sigterm_during_a_burst_keeps_every_accepted_send(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    async with d.session() as s:
        tasks = [asyncio.create_task(_send(s, f"burst-{i}")) for i in range(BURST)]
        for done, next_done in enumerate(asyncio.as_completed(tasks), start=1):
            await next_done
            if done == BURST // 4:
                d.proc.send_signal(signal.SIGTERM)
                break
        results = await asyncio.gather(*tasks)
    code = await asyncio.to_thread(d.proc.wait, 60)
    assert code == 0, d.log.read_text()[-2000:]
    assert "daemon_drain_deadline_passed" not in d.log.read_text(), "drained within the grace"
    assert not d.paths.socket.exists()
    accepted = {cid for cid, status in results if status == 202}
    assert len(accepted) >= BURST // 4
    assert {status for _, status in results} <= {202, None}
    again = start_daemon(short_tmp)
    try:
        stored = {r["client_message_id"] for r in again.outbox_rows()}
        assert accepted <= stored
    finally:
        assert again.stop() == 0


async def test_drain_deadline_cuts_off_stuck_work_and_exits_non_zero(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env={"TIDEMESH_SHUTDOWN_GRACE_S": "0.3"})
    # Another process holds the outbox's write lock, so the next send cannot finish.
    blocker = sqlite3.connect(d.paths.outbox_db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        async with d.session() as s:
            stuck = asyncio.create_task(_send(s, "stuck"))
            await asyncio.sleep(0.5)  # let the request reach the writer
            d.proc.send_signal(signal.SIGTERM)
            await wait_for(lambda: "daemon_drain_deadline_passed" in d.log.read_text())
            await stuck
    finally:
        blocker.rollback()
        blocker.close()
    code = await asyncio.to_thread(d.proc.wait, 60)
    assert code == Exit.FAILURE
    assert not d.paths.socket.exists()


def _events_of(d: RunningDaemon, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in Client(d.paths.socket).events(since=0, idle_timeout=0.5)
            if e.type == kind]


async def _tcp_health(d: RunningDaemon) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{d.port}/v1/health") as r:
        return r.status


async def test_sighup_applies_reloadable_settings_and_keeps_the_broker_link(
        mesh: Mesh, short_tmp: Path) -> None:
    d = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(d))
    statuses = len(_events_of(d, "broker_status"))
    assert await _tcp_health(d) == 401
    d.paths.config_file.write_text(
        '[ipc]\npublic_health_check = true\nmax_body_bytes = 2048\n[log]\nlevel = "debug"\n')
    d.proc.send_signal(signal.SIGHUP)
    await wait_for(lambda: "config_reloaded" in d.log.read_text())
    assert await _tcp_health(d) == 200
    (line,) = [json.loads(x) for x in d.log.read_text().splitlines()
               if "config_reloaded" in x]
    assert sorted(line["applied"]) == ["ipc.public_health_check", "log.level"]
    assert line["needs_restart"] == ["ipc.max_body_bytes"]
    assert await connected(d)
    assert len(_events_of(d, "broker_status")) == statuses, "the WebSocket was not dropped"
    # A file that no longer parses keeps the previous settings.
    d.paths.config_file.write_text("[ipc\n")
    d.proc.send_signal(signal.SIGHUP)
    await wait_for(lambda: "config_reload_failed" in d.log.read_text())
    assert await _tcp_health(d) == 200 and await connected(d)


def _reloads_logged(folder: Path) -> int:
    return sum(p.read_text().count("config_reloaded") for p in folder.glob("daemon.log*"))


async def test_detached_daemon_writes_a_rotated_json_log(short_tmp: Path) -> None:
    env = {"TIDEMESH_LOG_FILE_MAX_BYTES": "1500", "TIDEMESH_LOG_FILE_BACKUPS": "2"}
    up = subprocess.run([sys.executable, "-m", "tidemesh", "daemon", "up", "--mesh", "r"],
                        env=daemon_env(short_tmp, env), capture_output=True, text=True,
                        timeout=60, check=False)
    assert up.returncode == 0, up.stderr
    paths = daemon_paths("r", {"TIDEMESH_HOME": str(short_tmp)})
    pid = holder_pid(paths.lock_file)
    assert pid is not None
    for n in range(1, 21):  # each reload logs one line, about 200 bytes
        os.kill(pid, signal.SIGHUP)
        await wait_for(lambda n=n: _reloads_logged(paths.state_dir) >= n)
    down = run_cli(short_tmp, "daemon", "down", "--mesh", "r")
    assert down.returncode == 0, down.stderr
    logs = sorted(p.name for p in paths.state_dir.iterdir() if p.name.startswith("daemon.log"))
    assert logs == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    for name in logs:
        text = (paths.state_dir / name).read_text()
        assert len(text.encode()) <= 1500
        assert all(json.loads(line)["event"] for line in text.splitlines())
    assert "daemon_stopped" in (paths.state_dir / "daemon.log").read_text()


def test_up_under_a_service_manager_stays_in_the_foreground_and_logs_to_stderr(
        short_tmp: Path) -> None:
    # systemd sets INVOCATION_ID; a detached child would escape its supervision.
    env = daemon_env(short_tmp, {"INVOCATION_ID": "0123456789abcdef"})
    out = short_tmp / "journal.out"
    with open(out, "wb") as journal:
        proc = subprocess.Popen([sys.executable, "-m", "tidemesh", "daemon", "up", "--mesh", "s"],
                                stdout=journal, stderr=subprocess.STDOUT, env=env)
    d = RunningDaemon(short_tmp, "s", proc, out)
    try:
        asyncio.run(wait_for(lambda: d.paths.socket.exists() and "daemon_started" in
                             out.read_text()))
        assert holder_pid(d.paths.lock_file) == proc.pid
        assert not d.paths.log_file.exists()
    finally:
        assert d.stop() == 0
    assert all(json.loads(line)["event"] for line in out.read_text().splitlines())


def test_sighup_does_not_stop_the_broker(sqlite_broker: Broker) -> None:
    proc = sqlite_broker.proc
    assert proc is not None
    proc.send_signal(signal.SIGHUP)
    asyncio.run(wait_for(lambda: "broker_reload_ignored" in
                         (sqlite_broker.home / "broker.out").read_text()))
    assert proc.poll() is None
    assert sqlite_broker.stop() == 0


def test_status_reports_a_hung_daemon_as_unhealthy_not_stopped(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, mesh="h")
    d.proc.send_signal(signal.SIGSTOP)
    try:
        res = run_cli(short_tmp, "daemon", "status", "--json", "--mesh", "h")
    finally:
        d.proc.send_signal(signal.SIGCONT)
    assert res.returncode == Exit.UNHEALTHY
    report = json.loads(res.stdout)
    assert (report["running"], report["healthy"], report["pid"]) == (True, False, d.proc.pid)
    assert d.stop() == 0
    assert run_cli(short_tmp, "daemon", "status", "--mesh", "h").returncode == Exit.NOT_RUNNING
