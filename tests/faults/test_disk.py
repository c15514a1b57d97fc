"""Disk trouble: a full outbox filesystem, and a damaged inbox rebuilt from redelivery.

The full filesystem is a file-size limit (RLIMIT_FSIZE) on the daemon process, set before it
starts and lifted while it runs with prlimit(2): a write past it fails like a full disk (the
daemon ignores SIGXFSZ). No mount is needed, so the test runs anywhere Linux does.
"""

from __future__ import annotations

import json
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, daemon_env
from tests.e2e.harness import Broker, Mesh, connected, inbox, wait_for
from tidemesh.client import Client, DaemonNotRunning

pytestmark = pytest.mark.slow
LIMIT = 3 << 20  # bytes any one file of the daemon may reach while the "disk is full"


def _start_limited(home: Path) -> RunningDaemon:
    def limit() -> None:
        # Only the soft limit: raising it back up to the hard one later needs no privilege.
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))

    log = home / "t.out"  # stays empty; RunningDaemon wants a path
    # The log goes to /dev/null, not a file: the limit would cut a log file too.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", "t"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        env=daemon_env(home), preexec_fn=limit)
    d = RunningDaemon(home, "t", proc, log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            Client(d.paths.socket, timeout=1.0).version()
            return d
        except DaemonNotRunning:
            time.sleep(0.05)
    d.kill()
    raise RuntimeError("the limited daemon did not start")


async def _send(s: aiohttp.ClientSession, key: str, body: str) -> int:
    async with s.post("/v1/send", json={"to": "topic:ops", "body": body},
                      headers={"Idempotency-Key": key}) as r:
        return r.status


def _outbox(d: RunningDaemon) -> tuple[str, dict[str, str]]:
    conn = sqlite3.connect(f"file:{d.paths.outbox_db}?mode=ro", uri=True)
    try:
        (check,) = conn.execute("PRAGMA integrity_check").fetchone()
        rows = {k: json.loads(p)["body"] for k, p in
                conn.execute("SELECT client_message_id, payload FROM outbox")}
        return check, rows
    finally:
        conn.close()


async def test_a_full_disk_answers_507_loses_nothing_and_recovers(short_tmp: Path) -> None:
    d = _start_limited(short_tmp)
    try:
        body = "z" * (200 << 10)
        answers: dict[str, int] = {}
        async with d.session() as s:
            for i in range(60):  # 12 MiB of bodies: far past the limit
                answers[f"k{i}"] = await _send(s, f"k{i}", f"{i}:{body}")
                if answers[f"k{i}"] != 202:
                    break
            refused = [k for k, v in answers.items() if v != 202]
            assert refused, "the limit was never reached"
            assert set(answers.values()) <= {202, 503, 507}, answers
            # Still full: later sends are refused too, and nothing half-written appears.
            assert await _send(s, "still-full", body) in (503, 507)
            check, rows = _outbox(d)
            assert check == "ok"
            accepted = {k for k, v in answers.items() if v == 202}
            assert set(rows) == accepted, "a refused send left a row or an accepted one vanished"
            assert all(rows[k] == f"{k[1:]}:{body}" for k in accepted), "a row was half written"
            # Space comes back: the same daemon, without a restart, accepts again.
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            assert d.proc.poll() is None, "the daemon died of the full disk"
            for k in refused:
                assert await _send(s, k, f"{k[1:]}:{body}") == 202
        check, rows = _outbox(d)
        assert check == "ok" and set(rows) == set(answers)
    finally:
        d.kill()


async def test_a_damaged_inbox_is_rebuilt_from_redelivery(short_tmp: Path) -> None:
    """The broker keeps delivery rows (acked or not) until retention compacts them; a daemon
    whose inbox was moved aside resumes from (0, 0) and gets them all again."""
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db")
    broker.cli("mesh", "create", "team")
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
        await wait_for(lambda: connected(a))
        await wait_for(lambda: connected(b))
        async with b.session() as s, s.post("/v1/topics/subscribe",
                                            json={"name": "ops", "create": True}) as r:
            assert r.status == 200
        async with a.session() as s:
            for i in range(5):
                assert await _send(s, f"m{i}", f"body {i}") == 202
        await wait_for(lambda: _count(b, 5))
        before = [(e["client_message_id"], e["body"]) for e in await inbox(b)]
        assert b.stop() == 0
        db = b.paths.inbox_db
        for suffix in ("-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        db.write_bytes(b"not a database" * 500)
        b = mesh.restart("b")
        assert [p for p in db.parent.iterdir() if p.name.startswith("inbox.db.corrupt-")]
        await wait_for(lambda: _count(b, 5))
        assert [(e["client_message_id"], e["body"]) for e in await inbox(b)] == before
        async with a.session() as s:
            assert await _send(s, "m5", "body 5") == 202
        await wait_for(lambda: _count(b, 6))
        got = [e["client_message_id"] for e in await inbox(b)]
        assert got == [f"m{i}" for i in range(6)], "redelivered once each, then new ones"
    finally:
        mesh.stop()


async def _count(d: RunningDaemon, n: int) -> bool:
    try:
        return len(await inbox(d)) >= n
    except aiohttp.ClientError:
        return False
