"""The per-token IPC request budget (spec §3 limits; issue 32 item 3): a token over
``ipc.rate_burst`` at once gets 429 ``rate_limited`` with ``Retry-After``, on the Unix
socket's send lane and aiohttp alike; the Unix socket, the local token on TCP and each hook
reply token are counted apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, start_daemon
from tidemesh.client import Client
from tidemesh.core.errors import RateLimited
from tidemesh.core.hooks import ReplyScope
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.core.ratelimit import Buckets, Rate
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
from tidemesh.daemon.process.server import IpcServer, build_app
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService

BODY = {"to": "topic:ops", "body": "x"}
BURST = 5
# One token per 1000 s: no request in a test gets one back.
SLOW = {"TIDEMESH_IPC_RATE_PER_S": "0.001", "TIDEMESH_IPC_RATE_BURST": str(BURST)}


def test_take_is_admit_for_one_request() -> None:
    rate, buckets = Rate(1.0, 2), Buckets()
    assert [buckets.take("k", rate, 0) for _ in range(3)] == [0, 0, 1000]
    assert buckets.take("k", rate, 500) == 500     # half a token back
    assert buckets.take("k", rate, 1000) == 0
    assert buckets.take("other", rate, 1000) == 0
    assert Buckets().take("k", Rate(0, 1), 0) == 0  # 0: no limit


def _refused(status: int, headers: Any, body: dict[str, Any]) -> bool:
    if status != 429:
        return False
    assert body["error"]["code"] == "rate_limited", body
    assert body["error"]["retry_after_ms"] > 0
    assert int(headers["Retry-After"]) >= 1
    return True


async def _until_refused(session: aiohttp.ClientSession, url: str,
                         headers: dict[str, str] | None = None) -> int:
    """POST sends until one is refused; how many went through first."""
    for n in range(BURST + 2):
        async with session.post(url, json=BODY, headers=headers) as r:
            if _refused(r.status, r.headers, await r.json()):
                return n
            assert r.status == 202
    raise AssertionError("never refused")


async def test_each_transport_has_its_own_budget_on_a_real_daemon(short_tmp: Path) -> None:
    d: RunningDaemon = start_daemon(short_tmp, extra_env=SLOW)
    try:
        # The Unix socket: the send lane answers these itself.
        async with d.session() as s:
            assert await _until_refused(s, "/v1/send") <= BURST
            # aiohttp's routes on the same socket share its budget.
            async with s.get("/v1/health") as r:
                assert _refused(r.status, r.headers, await r.json())
        with pytest.raises(RateLimited) as info:
            Client(d.paths.socket).health()
        assert info.value.retry_after_ms > 0
        # Loopback TCP with the local token: a budget of its own, untouched so far.
        auth = {"Authorization": f"Bearer {d.token}"}
        tcp = f"http://127.0.0.1:{d.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{tcp}/v1/metrics", headers=auth) as r:
                assert r.status == 200
                metrics = await r.text()
            assert await _until_refused(s, f"{tcp}/v1/send", auth) == BURST - 1
        assert 'cm_daemon_ipc_rate_limited_total{transport="unix"} 3.0' in metrics
        assert ('cm_daemon_ipc_request_total{endpoint="/v1/send",status="429",'
                'transport="unix"} 1.0') in metrics
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


async def test_a_hook_reply_token_has_a_budget_of_its_own(short_tmp: Path) -> None:
    outbox_db = await open_outbox(short_tmp / "outbox.db", 64)
    inbox_db = await open_inbox(short_tmp / "inbox.db")
    app = build_app(1 << 20)
    registry, caps, bus = CollectorRegistry(), Capabilities(), EventBus()
    app[OUTBOX], app[INBOX], app[BUS], app[CAPABILITIES] = (
        OutboxService(outbox_db), InboxService(inbox_db, bus), bus, caps)
    app[STATE] = IpcState(token="local", max_inflight=64, public_health_check=False,
                          info=DaemonInfo("t"), registry=registry,
                          metrics=IpcMetrics.register(registry), rate=Rate(0.001, BURST))
    server = IpcServer(app, short_tmp / "sock", 0, 1.0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.bound_port}/v1/send"
        reply = {"Authorization": f"Bearer {caps.issue(ReplyScope('topic', 'ops', 'e1'), 'h')}"}
        local = {"Authorization": "Bearer local"}
        async with aiohttp.ClientSession() as s:
            assert await _until_refused(s, url, reply) == BURST
            assert await _until_refused(s, url, local) == BURST
            other = {"Authorization":
                     f"Bearer {caps.issue(ReplyScope('topic', 'ops', 'e2'), 'h')}"}
            async with s.post(url, json=BODY, headers=other) as r:
                assert r.status == 202
    finally:
        await server.stop()
        await outbox_db.close()
        await inbox_db.close()


def test_the_budget_is_reloadable_and_checked() -> None:
    from tidemesh.core.settings import ConfigError
    from tidemesh.daemon.process import config
    from tidemesh.daemon.process.lifecycle import apply

    settings, _ = config.load({"ipc": {"rate_per_s": 5.0, "rate_burst": 7}}, {}, {})
    registry = CollectorRegistry()
    state = IpcState(token="t", max_inflight=1, public_health_check=False,
                     info=DaemonInfo("t"), registry=registry,
                     metrics=IpcMetrics.register(registry))
    assert state.rate == Rate(100.0, 1000)
    apply(settings, state, EventBus())
    assert state.rate == Rate(5.0, 7)
    with pytest.raises(ConfigError):
        config.load({"ipc": {"rate_burst": 0}}, {}, {})
