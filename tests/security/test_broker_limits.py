"""What a member can do to the broker with big or unread frames (DESIGN §5.1, style §5.7).

An oversized frame closes its connection (1009) and stores nothing; a body over the message
limit is refused (4xx) and stores nothing, the connection lives on; a member that stops
reading its socket holds back only its own deliveries: the broker keeps them in the store, not
in memory, and other members keep sending and receiving.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from websockets.exceptions import ConnectionClosed

from tests.broker.conftest import now_ms
from tests.broker.test_server import Broker, _start, deliveries, payload, pub
from tidemesh.broker.server import BrokerServer
from tidemesh.core.wire import encode


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[Broker, BrokerServer, Path]]:
    db = tmp_path / "b.db"
    b, server = await _start(f"sqlite:///{db}")
    try:
        yield b, server, db
    finally:
        await server.stop()
        await b.store.close()


def _rows(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # noqa: S608
                for t in ("client_message_dedupe", "topic_message", "message_history",
                          "delivery_queue")}
    finally:
        conn.close()


async def test_an_oversized_frame_closes_1009_and_stores_nothing(
    broker: tuple[Broker, BrokerServer, Path],
) -> None:
    b, server, db = broker
    link = await b.link(b.alice)
    before = _rows(db)
    huge = {"type": "send", "id": "big", "client_message_id": "big",
            "to": {"kind": "topic", "ref": "ops"}, "body": "x" * (server.max_frame_bytes + 1),
            "body_encoding": "utf8", "priority": "next"}
    with contextlib.suppress(ConnectionClosed):  # the broker may close before it is all out
        await link.ws.send(encode(huge))
    await asyncio.wait_for(link.wait_closed(), 10)
    assert link.ws.close_code == 1009
    assert _rows(db) == before
    again = await b.link(b.alice)  # the broker itself is fine
    assert (await again.send("small", payload()))["status"] == 201
    await again.close()


async def test_a_body_over_the_limit_is_refused_and_stores_nothing(
    broker: tuple[Broker, BrokerServer, Path],
) -> None:
    b, _, db = broker
    link = await b.link(b.alice)
    before = _rows(db)
    answer = await link.send("too-big", payload(body="x" * ((1 << 20) + 1)))
    assert 400 <= answer["status"] < 500, answer
    assert _rows(db) == before
    assert (await link.send("fine", payload()))["status"] == 201  # the connection lived on
    await link.close()


async def test_a_member_that_stops_reading_holds_back_only_itself(
    broker: tuple[Broker, BrokerServer, Path],
) -> None:
    b, _, _ = broker
    carol = SigningKey.generate()
    await b.store.add_member(b.mesh_id, pub(carol), now_ms())
    await b.store.subscribe(b.mesh_id, "ops", pub(carol), now_ms())
    # bob's link stops reading its socket once one delivery is waiting for him.
    bob = await b.link(b.bob, delivery_buffer=1)
    reader = await b.link(carol)
    alice = await b.link(b.alice)
    assert (await bob.resume(0, 0))["result"] == "OK"
    assert (await reader.resume(0, 0))["result"] == "OK"
    n, body = 400, "y" * 65536  # 25 MiB for bob: more than the kernel buffers hold
    for i in range(0, n, 50):
        answers = await asyncio.gather(*(alice.send(f"m{j}", payload(body=body))
                                         for j in range(i, i + 50)))
        assert {a["status"] for a in answers} == {201}, "a stalled reader stalled a sender"
    got = await deliveries(reader, n, 30)
    assert [d["seq"] for d in got] == list(range(1, n + 1)), "another reader was held back"
    (bob_conn,) = b.service.conns[(b.mesh_id, pub(b.bob))]
    # The broker handed bob's socket only what the socket would take; the rest waits in the
    # store, not in the broker's memory.
    assert bob_conn.sent_seq < n
    assert bob_conn.peer.ws.transport.get_write_buffer_size() < 4 << 20  # type: ignore[attr-defined]
    # Once bob reads again, he gets everything, in order.
    seqs = [d["seq"] for d in await deliveries(bob, n, 30)]
    assert seqs == list(range(1, n + 1))
    for link in (alice, bob, reader):
        await link.close()
