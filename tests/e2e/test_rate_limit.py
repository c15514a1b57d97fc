"""A daemon that sends more than its member budget at once: the broker answers the excess
429 rate_limited, the daemon waits retry_after_ms and sends it again, and every message
arrives exactly once, in the order it was sent. The budget is the mesh's own, set by the
operator command before the broker starts."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Broker, Mesh, inbox, sqlite_broker_with_team, two_on_topic, wait_for

SENDS = 30
BURST = 10


@pytest.fixture
def limited(short_tmp: Path) -> Iterator[Mesh]:
    b = sqlite_broker_with_team(short_tmp)
    # A token every 200 ms: the 20 sends past the burst are refused at least once.
    b.cli("mesh", "limits", "--mesh", "team", "--rate", "5", "--burst", str(BURST))
    b.start()
    m = Mesh(b, "team")
    try:
        yield m
    finally:
        m.stop()


async def test_a_flood_is_slowed_down_and_arrives_once_in_order(limited: Mesh,
                                                                 short_tmp: Path) -> None:
    a, b = await two_on_topic(limited, short_tmp)
    async with a.session() as s:
        for i in range(SENDS):
            async with s.post("/v1/send", json={"to": "topic:ops", "body": f"m{i:03}"},
                              headers={"Idempotency-Key": f"k{i:03}"}) as r:
                assert r.status == 202, await r.text()
    await wait_for(lambda: _arrived(b), timeout=60)
    bodies = [e["body"] for e in await inbox(b)]
    assert bodies == [f"m{i:03}" for i in range(SENDS)], "each once, in send order"
    rows = a.outbox_rows()
    assert {r["status"] for r in rows} == {"done"}, "nothing dead, nothing lost"
    assert max(r["attempts"] for r in rows) > 1, "some sends were refused and sent again"
    metrics = _broker_metrics(limited.broker)
    refused = [line for line in metrics.splitlines()
               if line.startswith("cm_broker_rate_limited_total{")]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) > 0
    assert 'cm_broker_accept_total{status="201"} 30.0' in metrics


async def _arrived(d: object) -> bool:
    return len(await inbox(d)) >= SENDS  # type: ignore[arg-type]


def _broker_metrics(b: Broker) -> str:
    url = f"http://127.0.0.1:{b.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())
