"""A ``send_batch`` frame is one store operation: a real broker on each store, answering one
frame of 500 sends exactly as 500 lone sends in the same order would have been answered."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from nacl.signing import SigningKey
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect

from tests.broker.conftest import say_hello
from tests.broker.test_server import Broker, _start, payload, pub
from tidemesh.core.jsonbounds import META_DEPTH
from tidemesh.core.metrics import render
from tidemesh.core.send import Destination, Priority, SendRequest
from tidemesh.core.wire import decode, encode

Frame = dict[str, Any]
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


async def _hello(ws: ClientConnection, b: Broker, key: SigningKey) -> None:
    await say_hello(ws, b.mesh_id, key)


async def _answer(ws: ClientConnection) -> Frame:
    while True:
        frame = decode(await ws.recv())
        if frame["type"] in ("send_result", "send_results"):
            return frame


async def _alone(ws: ClientConnection, send: Frame) -> Frame:
    """A lone send's result. One that fails its schema goes as a batch of one: a lone frame
    would get an error frame, and fifty of them close the connection as a flood."""
    if send["to"]["kind"] == "fax":
        await ws.send(encode({"type": "send_batch", "id": "one", "sends": [send]}))
        return (await _answer(ws))["results"][0]
    await ws.send(encode({"type": "send", **send}))
    return await _answer(ws)


def _mixed_sends(n: int = 500) -> list[Frame]:
    """Fresh keys, with repeats inside the frame (same body: duplicate; other body:
    conflict), schema rejects, a B1 reject, a B2 refusal whose key a later send then wins,
    and keys an earlier frame already holds."""
    sends: list[Frame] = []
    for i in range(n):
        cmid, item = f"c{i}", payload(body=f"b{i}")
        if i % 10 == 3:
            cmid, item = f"c{i - 3}", payload(body=f"b{i - 3}")
        elif i % 10 == 5:
            cmid, item = f"c{i - 5}", payload(body="other")
        elif i % 10 == 7:
            item = payload(to={"kind": "fax", "ref": "x"})
        elif i % 50 == 9:
            cmid, item = f"x{i}", payload(ref="nowhere")
        elif i % 50 == 19:
            cmid = f"x{i - 10}"
        elif i % 50 == 29:
            cmid, item = f"x{i - 20}", payload(body=f"b{i - 10}")
        elif i % 100 == 41:
            item = payload(body="not base64!", body_encoding="base64")
        elif i % 100 == 61:
            cmid, item = "early", payload(body="e")
        elif i % 100 == 81:
            cmid, item = "early", payload(body="changed")
        sends.append({"id": f"s{i}", "client_message_id": cmid, **item})
    return sends


def _shape(results: list[Frame]) -> list[tuple[Any, ...]]:
    """What a result says, with 200s naming the position of the send they repeat."""
    created = {r["broker_message_id"]: i for i, r in enumerate(results) if r["status"] == 201}
    return [(r["id"], r["status"], r.get("error", {}).get("code"),
             created.get(r["broker_message_id"], "earlier") if r["status"] == 200 else None)
            for r in results]


def _accepts_histogram(b: Broker) -> tuple[float, float]:
    """(sum, count) of the sends-per-accept-transaction histogram, as /metrics renders it."""
    families = text_string_to_metric_families(render(b.service.metrics.registry).decode())
    samples = {s.name: s.value for f in families if f.name == "cm_broker_accept_batch_size"
               for s in f.samples}
    return samples["cm_broker_accept_batch_size_sum"], samples["cm_broker_accept_batch_size_count"]


async def test_a_batch_is_answered_as_its_sends_one_by_one_in_order(store_url: str) -> None:
    b, server = await _start(store_url)
    sends = _mixed_sends()
    early = {"id": "e", "client_message_id": "early", **payload(body="e")}
    try:
        async with connect(b.url) as ws:  # alice: the whole frame at once
            await _hello(ws, b, b.alice)
            await ws.send(encode({"type": "send_batch", "id": "pre", "sends": [early]}))
            assert (await _answer(ws))["results"][0]["status"] == 201
            before = _accepts_histogram(b)
            await ws.send(encode({"type": "send_batch", "id": "big", "sends": sends}))
            batch = await _answer(ws)
            after = _accepts_histogram(b)
        async with connect(b.url) as ws:  # bob: the same sends alone, each awaited
            await _hello(ws, b, b.bob)
            await ws.send(encode({"type": "send", **early}))
            await _answer(ws)
            singles = [await _alone(ws, s) for s in sends]
        counts = await b.store.counts()
        await b.store.hand_out(b.mesh_id, pub(b.bob), 0)   # what bob's pump does first
        received = await b.store.deliveries_after(b.mesh_id, pub(b.bob), 1, 0, 1000)
    finally:
        await server.stop()
        await b.store.close()
    assert (batch["type"], batch["id"], len(batch["results"])) == ("send_results", "big", 500)
    assert _shape(batch["results"]) == _shape(singles)
    statuses = [r["status"] for r in batch["results"]]
    assert {s: statuses.count(s) for s in set(statuses)} == {
        201: 315, 200: 65, 409: 55, 400: 55, 404: 10}
    winners = [s["client_message_id"] for s, r in zip(sends, batch["results"], strict=True)
               if r["status"] == 201]
    assert len(set(winners)) == len(winners)
    # One message per winning key, for each sender, and nothing for anything else.
    for table in ("client_message_dedupe", "topic_message", "message_history"):
        assert counts[table] == 2 * (len(winners) + 1), table
    # Bob receives alice's messages in the order she sent them.
    assert [r.client_message_id for r in received] == ["early", *winners]
    # The frame's sends that passed B1 (all but the 55 400s) were one accept transaction.
    assert (after[0] - before[0], after[1] - before[1]) == (500 - 55, 1)


async def test_outbox_rows_go_as_stored_and_each_is_answered_as_its_own(tmp_path: Path) -> None:
    """A claimed batch as the daemon's link sends it, each row the bytes its outbox stored: a
    row from an older version (no traceparent) and one whose meta the broker refuses (deeper
    than it takes) sit among good ones; the bad one gets its own 400, the others arrive
    whole; the same rows again are duplicates, and a row that reuses a key for other content
    is a 409."""
    def row(body: str, meta: Any = None, traceparent: str | None = TRACEPARENT) -> bytes:
        return orjson.dumps(SendRequest(Destination.parse("topic:ops"), body.encode(), "utf8",
                                        Priority.NEXT, meta, None, None,
                                        traceparent=traceparent).to_payload())
    deep: Any = "leaf"
    for _ in range(META_DEPTH + 1):
        deep = {"d": deep}
    rows: list[tuple[str, dict[str, Any] | bytes]] = [
        ("a", row("héllo \"a\"", {"k": [1, None]})), ("old", row("from before", None, None)),
        ("deep", row("too deep", deep)), ("b", row("b"))]
    b, server = await _start(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        async with await b.link(b.bob) as inbox, await b.link(b.alice) as link:
            await inbox.resume(0, 0)
            first = await link.send_many(rows, 10)
            again = await link.send_many([rows[0], ("b", row("not b"))], 10)
            got: list[Frame] = []
            while len(got) < 3:   # one accept, so one frame as a rule; not relied on
                got += await asyncio.wait_for(inbox.deliveries.get(), 10)
    finally:
        await server.stop()
        await b.store.close()
    assert [r and r["status"] for r in first] == [201, 201, 400, 201]
    assert first[2] is not None and first[2]["error"]["field"] == "meta"
    assert [(d["client_message_id"], d["body"], d.get("meta")) for d in got] == [
        ("a", "héllo \"a\"", {"k": [1, None]}), ("old", "from before", None), ("b", "b", None)]
    assert [r and r["status"] for r in again] == [200, 409]
    assert again[0] is not None and first[0] is not None
    assert again[0]["broker_message_id"] == first[0]["broker_message_id"]
