"""A member whose connection drops (kill -9, a cut cable) is a normal event at the broker.

Found by the fault harness: every daemon kill and every cut logged ``broker_connection_failed``
at error level with a traceback, and the broker tried to close with 1011, because the
``ConnectionClosedError`` from the read loop came out of the TaskGroup wrapped in an
``ExceptionGroup`` that ``except ConnectionClosed`` does not catch.
"""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from tests.broker import test_server as server_tests
from tests.broker.test_server import Broker, payload, pub

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
