"""A broker that goes quiet at any step of a session never takes its daemons down.

Found by the long fault run: a daemon that started while its broker came back from a restart
exited 1 ten seconds later (``background_task_stopped task=relay error=TimeoutError()``).
Reproduced by a broker that completes the WebSocket handshake and never answers. Here a
proxy in front of a real broker goes quiet at each step of the session set-up and at the
first batch; the daemon must keep running, say ``reconnecting``, connect again once the
broker answers, and deliver the send made meanwhile once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.harness import run_cli, start_daemon
from tests.e2e.harness import Broker, connected, inbox, sqlite_broker_with_team, wait_for
from tests.faults.stall_proxy import StallProxy

# Short limits, so that each stall is noticed in a second or two.
QUICK = {
    "TIDEMESH_RECONNECT_HANDSHAKE_TIMEOUT_S": "1.5",
    "TIDEMESH_RECONNECT_STALL_TIMEOUT_S": "1.5",
    "TIDEMESH_RECONNECT_INITIAL_BACKOFF_MS": "100",
    "TIDEMESH_RECONNECT_MAX_BACKOFF_MS": "500",
}

STEPS = ["open", "hello", "feature_negotiation_request", "profile", "resume", "send"]


@pytest.fixture
def broker(short_tmp: Path) -> Broker:
    b = sqlite_broker_with_team(short_tmp)
    b.start()
    try:
        yield b
    finally:
        b.stop()


async def _health(d: object) -> dict[str, object]:
    async with d.session() as s, s.get("/v1/health") as r:  # type: ignore[attr-defined]
        return dict(await r.json())


@pytest.mark.parametrize(("step", "talking"), [
    *((step, False) for step in STEPS),
    # Frames keep coming, answers do not: still a stall (when any frame counted as a sign of
    # life, such a broker kept the daemon waiting on that link for good).
    ("profile", True), ("send", True)])
async def test_a_broker_that_goes_quiet_at_any_step_is_waited_out(
        step: str, talking: bool, broker: Broker, short_tmp: Path) -> None:
    # A receiver that is connected straight to the broker.
    bob_home = short_tmp / "bob"
    bob_home.mkdir()
    res = run_cli(bob_home, "daemon", "join", broker.invite("team"), "--mesh", "m",
                  "--name", "bob")
    assert res.returncode == 0, res.stderr
    bob = start_daemon(bob_home, "m")
    alice_home = short_tmp / "alice"
    alice_home.mkdir()
    try:
        await wait_for(lambda: connected(bob))
        async with bob.session() as s, s.post("/v1/topics/subscribe",
                                              json={"name": "ops", "create": True}) as r:
            assert r.status == 200, await r.text()
        # Its first connection is the join's.
        with StallProxy(broker.url, step, stall_on=2, talking=talking).running() as proxy:
            invite = broker.cli("invite", "create", "--mesh", "team", "--uses", "1",
                                "--url", proxy.url)
            res = run_cli(alice_home, "daemon", "join", invite, "--mesh", "m", "--name", "alice")
            assert res.returncode == 0, res.stderr
            alice = start_daemon(alice_home, "m", extra_env=QUICK)
            try:
                async with alice.session() as s, s.post(
                        "/v1/send", json={"to": "topic:ops", "body": f"through {step}",
                                          "client_message_id": "m-1"}) as r:
                    assert r.status in (201, 202), await r.text()
                await wait_for(proxy.stalled.is_set, timeout=20)
                states: set[object] = set()

                async def reconnected() -> bool:
                    h = await _health(alice)
                    states.add(h.get("broker_state"))
                    return proxy.connections >= 3 and bool(h["connected"])

                await wait_for(reconnected, timeout=30)
                assert alice.proc.poll() is None, alice.log.read_text()[-3000:]
                assert "reconnecting" in states or _said_reconnecting(alice.log), states
                await wait_for(lambda: _delivered(bob, f"through {step}"), timeout=30)
                assert [m["body"] for m in await inbox(bob)] == [f"through {step}"]
                assert "background_task_stopped" not in alice.log.read_text()
                assert alice.stop() == 0
            finally:
                alice.kill()
    finally:
        bob.stop()


def _said_reconnecting(log: Path) -> bool:
    # The poll may miss a short reconnecting spell; the event log line cannot.
    return any('"broker_connect_failed"' in line for line in log.read_text().splitlines())


async def _delivered(d: object, body: str) -> bool:
    return any(m["body"] == body for m in await inbox(d))  # type: ignore[arg-type]

