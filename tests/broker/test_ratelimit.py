"""The per-member send budget on a real broker over each store: sends over it are answered
429 rate_limited with retry_after_ms, other members are not touched, and retries of keys the
broker already holds are answered from the dedupe table without spending it (B0)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from nacl.signing import SigningKey
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect

from tests.broker.test_send_batch import _hello
from tests.broker.test_server import Broker, _start, payload, pub
from tidemesh.broker.service import UNLIMITED
from tidemesh.broker.store.base import MeshLimits
from tidemesh.core.metrics import render
from tidemesh.core.ratelimit import Rate
from tidemesh.core.wire import decode, encode

Frame = dict[str, Any]
# A token every 1000 s: nothing refills while a test runs, so no test depends on timing.
SLOW = Rate(per_s=0.001, burst=3)


@pytest.fixture(params=[SLOW, None], ids=["broker_limit", "mesh_limit"])
async def broker(request: pytest.FixtureRequest, store_url: str) -> AsyncIterator[Broker]:
    """A broker whose members have three sends; set in the broker's settings, or as the
    mesh's own override of an unlimited broker (``broker mesh limits``)."""
    async with _limited(store_url, request.param or UNLIMITED) as b:
        if request.param is None:
            await b.store.set_mesh_limits(b.mesh_id, MeshLimits(SLOW.per_s, SLOW.burst))
            await b.service.refresh_limits()
        yield b


async def _batch(ws: ClientConnection, sends: list[tuple[str, str]]) -> list[Frame]:
    """One send_batch frame of (client_message_id, body) to topic ops; its results."""
    await ws.send(encode({"type": "send_batch", "id": "b", "sends": [
        {"id": f"s{i}", "client_message_id": cmid, **payload(body=body)}
        for i, (cmid, body) in enumerate(sends)]}))
    while True:
        frame = decode(await ws.recv())
        if frame["type"] == "send_results":
            return list(frame["results"])


async def _member(b: Broker, key: SigningKey) -> ClientConnection:
    ws = await connect(b.url)
    await _hello(ws, b, key)
    return ws


@asynccontextmanager
async def _limited(store_url: str, rate: Rate) -> AsyncIterator[Broker]:
    """A broker whose members have ``rate``, stopped and closed after."""
    b, server = await _start(store_url, rate)
    try:
        yield b
    finally:
        await server.stop()
        await b.store.close()


async def _bob_received(b: Broker) -> list[str]:
    """The client_message_ids bob has been delivered, in his order."""
    await b.store.hand_out(b.mesh_id, pub(b.bob), 0)   # what bob's pump does first
    return [r.client_message_id
            for r in await b.store.deliveries_after(b.mesh_id, pub(b.bob), 1, 0, 100)]


def _statuses(results: list[Frame]) -> list[int]:
    return [r["status"] for r in results]


