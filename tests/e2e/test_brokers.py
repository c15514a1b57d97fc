"""Several brokers on one PostgreSQL serve one mesh (DESIGN §10): daemons spread over them
hear each other as if they shared a broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import say_hello
from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker, connected, inbox, pubkey, wait_for
from tidemesh.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# The safety poll is pushed out of the tests' reach: a delivery that crosses brokers within
# the test's wait was woken by the other broker's NOTIFY.
NO_POLL = {"TIDEMESH_CLUSTER_POLL_S": "3600", "TIDEMESH_LOG_FORMAT": "json"}


@pytest.fixture
def brokers(pg_database: str, short_tmp: Path) -> Iterator[list[Broker]]:
    trio = []
    for label in ("x", "y", "z"):
        home = short_tmp / label
        home.mkdir()
        trio.append(Broker(home, pg_database, env=dict(NO_POLL)))
    trio[0].cli("mesh", "create", "team")
    for b in trio:
        b.start()
    try:
        yield trio
    finally:
        for b in trio:
            b.kill()


def join(home: Path, broker: Broker) -> RunningDaemon:
    """A daemon joined by an invite that names only ``broker``: it stays on that one."""
    home.mkdir()
    res = run_cli(home, "daemon", "join", broker.invite("team"), "--mesh", "m",
                  "--name", home.name)
    assert res.returncode == 0, res.stderr
    return start_daemon(home, "m")


async def post(d: RunningDaemon, path: str, body: dict[str, object],
               key: str | None = None) -> int:
    headers = {"Idempotency-Key": key} if key else {}
    async with d.session() as s, s.post(path, json=body, headers=headers) as r:
        return r.status


async def bodies(d: RunningDaemon) -> list[str]:
    return [e["body"] for e in await inbox(d)]


async def has(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


async def test_topic_and_dm_traffic_crosses_brokers_once_and_in_order(
    brokers: list[Broker], short_tmp: Path
) -> None:
    x, y, z = brokers
    a, b, c = (join(short_tmp / "a", x), join(short_tmp / "b", y), join(short_tmp / "c", z))
    try:
        for d in (a, b, c):
            await wait_for(lambda d=d: connected(d))
        for d in (b, c):
            assert await post(d, "/v1/topics/subscribe", {"name": "ops", "create": True}) == 200
        for i in range(10):  # a (on x) to b (on y) directly, and to b and c through the topic
            assert await post(a, "/v1/send", {"to": f"dm:{pubkey(b)}", "body": f"dm{i}"},
                              f"dm{i}") == 202
            assert await post(a, "/v1/send", {"to": "topic:ops", "body": f"t{i}"}, f"t{i}") == 202
        for i in range(5):  # and back, from z to x
            assert await post(c, "/v1/send", {"to": f"dm:{pubkey(a)}", "body": f"r{i}"},
                              f"r{i}") == 202
        await wait_for(lambda: has(b, 20))
        await wait_for(lambda: has(c, 10))
        await wait_for(lambda: has(a, 5))
        await asyncio.sleep(0.5)  # anything that would arrive twice has had its chance
        got_b = await bodies(b)
        assert [m for m in got_b if m.startswith("dm")] == [f"dm{i}" for i in range(10)]
        assert [m for m in got_b if m.startswith("t")] == [f"t{i}" for i in range(10)]
        assert len(got_b) == 20
        assert await bodies(c) == [f"t{i}" for i in range(10)]
        assert await bodies(a) == [f"r{i}" for i in range(5)]
    finally:
        for d in (a, b, c):
            d.stop()


async def hello_as(d: RunningDaemon, broker: Broker) -> ClientConnection:
    """A second connection of ``d``'s member, with its key, to ``broker`` (no daemon)."""
    key = SigningKey(bytes.fromhex(json.loads(d.paths.keypair.read_text())["ed25519_seed"]))
    mesh_id = json.loads(d.paths.mesh_file.read_text())["mesh_id"]
    ws = await connect(broker.url)
    await say_hello(ws, mesh_id, key)
    return ws


