"""Hook processes and the ledger service, with real shell scripts and a real inbox.db:
timeouts end the whole process group, output is capped, the concurrency cap holds, and a
hook that keeps failing becomes a hook_failed event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import uvloop

from tests.daemon.local_app import delivery
from tidemesh.core import hooks as rules
from tidemesh.core.backoff import Backoff
from tidemesh.core.hooks import HookConfig, ReplyScope
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.core.sqlscript import split_statements
from tidemesh.daemon.api.keys import (
    BUS,
    CAPABILITIES,
    INBOX,
    OUTBOX,
    STATE,
    DaemonInfo,
    IpcMetrics,
    IpcState,
)
from tidemesh.daemon.hooks.capability import Capabilities
from tidemesh.daemon.hooks.files import load_plan
from tidemesh.daemon.hooks.runner import RunResult, Sandbox, hook_env, run_hook
from tidemesh.daemon.hooks.service import HookMetrics, HookService, HookSite
from tidemesh.daemon.process.server import IpcServer, build_app
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.store import inbox as inbox_store
from tidemesh.daemon.store.db import INBOX_MIGRATIONS


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o700)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_timeout_ends_the_whole_process_group(short_tmp: Path) -> None:
    pidfile = short_tmp / "sleeper.pid"
    path = script(short_tmp, "on-message", f"sleep 300 &\necho $! > {pidfile}\nwait")
    env = hook_env("t", "on-message", "e1", short_tmp / "sock")
    result = await run_hook(path, HookConfig("on-message", timeout_s=0.5), b"{}", env,
                            Sandbox(None), grace_s=0.5)
    assert result.timed_out and result.exit_code is None
    sleeper = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(sleeper) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(sleeper), "the forked sleeper outlived its hook"


async def test_stdout_over_the_limit_is_cut_and_counted(short_tmp: Path) -> None:
    path = script(short_tmp, "on-message", "head -c 100000 /dev/zero | tr '\\0' x")
    env = hook_env("t", "on-message", "e1", short_tmp / "sock")
    result = await run_hook(path, HookConfig("on-message", output_size_limit=1000), b"{}",
                            env, Sandbox(None))
    assert result.ok and result.stdout == b"x" * 1000
    assert result.stdout_bytes == 100000 and result.stdout_cut


async def test_hook_sees_only_its_minimal_environment_and_its_event(short_tmp: Path) -> None:
    path = script(short_tmp, "on-message", "env | sort; cat")
    env = hook_env("t", "on-message", "e1", short_tmp / "sock")
    result = await run_hook(path, HookConfig("on-message"), b'{"x":1}', env, Sandbox(None))
    lines = result.stdout.decode().splitlines()
    assert lines[-1] == '{"x":1}'
    names = {line.split("=", 1)[0] for line in lines[:-1]}
    assert names <= {"PATH", "PWD", "SHLVL", "_", "TIDEMESH_MESH", "TIDEMESH_HOOK_NAME",
                     "TIDEMESH_EVENT_ID", "TIDEMESH_DAEMON_SOCK"}
    assert "PATH=/usr/bin:/bin" in lines and "TIDEMESH_EVENT_ID=e1" in lines


def _run_on_uvloop(path: Path, cfg: HookConfig) -> RunResult:
    """The daemon runs on uvloop, whose subprocesses inherit extra copies of their pipes:
    run the hook there, as the daemon would."""
    env = hook_env("t", "on-message", "e1", path.parent / "sock")
    return uvloop.run(run_hook(path, cfg, b"{}", env, Sandbox(None), grace_s=0.5))


def _kill_pid_in(pidfile: Path) -> None:
    with contextlib.suppress(ValueError, OSError):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_background_child_with_its_own_stdio_does_not_hold_the_run(short_tmp: Path) -> None:
    pidfile = short_tmp / "child.pid"
    path = script(short_tmp, "on-message",
                  f"sleep 60 </dev/null >/dev/null 2>&1 &\necho $! > {pidfile}\necho started")
    try:
        result = _run_on_uvloop(path, HookConfig("on-message", timeout_s=20))
    finally:
        _kill_pid_in(pidfile)
    assert not result.timed_out and result.exit_code == 0, result.describe()
    assert result.stdout == b"started\n"


def test_a_background_child_holding_the_pipes_does_not_hold_the_run(short_tmp: Path) -> None:
    pidfile = short_tmp / "child.pid"
    path = script(short_tmp, "on-message",
                  f"echo before\nsleep 60 &\necho $! > {pidfile}\necho after")
    try:
        result = _run_on_uvloop(path, HookConfig("on-message", timeout_s=20))
    finally:
        _kill_pid_in(pidfile)
    assert not result.timed_out and result.exit_code == 0, result.describe()
    assert result.stdout == b"before\nafter\n"


@asynccontextmanager
async def hook_service(folder: Path, **kw: object) -> AsyncIterator[tuple[InboxService,
                                                                          HookService]]:
    db = await open_inbox(folder / "inbox.db")
    bus = EventBus()
    plan = load_plan(folder / "hooks")
    svc = HookService(db, bus, plan, HookSite(folder / "hooks", "t", folder / "sock"),
                      HookMetrics.register(CollectorRegistry()), **kw)  # type: ignore[arg-type]
    task = asyncio.create_task(svc.run())
    try:
        yield InboxService(db, bus, hooks=plan), svc
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.close()


def _ledger(folder: Path) -> list[tuple[str, str, int]]:
    conn = sqlite3.connect(folder / "inbox.db")
    try:
        return conn.execute("SELECT hook, state, failures FROM hook_runs ORDER BY event_id"
                            ).fetchall()
    finally:
        conn.close()


async def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert check(), "condition not met"


async def test_concurrency_cap_holds(short_tmp: Path) -> None:
    hooks = short_tmp / "hooks"
    hooks.mkdir()
    running, counts = short_tmp / "running", short_tmp / "counts"
    running.mkdir()
    script(hooks, "on-message", f"touch {running}/$TIDEMESH_EVENT_ID\n"
           f"ls {running} | wc -l >> {counts}\nsleep 0.2\nrm {running}/$TIDEMESH_EVENT_ID")
    (hooks / "hooks.toml").write_text('[on-message]\nnetwork_policy = "allow"\n')
    async with hook_service(short_tmp, concurrency=3) as (inbox, _):
        for i in range(1, 13):
            await inbox.store(delivery(i))
        await _until(lambda: counts.exists() and len(counts.read_text().split()) == 12)
        await _until(lambda: all(state == "done" for _, state, _ in _ledger(short_tmp)))
    seen = [int(n) for n in counts.read_text().split()]
    assert max(seen) <= 3, seen
    assert len(_ledger(short_tmp)) == 12


async def test_failing_hook_retries_then_becomes_a_hook_failed_event(short_tmp: Path) -> None:
    hooks = short_tmp / "hooks"
    hooks.mkdir()
    tries = short_tmp / "tries"
    script(hooks, "on-topic-ops", f"echo $TIDEMESH_EVENT_ID >> {tries}\necho boom >&2\nexit 3")
    (hooks / "hooks.toml").write_text("[on-topic-ops]\n")
    async with hook_service(short_tmp, max_attempts=3,
                            backoff=Backoff(0.05, 0.1, 2.0, 0.0)) as (inbox, svc):
        stored = await inbox.store(delivery(1, topic="ops"))
        await inbox.store(delivery(2, topic="dev"))
        await _until(lambda: _ledger(short_tmp) == [("on-topic-ops", "failed", 3)])
        events = await inbox.events_after(0)
    msg_id = stored.event.data["id"] if stored.event else None
    assert tries.read_text().split() == [msg_id] * 3, "3 attempts, the same event id each time"
    failed = [e for e in events if e.type == "hook_failed"]
    assert len(failed) == 1
    assert failed[0].data["hook"] == "on-topic-ops" and failed[0].data["event_id"] == msg_id
    assert failed[0].data["attempts"] == 3 and "exit 3: boom" in failed[0].data["error"]
    assert svc.metrics.invocations.labels(hook="on-topic-ops", exit="3")._value.get() == 3


async def test_redaction_and_the_stdin_cap_reach_the_hook(short_tmp: Path) -> None:
    hooks, seen = short_tmp / "hooks", short_tmp / "seen"
    hooks.mkdir()
    seen.mkdir()
    script(hooks, "on-message", f"cat > {seen}/$TIDEMESH_EVENT_ID")
    (hooks / "hooks.toml").write_text('[on-message]\nredact_payload = ["$.body.secret"]\n')
    async with hook_service(short_tmp) as (inbox, _):
        small = await inbox.store(delivery(1, body='{"secret": "hunter2", "keep": 1}'))
        big = await inbox.store(delivery(2, body="y" * (rules.STDIN_LIMIT + 10)))
        await _until(lambda: [s for _, s, _ in _ledger(short_tmp)] == ["done", "done"])
    assert small.event is not None and big.event is not None
    first = json.loads((seen / small.event.data["id"]).read_text())
    assert json.loads(first["body"]) == {"secret": "[redacted]", "keep": 1}
    assert "_truncated" not in first
    raw = (seen / big.event.data["id"]).read_bytes()
    second = json.loads(raw)
    assert len(raw) <= rules.STDIN_LIMIT and second["_truncated"] is True
    assert second["event_id"] == big.event.data["id"]


def test_migration_keeps_event_ids_and_allows_hook_failed(short_tmp: Path) -> None:
    conn = sqlite3.connect(short_tmp / "inbox.db", isolation_level=None)
    try:
        INBOX_MIGRATIONS.sqlite_version(conn)
        for mg in INBOX_MIGRATIONS.load()[:3]:
            for stmt in split_statements(mg.sql):
                conn.execute(stmt).fetchall()
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (mg.version, mg.name))
        for n in range(3):
            conn.execute("INSERT INTO events (type, data, created_at) VALUES"
                         " ('broker_status', ?, 0)", (f'{{"n": {n}}}',))
        conn.execute("DELETE FROM events WHERE id = 3")   # retention took the newest
        assert INBOX_MIGRATIONS.apply_sqlite(conn)[0] == 4
        assert inbox_store.last_event_id(conn) == 3, "ids given before stay given"
        assert [e.id for e in inbox_store.events_after(conn, 0, 10)] == [1, 2]
        added = inbox_store.add_event(conn, inbox_store.NewEvent("hook_failed", {}, 0))
        assert added is not None and added.id == 4
    finally:
        conn.close()


async def test_reply_token_on_tcp_allows_only_its_send(short_tmp: Path) -> None:
    outbox_db = await open_outbox(short_tmp / "outbox.db", 64)
    inbox_db = await open_inbox(short_tmp / "inbox.db")
    app = build_app(1 << 20)
    registry = CollectorRegistry()
    caps = Capabilities()
    bus = EventBus()
    app[OUTBOX], app[INBOX], app[BUS] = OutboxService(outbox_db), InboxService(inbox_db, bus), bus
    app[CAPABILITIES] = caps
    app[STATE] = IpcState(token="local", max_inflight=8, public_health_check=False,
                          info=DaemonInfo("t"), registry=registry,
                          metrics=IpcMetrics.register(registry))
    server = IpcServer(app, short_tmp / "sock", 0, 1.0)
    await server.start()
    token = caps.issue(ReplyScope("topic", "ops", "e1"), "on-topic-ops")
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.bound_port}") as s:
            async def status(method: str, path: str, bearer: str, body: object = None) -> int:
                async with s.request(method, path, json=body,
                                     headers={"Authorization": f"Bearer {bearer}"}) as r:
                    return r.status

            assert await status("POST", "/v1/send", token, {"to": "topic:ops", "body": "x"}) \
                == 202
            assert await status("POST", "/v1/send", token, {"to": "topic:dev", "body": "x"}) \
                == 403
            assert await status("POST", "/v1/send", token, {"to": {"kind": "topic"}}) == 403
            assert await status("GET", "/v1/inbox", token) == 403
            assert await status("GET", "/v1/inbox", "local") == 200
            assert await status("GET", "/v1/inbox", "tmcap_guess") == 401
    finally:
        await server.stop()
        await outbox_db.close()
        await inbox_db.close()
    assert caps.uses(token) == 1