def _sample(b: Broker, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(render(b.service.metrics.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def test_sends_over_the_budget_are_rate_limited_and_other_members_are_not(
        broker: Broker) -> None:
    async with await _member(broker, broker.alice) as alice, \
            await _member(broker, broker.bob) as bob:
        flood = await _batch(alice, [(f"a{i}", "x") for i in range(5)])
        assert _statuses(flood) == [201, 201, 201, 429, 429]
        over = flood[3]
        assert over["error"]["code"] == "rate_limited"
        assert over["client_message_id"] == "a3" and over["id"] == "s3"
        assert 0 < over["retry_after_ms"] <= flood[4]["retry_after_ms"]
        assert _statuses(await _batch(alice, [("a5", "x")])) == [429]
        assert _statuses(await _batch(bob, [(f"b{i}", "y") for i in range(3)])) == [201] * 3
    assert _sample(broker, "cm_broker_rate_limited_total", mesh_id=broker.mesh_id) == 3
    assert _sample(broker, "cm_broker_accept_total", status="429") == 3
    assert _sample(broker, "cm_broker_rate_bucket_fill_count") > 0
    counts = await broker.store.counts()
    assert counts["client_message_dedupe"] == 6   # nothing of a refused send was written


async def test_retries_are_answered_from_the_dedupe_table_without_spending_budget(
        broker: Broker) -> None:
    async with await _member(broker, broker.alice) as alice:
        first = await _batch(alice, [("a0", "x"), ("a1", "x"), ("a2", "x")])
        assert _statuses(first) == [201, 201, 201]
        # The bucket is empty: B0 answers the retries (200 duplicate, 409 for another body)
        # and only the new key is refused.
        again = await _batch(alice, [("a0", "x"), ("a1", "other"), ("a9", "x"), ("a2", "x")])
        assert _statuses(again) == [200, 409, 429, 200]
        assert again[0]["duplicate"] is True
        assert again[0]["broker_message_id"] == first[0]["broker_message_id"]
        assert again[1]["error"]["code"] == "idempotency_key_reused"
    assert _sample(broker, "cm_broker_dedupe_fast_path_total") == 3


async def test_retries_within_the_budget_get_their_tokens_back(broker: Broker) -> None:
    async with await _member(broker, broker.alice) as alice:
        assert _statuses(await _batch(alice, [("a0", "x")])) == [201]
        # Two tokens left and two retries: they fit, take them, and the accept's 200s
        # give them back.
        assert _statuses(await _batch(alice, [("a0", "x"), ("a0", "x")])) == [200, 200]
        assert _statuses(await _batch(alice, [("a1", "x"), ("a2", "x"), ("a3", "x")])) == [
            201, 201, 429]


async def test_a_rejected_send_costs_no_budget_and_one_over_it_is_refused_before_checks(
        broker: Broker) -> None:
    async with await _member(broker, broker.alice) as alice:
        await alice.send(encode({"type": "send_batch", "id": "b", "sends": [
            {"id": "s0", "client_message_id": "a0", **payload(body="x")},
            {"id": "s1", "client_message_id": "a1", **payload(body="x"), "priority": "loud"},
            {"id": "s2", "client_message_id": "a2", **payload(body="x")},
            {"id": "s3", "client_message_id": "a3", **payload(body="x")},
            {"id": "s4", "client_message_id": "a4", **payload(body="x"), "priority": "loud"},
        ]}))
        while (frame := decode(await alice.recv()))["type"] != "send_results":
            pass
        results = frame["results"]
        # The frame does not fit (five sends, three tokens): the three first by place take
        # the tokens, s1's 400 gives its token back, and s4 is refused before its check.
        # Refused sends are owed: new ones wait until a3 comes again.
        assert _statuses(results) == [201, 400, 201, 429, 429]
        assert results[1]["error"]["code"] == "invalid_frame"
        # The owed send (a3, the first refused) comes again and takes s1's token back.
        assert _statuses(await _batch(alice, [("a3", "x")])) == [201]
        assert _statuses(await _batch(alice, [("a4", "x")])) == [429]
    assert (await broker.store.counts())["client_message_dedupe"] == 3


async def test_a_send_after_the_wait_goes_through(store_url: str) -> None:
    """The bucket refills at the rate (a fast one here; no timing asserted, only that a
    send made after retry_after_ms is accepted)."""
    async with _limited(store_url, Rate(per_s=20, burst=1)) as b, \
            await _member(b, b.alice) as ws:
        got = await _batch(ws, [("a0", "x"), ("a1", "x")])
        assert _statuses(got) == [201, 429]
        wait_ms = got[1]["retry_after_ms"]
        await asyncio.sleep(wait_ms / 1000 + 0.01)
        assert _statuses(await _batch(ws, [("a1", "x")])) == [201]


async def test_a_mesh_override_keeps_the_brokers_value_for_what_it_leaves_out(
        store_url: str) -> None:
    async with _limited(store_url, Rate(per_s=50, burst=7)) as b:
        limiter = b.service.limiter
        await b.store.set_mesh_limits(b.mesh_id, MeshLimits(member_rate=2, member_burst=None))
        await b.service.refresh_limits()
        assert limiter.rate(b.mesh_id) == Rate(per_s=2, burst=7)
        assert limiter.rate("another mesh") == Rate(per_s=50, burst=7)
        await b.store.set_mesh_limits(b.mesh_id, MeshLimits(None, None))   # --clear
        await b.service.refresh_limits()
        assert limiter.rate(b.mesh_id) == Rate(per_s=50, burst=7)
        assert await b.store.mesh_limits() == {}


async def test_a_frame_behind_a_refused_one_waits_for_it_so_order_holds(store_url: str) -> None:
    """A daemon has frames on the wire behind one that was refused; by the time the broker
    reads them the bucket has refilled. They are refused too until the refused send comes
    again, so the recipient gets the sender's messages in the order they were sent."""
    async with _limited(store_url, Rate(per_s=20, burst=3)) as b:
        async with await _member(b, b.alice) as ws:
            assert _statuses(await _batch(ws, [(f"a{i}", "x") for i in range(4)])) == [
                201, 201, 201, 429]
            await asyncio.sleep(0.3)   # the bucket is full again
            behind = await _batch(ws, [("a4", "x")])
            assert _statuses(behind) == [429]
            assert behind[0]["retry_after_ms"] >= 1
            assert _statuses(await _batch(ws, [("a3", "x"), ("a4", "x")])) == [201, 201]
        assert await _bob_received(b) == [f"a{i}" for i in range(5)]


async def test_every_refused_send_comes_back_before_anything_newer_goes_through(
        store_url: str) -> None:
    """Two frames refused in turn; the daemon's retry brings the first one and a newer send
    (the second's answer had not reached it when it claimed). The newer one waits for the
    second refused send, which the fault harness once saw overtaken."""
    async with _limited(store_url, Rate(per_s=20, burst=2)) as b:
        async with await _member(b, b.alice) as ws:
            assert _statuses(await _batch(ws, [("a0", "x"), ("a1", "x"), ("a2", "x")])) == [
                201, 201, 429]
            assert _statuses(await _batch(ws, [("a3", "x")])) == [429]
            await asyncio.sleep(0.3)   # the bucket is full again
            assert _statuses(await _batch(ws, [("a2", "x"), ("a4", "x")])) == [201, 429]
            await asyncio.sleep(0.3)
            assert _statuses(await _batch(ws, [("a3", "x"), ("a4", "x")])) == [201, 201]
        assert await _bob_received(b) == [f"a{i}" for i in range(5)]


async def test_a_member_that_does_not_wait_is_not_read_while_others_are_served(
        broker: Broker) -> None:
    """After a 429 the broker does not read the member's connection for the wait (at most
    READ_HOLD_MAX_MS, a second here): a frame it sends at once is answered after a frame
    another member sent later, and both are answered."""
    async with await _member(broker, broker.alice) as alice, \
            await _member(broker, broker.bob) as bob:
        assert _statuses(await _batch(alice, [(f"a{i}", "x") for i in range(4)])) == [
            201, 201, 201, 429]
        order: list[str] = []

        async def answered(ws: ClientConnection, who: str, cmid: str) -> list[int]:
            statuses = _statuses(await _batch(ws, [(cmid, who)]))
            order.append(who)
            return statuses

        ignoring = asyncio.create_task(answered(alice, "alice", "a3"))
        await asyncio.sleep(0.05)  # alice's frame is on the wire first
        assert await answered(bob, "bob", "b0") == [201]
        assert await ignoring == [429]
    assert order == ["bob", "alice"]