async def closed_with(ws: ClientConnection) -> tuple[int | None, str | None]:
    async def drain() -> None:
        async with asyncio.timeout(30):
            while True:
                await ws.recv()

    with pytest.raises(ConnectionClosed):
        await drain()
    return ws.close_code, ws.close_reason


def link_closes(d: RunningDaemon) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, (line for line in d.log.read_text().splitlines()
                                        if '"broker_link_closed"' in line))
            if e.get("event") == "broker_link_closed"]


async def test_a_connection_to_another_broker_takes_the_session_over(
    brokers: list[Broker], short_tmp: Path
) -> None:
    x, y, _ = brokers
    a, b = join(short_tmp / "a", x), join(short_tmp / "b", x)
    try:
        await wait_for(lambda: connected(a))
        await wait_for(lambda: connected(b))
        ws = await hello_as(a, y)  # a's member, now on y: x closes the daemon's session
        await wait_for(lambda: any(e["code"] == 4011 for e in link_closes(a)))
        assert link_closes(a)[-1]["reason"] == "session_taken_over"
        # Not fatal: the daemon reconnects (to x, its only address) and takes the session back.
        assert await closed_with(ws) == (4011, "session_taken_over")
        await wait_for(lambda: connected(a))
        assert a.proc.poll() is None
        # And its deliveries flow again, from a member on another broker.
        assert await post(b, "/v1/send", {"to": f"dm:{pubkey(a)}", "body": "back"}, "k1") == 202
        await wait_for(lambda: has(a, 1))
        assert await bodies(a) == ["back"]
    finally:
        for d in (a, b):
            d.stop()


def peers(d: RunningDaemon) -> set[str]:
    return {p["pubkey"] for p in d.client.request("GET", "/v1/peers").body["peers"]}


def events(d: RunningDaemon, kind: str, about: str) -> int:
    return sum(1 for e in Client(d.paths.socket).events(since=0, idle_timeout=0.5)
               if e.type == kind and e.data["pubkey"] == about)


async def test_presence_spans_brokers_and_a_dead_brokers_members_leave(
    brokers: list[Broker], short_tmp: Path
) -> None:
    x, y, z = brokers
    a = join(short_tmp / "a", x)
    await wait_for(lambda: connected(a))
    b, c = join(short_tmp / "b", y), join(short_tmp / "c", z)
    try:
        await wait_for(lambda: connected(b))
        await wait_for(lambda: connected(c))
        everyone = {pubkey(d) for d in (a, b, c)}
        for d in (a, b, c):  # the peers list is the mesh's, whichever broker answers it
            await wait_for(lambda d=d: peers(d) == everyone)
        await wait_for(lambda: events(a, "peer_join", pubkey(c)) >= 1)  # joined on z, seen on x
        res = run_cli(b.home, "profile", "--mesh", "m", "--status", "dnd")
        assert res.returncode == 0, res.stderr
        await wait_for(lambda: any(p["pubkey"] == pubkey(b) and p["profile"].get("status")
                                   == "dnd" for p in a.client.request("GET", "/v1/peers")
                                   .body["peers"]))
        # (c's join left once already: `daemon join` connects to redeem the invite.)
        before = [events(d, "peer_leave", pubkey(c)) for d in (a, b)]
        z.kill()  # kill -9: c's session on z is stale until the others expire it
        c.stop()  # and c does not come back elsewhere
        for d, n in zip((a, b), before, strict=True):
            await wait_for(lambda d=d: peers(d) == everyone - {pubkey(c)}, timeout=40)
            await wait_for(lambda d=d, n=n: events(d, "peer_leave", pubkey(c)) > n, timeout=40)
        await asyncio.sleep(1)  # two live brokers expire it; one peer_leave all the same
        after = [events(d, "peer_leave", pubkey(c)) for d in (a, b)]
        assert [m - n for m, n in zip(after, before, strict=True)] == [1, 1]
        assert any('"broker_session_expired"' in (br.home / "broker.out").read_text()
                   for br in (x, y))
    finally:
        for d in (a, b, c):
            d.stop()
