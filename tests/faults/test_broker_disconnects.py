"""A member whose connection drops (kill -9, a cut cable) is a normal event at the broker.

Found by the fault harness: every daemon kill and every cut logged ``broker_connection_failed``
at error level with a traceback, and the broker tried to close with 1011, because the
``ConnectionClosedError`` from the read loop came out of the TaskGroup wrapped in an
``ExceptionGroup`` that ``except ConnectionClosed`` does not catch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from tests.broker import test_server as server_tests
from tests.broker.test_server import Broker, _start, payload, pub
from tests.conftest import unavailable
from tests.faults.pgcluster import PgCluster, unavailable_reason
from tidemesh.core.wire import CloseCode
from tidemesh.daemon.link.websocket import HandshakeRejected

broker = server_tests.broker  # the in-process broker fixture of tests/broker


async def test_a_dropped_connection_is_not_an_error(broker: Broker) -> None:
    with capture_logs() as logs:
        for i in range(3):
            link = await broker.link(broker.alice)
            assert (await link.send(f"c{i}", payload()))["status"] == 201
            link.ws.transport.abort()  # the daemon's process died: no close frame
            await asyncio.wait_for(link.wait_closed(), 5)
            for _wait in range(100):
                if (broker.mesh_id, pub(broker.alice)) not in broker.service.conns or \
                        not broker.service.conns[(broker.mesh_id, pub(broker.alice))]:
                    break
                await asyncio.sleep(0.02)
    events = [e["event"] for e in logs]
    assert "broker_member_disconnected" in events
    assert "broker_connection_failed" not in events, [e for e in logs
                                                      if e["log_level"] == "error"]


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    reason = unavailable_reason()
    if reason is not None:
        unavailable(reason)
    c = PgCluster.create()
    try:
        c.start()
        yield c
    finally:
        c.destroy()


async def test_a_member_arriving_while_postgresql_is_down_is_told_to_come_back(
    cluster: PgCluster,
) -> None:
    """Found by the fault harness: during a PostgreSQL restart every connecting member was
    closed 1011 internal_error and the broker logged broker_connection_failed at error
    level. A database outage is not a broker fault: 1013 try-again-later, a warning."""
    b, server = await _start(await asyncio.to_thread(cluster.create_database, "tm"))
    try:
        await asyncio.to_thread(cluster.stop)
        with capture_logs() as logs, pytest.raises(HandshakeRejected) as refused:
            await b.link(b.alice)
        assert (refused.value.code, refused.value.reason) == (CloseCode.TRY_AGAIN_LATER,
                                                              "store_unavailable")
        assert refused.value.retryable
        events = {e["event"]: e["log_level"] for e in logs}
        assert events.get("broker_connection_closed_store_unavailable") == "warning"
        assert "broker_connection_failed" not in events
        await asyncio.to_thread(cluster.start)
        async with await b.link(b.alice) as link:  # and it does come back
            assert (await link.send("after", payload()))["status"] == 201
    finally:
        await server.stop()
        await b.store.close()


async def test_the_accept_writers_survive_postgresql_restarting_under_load(
    cluster: PgCluster,
) -> None:
    """Found by a long fault run: a fast shutdown during a batch left the writer's connection
    mid-operation; the savepoint retry on it raised InternalClientError, which killed the
    writer and so the broker. Such a batch is answered 5xx (the daemon retries) and the
    writer goes on with a new connection."""
    b, server = await _start(await asyncio.to_thread(cluster.create_database, "tm"))
    statuses: list[int] = []
    stop = asyncio.Event()

    async def sender(n: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                async with await b.link(b.alice) as link:
                    while not stop.is_set():
                        answer = await link.send(f"w{n}-{i}", payload())
                        statuses.append(int(answer["status"]))
                        i += 1
            except Exception:  # refused while the database is down: go on
                await asyncio.sleep(0.05)

    try:
        tasks = [asyncio.create_task(sender(n)) for n in range(8)]
        for _ in range(5):
            await asyncio.sleep(0.3)
            await asyncio.to_thread(cluster.restart, "fast")
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        assert all(not t.done() for t in b.store.writer_tasks), "a writer died"
        async with await b.link(b.alice) as link:
            assert (await link.send("after", payload()))["status"] == 201
        assert 201 in statuses
    finally:
        await server.stop()
        await b.store.close()
