"""The WebSocket protocol end to end: a real broker on port 0, real links, real stores."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from nacl.signing import SigningKey
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import LIMITS, now_ms
from tidemesh.broker import admin
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import UNLIMITED, BrokerService
from tidemesh.broker.service.delivery import (
    BATCH_HEAD,
    BATCH_TAIL,
    PUMP_PAGE,
    PUMP_PAGE_MIN,
    PUMP_ROWS,
    batch_groups,
    page_size,
)
from tidemesh.broker.service.send import B1_SLICE
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import Store
from tidemesh.core import features, handshake
from tidemesh.core.metrics import render
from tidemesh.core.paths import daemon_paths
from tidemesh.core.ratelimit import Rate
from tidemesh.core.wire import decode, encode
from tidemesh.daemon.link.websocket import BrokerLink, FeatureUnavailable, HandshakeRejected
from tidemesh.daemon.membership.join import MeshConfig, join


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


@dataclass
class Broker:
    url: str
    port: int
    store: Store
    service: BrokerService
    mesh_id: str
    alice: SigningKey
    bob: SigningKey

    async def link(self, key: SigningKey, **kw: Any) -> BrokerLink:
        return await BrokerLink.connect(self.url, self.mesh_id, key, **kw)


async def _start(store_url: str, member_rate: Rate = UNLIMITED) -> tuple[Broker, BrokerServer]:
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS, member_rate=member_rate)
    server = await BrokerServer(service, max_bad=5, bad_window_s=60).start("127.0.0.1", 0)
    mesh = await store.create_mesh("team", now_ms())
    alice, bob = SigningKey.generate(), SigningKey.generate()
    for k in (alice, bob):
        await store.add_member(mesh.id, pub(k), now_ms())
    await store.create_topic(mesh.id, "ops", None, now_ms())
    await store.subscribe(mesh.id, "ops", pub(bob), now_ms())
    b = Broker(f"ws://127.0.0.1:{server.port}", server.port, store, service, mesh.id, alice, bob)
    return b, server


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b, server = await _start(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        yield b
    finally:
        await server.stop()
        await b.store.close()


def payload(body: str = "hi", ref: str = "ops", **kw: Any) -> dict[str, Any]:
    return {"to": {"kind": "topic", "ref": ref}, "body": body, "body_encoding": "utf8",
            "priority": "next", "meta": None, "reply_to": None, **kw}


async def test_member_connects_negotiates_and_sends(broker: Broker) -> None:
    async with await broker.link(broker.alice) as link:
        assert link.hello_ack["mesh_name"] == "team"
        p = link.supported[features.DEDUPE]["params"]
        assert p == {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": 7,
                     "request_fingerprint": True}
        first = await link.send("c1", payload())
        again = await link.send("c1", payload())
        clash = await link.send("c1", payload(body="other"))
    assert (first["status"], first["duplicate"]) == (201, False)
    assert (again["status"], again["duplicate"], again["history_available"]) == (200, True, True)
    assert again["broker_message_id"] == first["broker_message_id"]
    assert again["first_seen_at"] == first.get("first_seen_at", again["first_seen_at"])
    assert clash["status"] == 409 and clash["error"]["code"] == "idempotency_key_reused"
    assert len(clash["broker_fingerprint_prefix"]) == 16


async def test_unknown_topic_is_4xx_then_succeeds_over_the_wire(broker: Broker) -> None:
    async with await broker.link(broker.alice) as link:
        miss = await link.send("c1", payload(ref="later"))
        assert miss["status"] == 404 and miss["error"]["code"] == "unknown_destination"
        assert (await link.request("topic_create", "later"))["ok"] is True
        assert (await link.send("c1", payload(ref="later")))["status"] == 201


async def test_hundred_same_id_sends_over_several_connections(store_url: str) -> None:
    b, server = await _start(store_url)
    try:
        links = [await b.link(b.alice) for _ in range(4)]
        results = await asyncio.gather(*(links[i % 4].send("same", payload()) for i in range(100)))
        for link in links:
            await link.close()
        assert [r["status"] for r in results].count(201) == 1
        assert {r["status"] for r in results} == {200, 201}
        assert len({r["broker_message_id"] for r in results}) == 1
        counts = await b.store.counts()
        assert (counts["client_message_dedupe"], counts["topic_message"],
                counts["message_history"], counts["delivery_queue"]) == (1, 1, 1, 0)
    finally:
        await server.stop()
        await b.store.close()


async def test_non_member_is_closed_4002(broker: Broker) -> None:
    with pytest.raises(HandshakeRejected) as info:
        await broker.link(SigningKey.generate())
    assert (info.value.code, info.value.reason) == (4002, "unknown_member")


async def test_revoked_member_is_closed_4002_even_when_connected(broker: Broker) -> None:
    link = await broker.link(broker.alice)
    await broker.store.revoke_member(broker.mesh_id, pub(broker.alice), now_ms())
    await broker.service.recheck_members()
    await asyncio.wait_for(link.wait_closed(), 5)
    assert link.ws.close_code == 4002
    with pytest.raises(HandshakeRejected) as info:
        await broker.link(broker.alice)
    assert (info.value.code, info.value.reason) == (4002, "member_revoked")


async def _raw_hello(url: str, frame: dict[str, Any]) -> tuple[int | None, str]:
    async with connect(url) as ws:
        decode(await ws.recv())
        await ws.send(encode(frame))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        return ws.close_code, ws.close_reason or ""


async def _hello(ws: Any, b: Broker) -> None:
    """Answer the challenge as alice and read the hello_ack (a raw socket, no BrokerLink)."""
    nonce = decode(await ws.recv())["nonce"]
    pk, sig = handshake.sign(b.alice, b.mesh_id, nonce)
    await ws.send(encode({"type": "hello", "mesh_id": b.mesh_id, "pubkey": pk, "nonce": nonce,
                          "signature": sig}))
    assert decode(await ws.recv())["type"] == "hello_ack"


async def test_bad_signature_is_closed_1008(broker: Broker) -> None:
    async with connect(broker.url) as ws:
        nonce = decode(await ws.recv())["nonce"]
        _pk, sig = handshake.sign(SigningKey.generate(), broker.mesh_id, nonce)
        await ws.send(encode({"type": "hello", "mesh_id": broker.mesh_id,
                              "pubkey": pub(broker.alice), "nonce": nonce, "signature": sig}))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert (ws.close_code, ws.close_reason) == (1008, "bad_signature")


async def test_replayed_hello_is_closed_1008(broker: Broker) -> None:
    async with connect(broker.url) as ws:
        nonce = decode(await ws.recv())["nonce"]
        pk, sig = handshake.sign(broker.alice, broker.mesh_id, nonce)
        captured = {"type": "hello", "mesh_id": broker.mesh_id, "pubkey": pk, "nonce": nonce,
                    "signature": sig}
        await ws.send(encode(captured))
        assert decode(await ws.recv())["type"] == "hello_ack"
    assert await _raw_hello(broker.url, captured) == (1008, "nonce_replayed")


async def test_bad_frames_get_error_frames_and_a_flood_closes(broker: Broker) -> None:
    link = await broker.link(broker.alice)
    await link.ws.send("{not json")
    await link.ws.send(encode({"type": "send", "id": "x1", "client_message_id": "c"}))
    assert (await link.send("ok", payload()))["status"] == 201  # the connection survived
    for _ in range(10):
        await link.ws.send("[]")
    await asyncio.wait_for(link.wait_closed(), 5)
    assert (link.ws.close_code, link.ws.close_reason) == (1008, "too_many_bad_frames")


async def test_error_frame_names_the_field(broker: Broker) -> None:
    async with connect(broker.url) as ws:
        await _hello(ws, broker)
        await ws.send(encode({"type": "send", "id": "x1", "client_message_id": "c",
                              "to": {"kind": "fax", "ref": "x"}, "body": "b",
                              "body_encoding": "utf8", "priority": "next"}))
        err = decode(await ws.recv())
    assert err["type"] == "error" and err["id"] == "x1"
    assert err["error"]["code"] == "invalid_frame" and err["error"]["field"].startswith("to")


async def test_missing_required_feature_closes_4010(broker: Broker) -> None:
    with pytest.raises(FeatureUnavailable) as info:
        await broker.link(broker.alice, require=(features.DEDUPE, "key_epoch"))
    assert info.value.reason.kind == "feature_unavailable"
    assert info.value.reason.feature == "key_epoch"


async def test_retention_below_floor_closes_4010_with_close_reason() -> None:
    seen: list[tuple[int | None, str | None]] = []
    key = SigningKey.generate()

    async def low_retention_broker(ws: ServerConnection) -> None:
        nonce = handshake.new_nonce()
        await ws.send(encode({"type": "challenge", "nonce": nonce, "protocol": 1}))
        hello = decode(await ws.recv())
        await ws.send(encode({"type": "hello_ack", "mesh_id": hello["mesh_id"],
                              "mesh_name": "m", "pubkey": hello["pubkey"],
                              "session_id": hello["mesh_id"]}))
        req = decode(await ws.recv())
        await ws.send(encode({"type": "feature_negotiation_response", "id": req["id"],
                              "supported": features.advertise("retention_scoped", 2, 4096),
                              "missing_required": []}))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        seen.append((ws.close_code, ws.close_reason))

    async with serve(low_retention_broker, "127.0.0.1", 0) as srv:
        port = next(iter(srv.sockets)).getsockname()[1]
        with pytest.raises(FeatureUnavailable, match="client_message_id_dedupe"):
            await BrokerLink.connect(f"ws://127.0.0.1:{port}", "01J0000000000000000000000A", key)
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.05)
    code, reason = seen[0]
    assert code == 4010
    assert json.loads(reason or "")["kind"] == "feature_param_below_floor"
    assert json.loads(reason or "")["feature"] == "client_message_id_dedupe"


async def test_deliveries_are_gapless_acked_and_resumable(broker: Broker) -> None:
    alice = await broker.link(broker.alice)
    bob = await broker.link(broker.bob)
    assert (await bob.resume(0, 0))["result"] == "OK"
    for i in range(3):
        await alice.send(f"c{i}", payload(body=f"m{i}"))
    got = await deliveries(bob, 3)
    assert [(d["seq"], d["body"]) for d in got] == [(1, "m0"), (2, "m1"), (3, "m2")]
    assert got[0]["sender_pubkey"] == pub(broker.alice) and got[0]["client_message_id"] == "c0"
    await bob.ack(1, 2)
    await bob.close()
    bob = await broker.link(broker.bob)
    again = await bob.resume(1, 2)
    assert (again["result"], again["broker_last_seq"]) == ("OK", 3)
    assert (await deliveries(bob, 1))[0]["seq"] == 3
    assert (await bob.resume(1, 9))["result"] == "INVALID_SEQUENCE"
    assert (await bob.resume(7, 1))["result"] == "STALE_SEQUENCE"
    await bob.close()
    await alice.close()
    assert (await broker.store.cursor(broker.mesh_id, pub(broker.bob))).acked_seq == 2


async def deliveries(link: BrokerLink, n: int, timeout: float = 5) -> list[dict[str, Any]]:
    """``n`` deliveries off the link, however the broker framed them."""
    got: list[dict[str, Any]] = []
    while len(got) < n:
        got += await asyncio.wait_for(link.deliveries.get(), timeout)
    return got


async def _backlog(broker: Broker, n: int) -> None:
    async with await broker.link(broker.alice) as alice:
        await asyncio.gather(*(alice.send(f"c{i:03d}", payload(body=f"m{i}")) for i in range(n)))


async def test_a_backlog_goes_out_in_batch_frames_and_one_ack_covers_them(
    broker: Broker
) -> None:
    await _backlog(broker, 300)
    async with await broker.link(broker.bob) as bob:
        assert features.DELIVER_BATCH in bob.supported
        assert (await bob.resume(0, 0))["result"] == "OK"
        frames = [await asyncio.wait_for(bob.deliveries.get(), 5) for _ in range(2)]
        assert [len(f) for f in frames] == [features.DELIVER_BATCH_MAX_COUNT, 300 - 256]
        assert [d["seq"] for f in frames for d in f] == list(range(1, 301))
        assert all(d["type"] == "deliver" for f in frames for d in f)
        await bob.ack(1, 300)  # cumulative: every delivery up to 300
        rows = broker.store.deliveries_after
        await _until(lambda: _acked(broker, 300))
        assert len(await rows(broker.mesh_id, pub(broker.bob), 1, 0, 1000)) == 300
    text = render(broker.service.metrics.registry).decode()
    assert "cm_broker_deliver_batch_size_count 2.0" in text
    assert "cm_broker_deliveries_sent_total 300.0" in text


async def _acked(broker: Broker, seq: int) -> bool:
    return (await broker.store.cursor(broker.mesh_id, pub(broker.bob))).acked_seq == seq


async def _until(check: Any, timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)


async def test_a_daemon_that_did_not_negotiate_batches_gets_one_deliver_frame_each(
    broker: Broker
) -> None:
    await _backlog(broker, 20)
    async with await broker.link(broker.bob, optional=()) as bob:
        assert (await bob.resume(0, 0))["result"] == "OK"
        frames = [await asyncio.wait_for(bob.deliveries.get(), 5) for _ in range(20)]
    assert [len(f) for f in frames] == [1] * 20
    assert [f[0]["seq"] for f in frames] == list(range(1, 21))


def test_a_pump_page_shrinks_with_the_connections_open_within_its_bounds() -> None:
    assert page_size(1) == PUMP_PAGE
    assert page_size(1000) == 32
    assert page_size(1_000_000) == PUMP_PAGE_MIN
    assert all(page_size(n) * n <= PUMP_ROWS for n in range(1, PUMP_ROWS // PUMP_PAGE_MIN + 1))


def test_batch_groups_keep_order_within_the_count_and_byte_caps() -> None:
    items = [{"seq": i, "body": "x" * size} for i, size in enumerate([10, 10, 10, 500, 10, 10])]
    parts = [orjson.dumps(i) for i in items]
    groups = batch_groups(parts, max_count=2, max_bytes=10_000)
    assert groups == [(0, 2), (2, 4), (4, 6)]
    groups = batch_groups(parts, max_count=10, max_bytes=200)
    assert groups == [(0, 3), (3, 4), (4, 6)]
    for first, end in groups:
        if end - first > 1:
            frame = encode({"type": "deliver_batch", "deliveries": items[first:end]}).encode()
            assert len(frame) <= 200
            assert frame == BATCH_HEAD + b",".join(parts[first:end]) + BATCH_TAIL
    assert batch_groups([]) == []


async def test_metrics_are_served_on_the_same_port(broker: Broker) -> None:
    async with await broker.link(broker.alice) as link:
        await link.send("c1", payload())
        await link.send("c1", payload(body="x"))

    def fetch() -> tuple[str, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.port}/metrics") as r:
            return r.headers["Content-Type"], r.read().decode()

    ctype, text = await asyncio.to_thread(fetch)
    assert ctype.startswith("text/plain")
    assert 'cm_broker_accept_total{status="201"} 1.0' in text
    assert "cm_broker_dedupe_fingerprint_mismatch_total{" in text
    assert "cm_broker_connections_active" in text


async def test_join_registers_the_key_and_saves_mesh_config(
    broker: Broker, tmp_path: Path
) -> None:
    inv = await admin.create_invite(broker.store, "team", [broker.url], 1, "1h")
    paths = daemon_paths("team", {"TIDEMESH_HOME": str(tmp_path / "home")})
    config = (await join(inv.text, paths, "team", display_name="laptop")).config
    assert MeshConfig.load(paths.mesh_file) == config
    assert (paths.mesh_file.stat().st_mode & 0o777) == 0o600
    assert config.mesh_id == broker.mesh_id and config.broker_url == broker.url
    member = await broker.store.get_member(broker.mesh_id, config.member_pubkey)
    assert member is not None and member.display_name == "laptop"
    from tidemesh.daemon.membership.identity import load_or_create_keypair

    key, created = load_or_create_keypair(paths.keypair)
    assert not created
    async with await broker.link(key.signing_key) as link:
        assert link.hello_ack["pubkey"] == config.member_pubkey
    other = daemon_paths("team", {"TIDEMESH_HOME": str(tmp_path / "home2")})
    with pytest.raises(HandshakeRejected) as info:
        await join(inv.text, other, "team")  # single-use invite
    assert info.value.reason == "invite_invalid:used_up"


async def test_peers_and_presence_events(broker: Broker) -> None:
    alice = await broker.link(broker.alice)
    bob = await broker.link(broker.bob)
    joined = await asyncio.wait_for(alice.presence.get(), 5)
    assert (joined["type"], joined["pubkey"]) == ("peer_join", pub(broker.bob))
    peers = await alice.peers()
    assert sorted(p["pubkey"] for p in peers) == sorted([pub(broker.alice), pub(broker.bob)])
    await bob.close()
    left = await asyncio.wait_for(alice.presence.get(), 5)
    assert (left["type"], left["pubkey"]) == ("peer_leave", pub(broker.bob))
    await alice.close()


async def test_a_connection_that_never_says_hello_is_closed(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'b.db'}")
    server = await BrokerServer(BrokerService(store, LIMITS), hello_timeout_s=0.3).start(
        "127.0.0.1", 0)
    try:
        async with connect(f"ws://127.0.0.1:{server.port}") as ws:
            decode(await ws.recv())
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert (ws.close_code, ws.close_reason) == (1008, "hello_timeout")
    finally:
        await server.stop()
        await store.close()


async def test_send_batch_answers_each_item_and_a_bad_item_alone(broker: Broker) -> None:
    async with connect(broker.url) as ws:
        await _hello(ws, broker)
        item = {"client_message_id": "c1", **payload()}
        await ws.send(encode({"type": "send_batch", "id": "b1", "sends": [
            {"id": "a", **item},
            {"id": "b", **item, "to": {"kind": "fax", "ref": "x"}},
            {"id": "c", **item, "client_message_id": "c2", "body": "two"},
        ]}))
        answer = decode(await ws.recv())
        await ws.send(encode({"type": "send_batch", "id": "b2", "sends": [{"id": "d", **item}]}))
        again = decode(await ws.recv())
    assert answer["type"] == "send_results" and answer["id"] == "b1"
    by_id = {r["id"]: r for r in answer["results"]}
    assert (by_id["a"]["status"], by_id["b"]["status"], by_id["c"]["status"]) == (201, 400, 201)
    assert by_id["b"]["error"]["code"] == "invalid_frame"
    assert again["results"][0]["status"] == 200
    assert again["results"][0]["broker_message_id"] == by_id["a"]["broker_message_id"]


async def test_one_connections_sends_are_accepted_in_the_order_they_arrived(
    store_url: str,
) -> None:
    """Lone sends and send_batch frames written back to back (as a daemon's link coalesces
    them) reach the recipient in the order they left the sender, on either store; also
    frames big enough that their B1 is done a slice at a time."""
    b, server = await _start(store_url)
    frames: list[dict[str, Any]] = []
    expected: list[str] = []
    for n in range(40):
        if n % 3 == 0:
            cmid = f"m{len(expected)}"
            expected.append(cmid)
            frames.append({"type": "send", "id": cmid, "client_message_id": cmid, **payload()})
        else:
            size = 3 * B1_SLICE if n % 10 == 5 else n % 3 + 1
            cmids = [f"m{len(expected) + i}" for i in range(size)]
            expected += cmids
            frames.append({"type": "send_batch", "id": f"b{n}", "sends": [
                {"id": c, "client_message_id": c, **payload()} for c in cmids]})
    try:
        async with connect(b.url) as ws:
            await _hello(ws, b)
            for f in frames:
                await ws.send(encode(f))
            answered = 0
            while answered < len(expected):
                answer = decode(await ws.recv())
                answered += len(answer["results"]) if answer["type"] == "send_results" else 1
        await b.store.hand_out(b.mesh_id, pub(b.bob), 0)   # what bob's pump does first
        rows = await b.store.deliveries_after(b.mesh_id, pub(b.bob), 1, 0, 1000)
    finally:
        await server.stop()
        await b.store.close()
    assert [r.client_message_id for r in rows] == expected


async def test_a_profile_flood_reaches_the_others_as_a_few_presence_events(
    broker: Broker,
) -> None:
    """1,000 profile frames toggling ``visible`` (issue #31.6: each became a presence event
    in every member's events table): the others hear a handful, and the last state."""
    alice = await broker.link(broker.alice)
    bob = await broker.link(broker.bob)
    heard: list[dict[str, Any]] = []

    async def listen() -> None:
        while True:
            heard.append(await alice.presence.get())

    listening = asyncio.create_task(listen())
    try:
        async def bob_joined() -> bool:
            return any(f["type"] == "peer_join" for f in heard)

        async def bob_hidden() -> bool:   # the last state told, and the one peers shows
            return (bool(heard) and heard[-1]["type"] == "peer_leave"
                    and pub(broker.bob) not in [p["pubkey"] for p in await alice.peers()])

        await _until(bob_joined)
        heard.clear()
        for i in range(1000):
            await bob.set_profile({"visible": i % 2 == 0})   # the last one hides bob
        await _until(bob_hidden, timeout=10)
        assert len(heard) <= 20
    finally:
        listening.cancel()
        await alice.close()
        await bob.close()


async def test_a_member_reconnecting_in_a_loop_reaches_the_others_as_a_few_presence_events(
    broker: Broker,
) -> None:
    """Each connection of a member that comes and goes was a peer_join and a peer_leave in
    every other member's events: past its presence budget, only its latest state goes out."""
    alice = await broker.link(broker.alice)
    heard: list[dict[str, Any]] = []

    async def listen() -> None:
        while True:
            heard.append(await alice.presence.get())

    async def bob_gone() -> bool:   # the last state told, and the one peers shows
        return (bool(heard) and heard[-1]["type"] == "peer_leave"
                and pub(broker.bob) not in [p["pubkey"] for p in await alice.peers()])

    listening = asyncio.create_task(listen())
    try:
        for _ in range(100):
            link = await broker.link(broker.bob)
            await link.close()
        await _until(bob_gone, timeout=10)
        # A flush window holds the member's latest state only: its last leave may be all.
        assert 1 <= len(heard) <= 30
        assert {f["pubkey"] for f in heard} == {pub(broker.bob)}
    finally:
        listening.cancel()
        await alice.close()


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_the_traceparent_is_kept_and_delivered_only_to_a_daemon_that_asked(
    broker: Broker
) -> None:
    async with await broker.link(broker.alice) as alice:
        assert features.TRACE_CONTEXT in alice.supported
        assert (await alice.send("t1", payload(traceparent=TRACE)))["status"] == 201
    async with await broker.link(broker.bob) as bob:
        assert (await bob.resume(0, 0))["result"] == "OK"
        assert (await deliveries(bob, 1))[0]["traceparent"] == TRACE
    # A daemon from before trace context (its deliver schema allows no such field).
    async with await broker.link(broker.bob, optional=(features.DELIVER_BATCH,)) as old:
        assert (await old.resume(0, 0))["result"] == "OK"
        assert "traceparent" not in (await deliveries(old, 1))[0]


async def test_a_daemon_sends_no_traceparent_to_a_broker_that_does_not_advertise_it(
    broker: Broker
) -> None:
    # This broker as one from before trace context would advertise itself.
    del broker.service.negotiation.supported[features.TRACE_CONTEXT]
    async with await broker.link(broker.alice) as alice:
        assert (await alice.send("t2", payload(traceparent=TRACE)))["status"] == 201
    await broker.store.hand_out(broker.mesh_id, pub(broker.bob), 0)
    rows = await broker.store.deliveries_after(broker.mesh_id, pub(broker.bob), 1, 0, 10)
    assert rows[0].traceparent != TRACE, "the frame carried it anyway"
