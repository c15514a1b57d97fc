"""A member who connects learns who is present from one ``presence_snapshot`` frame, then
from numbered batches (issue #30 items 2 and 6): a real broker, real links, and a raw
socket to count the frames."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect

from tests.broker.conftest import LIMITS, now_ms
from tests.broker.test_member_storms import pub
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_cluster, open_store
from tidemesh.broker.store.base import Store
from tidemesh.core import features, handshake
from tidemesh.core.wire import decode, encode
from tidemesh.daemon.link.websocket import BrokerLink

MEMBERS = 50


@dataclass
class Running:
    url: str
    store: Store
    service: BrokerService
    mesh_id: str

    async def member(self) -> SigningKey:
        key = SigningKey.generate()
        await self.store.add_member(self.mesh_id, pub(key), now_ms())
        return key

    async def link(self, key: SigningKey, **kw: Any) -> BrokerLink:
        return await BrokerLink.connect(self.url, self.mesh_id, key, **kw)


@pytest.fixture
async def broker(store_url: str) -> AsyncIterator[Running]:
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS, cluster=open_cluster(store, "snap"))
    await service.peering.heartbeat()
    server = await BrokerServer(service).start("127.0.0.1", 0)
    mesh = await store.create_mesh("snap", now_ms())
    try:
        yield Running(f"ws://127.0.0.1:{server.port}", store, service, mesh.id)
    finally:
        await server.stop()
        await store.close()


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while True:
            held = check()
            if held if isinstance(held, bool) else await held:
                return
            await asyncio.sleep(0.02)


def present(link: BrokerLink) -> set[str] | None:
    known = link.known_peers()
    return None if known is None else {p["pubkey"] for p in known}


async def raw_member(url: str, mesh_id: str, key: SigningKey,
                     optional: tuple[str, ...]) -> ClientConnection:
    """A member's handshake by hand, up to its negotiation's answer."""
    ws = await connect(url, max_size=None)
    nonce = decode(await ws.recv())["nonce"]
    pk, sig = handshake.sign(key, mesh_id, nonce)
    await ws.send(encode({"type": "hello", "mesh_id": mesh_id, "pubkey": pk, "nonce": nonce,
                          "signature": sig}))
    assert decode(await ws.recv())["type"] == "hello_ack"
    await ws.send(encode({"type": "feature_negotiation_request", "id": "f",
                          "require": list(features.REQUIRED), "optional": list(optional)}))
    while decode(await ws.recv())["type"] != "feature_negotiation_response":
        pass   # presence before the answer: the daemon drops it
    return ws


def entries_told(broker: Running) -> dict[str, float]:
    """cm_broker_presence_entries_total by kind."""
    return {kind: broker.service.metrics.registry.get_sample_value(
        "cm_broker_presence_entries_total", {"kind": kind}) or 0.0
        for kind in ("event", "snapshot")}


async def test_a_newcomer_gets_one_snapshot_of_fifty_members_not_fifty_joins(
    broker: Running,
) -> None:
    keys = [await broker.member() for _ in range(MEMBERS)]
    links = list(await asyncio.gather(*(broker.link(k, open_timeout=60) for k in keys)))
    newcomer = await broker.member()
    try:
        # Every join of theirs told (the window flushed): none is still to come.
        await until(lambda: not broker.service.connections.pending)
        before = entries_told(broker)
        ws = await raw_member(broker.url, broker.mesh_id, newcomer,
                              (features.PRESENCE_BATCH, features.PRESENCE_SNAPSHOT))
        frames: list[dict[str, Any]] = []
        # Read until the batch that tells the newcomer's own join (the mesh's one frame
        # names it too): everything about the others came before it.
        async with asyncio.timeout(30):
            while not any(f["type"] == "presence_batch" and f["events"][-1]["pubkey"]
                          == pub(newcomer) for f in frames):
                frames.append(decode(await ws.recv()))
        # One snapshot: its frames (the shared part, then the newcomer's own) end once.
        snapshots = [f for f in frames if f["type"] == "presence_snapshot"]
        assert [bool(f.get("more")) for f in snapshots][-1:] == [False]
        assert not [f for f in snapshots[:-1] if not f.get("more")]
        assert {f["seq"] for f in snapshots} == {snapshots[0]["seq"]}
        assert {p["pubkey"] for f in snapshots for p in f["peers"]} == {
            pub(k) for k in (*keys, newcomer)}
        assert not [f for f in frames if f["type"] in ("peer_join", "peer_leave")]
        told = [e["pubkey"] for f in frames if f["type"] == "presence_batch"
                for e in f["events"]]
        assert set(told) == {pub(newcomer)}
        assert all(f["seq"] > snapshots[0]["seq"] for f in frames
                   if f["type"] == "presence_batch")
        # What the operator sees: the newcomer's snapshot of 51 entries, and its one join
        # told to each of the 51 connected (the batch names the newcomer too).
        after = entries_told(broker)
        assert after["snapshot"] - before["snapshot"] == MEMBERS + 1
        assert after["event"] - before["event"] == MEMBERS + 1
        await ws.close()
    finally:
        await asyncio.gather(*(link.close() for link in links))


async def test_a_link_knows_who_is_there_from_the_snapshot_and_follows_the_changes(
    broker: Running,
) -> None:
    a_key, b_key, c_key = await broker.member(), await broker.member(), await broker.member()
    a = await broker.link(a_key)
    b = await broker.link(b_key)
    c: BrokerLink | None = None
    try:
        await until(lambda: present(b) is not None)
        assert present(b) == {pub(a_key), pub(b_key)}
        # Its peers answer is the broker's, without asking it.
        assert {p["pubkey"] for p in await b.peers()} == present(b)
        await a.set_profile({"status": "dnd", "summary": "on call"})
        await until(lambda: any(p["profile"].get("status") == "dnd"
                                for p in b.known_peers() or () if p["pubkey"] == pub(a_key)))
        c = await broker.link(c_key)
        await until(lambda: present(b) == {pub(a_key), pub(b_key), pub(c_key)})
        await a.close()
        await until(lambda: present(b) == {pub(b_key), pub(c_key)})
        # The events a daemon records are the ones it always had: joins and leaves only.
        heard = []
        while not b.presence.empty():
            heard.append(b.presence.get_nowait())
        assert {f["type"] for f in heard} <= {"peer_join", "peer_leave"}
        assert [(f["type"], f["pubkey"]) for f in heard][-2:] == [
            ("peer_join", pub(c_key)), ("peer_leave", pub(a_key))]
        assert not [f for f in heard if "connections" in f]
    finally:
        for link in (a, b, c):
            if link is not None:
                await link.close()


async def test_a_daemon_without_the_feature_gets_no_snapshot_and_asks(
    broker: Running,
) -> None:
    a_key, old_key = await broker.member(), await broker.member()
    older = tuple(f for f in features.OPTIONAL if f != features.PRESENCE_SNAPSHOT)
    old = await broker.link(old_key, optional=older)
    a = await broker.link(a_key)
    try:
        assert old.state.peerset is None and old.known_peers() is None
        await a.set_profile({"status": "away"})   # a peer_update: never to this daemon
        joined = await asyncio.wait_for(old.presence.get(), 10)
        assert joined["type"] == "peer_join" and "connections" not in joined
        assert {p["pubkey"] for p in await old.peers()} == {pub(a_key), pub(old_key)}
        await a.close()
        left = await asyncio.wait_for(old.presence.get(), 10)
        assert left["type"] == "peer_leave"
    finally:
        with contextlib.suppress(Exception):
            await a.close()
        await old.close()


async def test_a_daemon_on_demand_is_told_of_nobody_and_asks_who_is_there(
    broker: Running,
) -> None:
    """``presence.feed`` false: the daemon asks for presence_on_demand, and no presence of
    any kind comes to it (in a storm of N members, the N² entries it would have read), while
    the others keep theirs and ``peers`` answers it from the broker."""
    quiet_key, a_key, b_key = await broker.member(), await broker.member(), await broker.member()
    quiet = await broker.link(quiet_key, optional=features.OPTIONAL_ON_DEMAND)
    a = await broker.link(a_key)
    b: BrokerLink | None = None
    try:
        assert quiet.state.peerset is None and quiet.known_peers() is None
        b = await broker.link(b_key)
        await a.set_profile({"status": "away"})
        await until(lambda: present(a) == {pub(a_key), pub(b_key), pub(quiet_key)})
        await b.close()
        await until(lambda: present(a) == {pub(a_key), pub(quiet_key)})
        await until(lambda: not broker.service.connections.pending)
        await asyncio.sleep(0.2)   # a flush under way has queued on every listener by now
        assert quiet.presence.empty()
        assert {p["pubkey"] for p in await quiet.peers()} == {pub(a_key), pub(quiet_key)}
    finally:
        for link in (quiet, a, b):
            if link is not None:
                with contextlib.suppress(Exception):
                    await link.close()
