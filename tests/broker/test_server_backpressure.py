"""Slow readers against a real broker on port 0: nobody waits on one member's socket.

A "sink" here is a member's connection that authenticated, resumed, and then stopped
reading, with a tiny receive buffer: whatever the broker writes to it piles up in the
broker's socket buffers, as it did for the members of issue #31's third finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import LIMITS, now_ms
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import Store
from tidemesh.core import handshake
from tidemesh.core.wire import CloseCode, decode, encode
from tidemesh.daemon.link.websocket import BrokerLink

HELLO_TIMEOUT_S = 2.0


def pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


@dataclass
class Mesh:
    url: str
    store: Store
    service: BrokerService
    server: BrokerServer
    mesh_id: str
    keys: dict[str, SigningKey]


@asynccontextmanager
async def running(tmp_path: Path, slow_reader_s: float) -> AsyncIterator[Mesh]:
    store = await open_store(f"sqlite:///{tmp_path / 'b.db'}")
    service = BrokerService(store, LIMITS)
    server = await BrokerServer(service, hello_timeout_s=HELLO_TIMEOUT_S,
                                slow_reader_s=slow_reader_s).start("127.0.0.1", 0)
    m = await store.create_mesh("team", now_ms())
    keys = {name: SigningKey.generate() for name in ("mallory", "sink", "bob")}
    for k in keys.values():
        await store.add_member(m.id, pub(k), now_ms())
    await store.create_topic(m.id, "flood", None, now_ms())
    await store.subscribe(m.id, "flood", pub(keys["sink"]), now_ms())
    try:
        yield Mesh(f"ws://127.0.0.1:{server.port}", store, service, server, m.id, keys)
    finally:
        await server.stop()
        await store.close()


async def sink(m: Mesh, resume: bool = True) -> ClientConnection:
    """A member's connection that reads the handshake (and resume_ack), then no more."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", int(m.url.rsplit(":")[-1])))
    # max_queue=1: websockets stops reading the socket as soon as one frame waits unread.
    ws = await connect(m.url, sock=sock, max_queue=1, compression=None, max_size=None,
                       ping_interval=None)
    nonce = decode(await ws.recv())["nonce"]
    pk, sig = handshake.sign(m.keys["sink"], m.mesh_id, nonce)
    await ws.send(encode({"type": "hello", "mesh_id": m.mesh_id, "pubkey": pk, "nonce": nonce,
                          "signature": sig}))
    assert decode(await ws.recv())["type"] == "hello_ack"
    if resume:
        await ws.send(encode({"type": "resume", "id": "r", "epoch": 0, "last_seq": 0}))
        assert decode(await ws.recv())["type"] == "resume_ack"
    return ws


def cut_off(m: Mesh) -> bool:
    return bool(m.service.metrics.registry.get_sample_value(
        "cm_broker_slow_readers_closed_total"))


def sink_conns(m: Mesh) -> list[Any]:
    return list(m.service.connections.conns.get((m.mesh_id, pub(m.keys["sink"])), ()))


async def flood_until_stuck(m: Mesh, sinks: int) -> None:
    """Mallory publishes 256 KiB messages to the sink's topic until the broker can write
    to none of the sink's connections (their socket buffers are full)."""
    async with await BrokerLink.connect(m.url, m.mesh_id, m.keys["mallory"]) as mallory:
        body = "x" * (256 << 10)
        for i in range(200):
            result = await mallory.send(f"f{i}", {"to": {"kind": "topic", "ref": "flood"},
                                                  "body": body, "body_encoding": "utf8",
                                                  "priority": "next", "meta": None,
                                                  "reply_to": None})
            assert result["status"] == 201
            await asyncio.sleep(0.01)
            conns = sink_conns(m)
            if len(conns) == sinks and all(
                    c.peer.ws.transport.get_write_buffer_size() > 0 for c in conns):
                return
            if cut_off(m):   # stuck long enough to be cut already
                return
    raise AssertionError("the sink's connections never filled up")


async def test_a_handshake_completes_while_other_members_do_not_read(tmp_path: Path) -> None:
    """Announcing a peer_join never waits on a member's full socket: bob's handshake ends
    within the hello deadline however many stuck connections the mesh has."""
    async with running(tmp_path, slow_reader_s=30.0) as mesh:
        sinks = [await sink(mesh) for _ in range(4)]
        try:
            await flood_until_stuck(mesh, len(sinks))
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                bob = await BrokerLink.connect(mesh.url, mesh.mesh_id, mesh.keys["bob"])
            await bob.close()
        finally:
            for ws in sinks:
                ws.transport.abort()


async def test_a_connection_that_takes_no_frame_is_cut_off(tmp_path: Path) -> None:
    """A reader that takes nothing for ``slow_reader_s`` is closed 4012 slow_reader; what it
    was sent before arrives in order, up to the close."""
    async with running(tmp_path, slow_reader_s=0.5) as mesh:
        ws = await sink(mesh)
        try:
            await flood_until_stuck(mesh, 1)
            async with asyncio.timeout(10):
                while not cut_off(mesh):
                    await asyncio.sleep(0.02)
            seqs = []
            async with asyncio.timeout(10):
                with contextlib.suppress(ConnectionClosed):
                    async for raw in ws:
                        frame = decode(raw)
                        if frame["type"] == "deliver":
                            seqs.append(frame["seq"])
            assert (ws.close_code, ws.close_reason) == (CloseCode.SLOW_READER, "slow_reader")
            assert seqs == list(range(1, len(seqs) + 1))
        finally:
            ws.transport.abort()
