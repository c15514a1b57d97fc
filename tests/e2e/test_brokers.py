"""Several brokers on one PostgreSQL serve one mesh (DESIGN §10): daemons spread over them
hear each other as if they shared a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker, connected, inbox, pubkey, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# The safety poll is pushed out of the tests' reach: a delivery that crosses brokers within
# the test's wait was woken by the other broker's NOTIFY.
NO_POLL = {"TIDEMESH_CLUSTER_POLL_S": "3600"}


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
