"""A connection's delivery pump stops when cancelled, even when the cancel reaches it as a
store error (asyncpg turns a query cancelled on a connection PostgreSQL just dropped into a
connection error). It used to take that for an outage, back off and go on: the connection's
TaskGroup then waited for it for good, and the broker read nothing more from that member
while its socket stayed open (found by the three-broker fault run, a PostgreSQL restart)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tests.lost_cancel import CancelAsOutage
from tidemesh.broker.service.connections import Conn
from tidemesh.broker.service.delivery import Deliveries
from tidemesh.core.errors import Unavailable


class PumpStore(CancelAsOutage):
    """The one store call a pump makes first, whose cancel comes back as an outage."""

    outage_errors = (Unavailable, ConnectionResetError)

    async def hand_out_page(self, *_: Any, **__: Any) -> tuple[bool, list[Any]]:
        await self.call()
        raise AssertionError("unreachable")


async def test_a_pump_cancelled_mid_query_stops_even_if_the_store_says_outage() -> None:
    store = PumpStore()
    service = Deliveries(store, SimpleNamespace(),  # type: ignore[arg-type]
                         SimpleNamespace(count=1))  # type: ignore[arg-type]
    conn = Conn(peer=SimpleNamespace(), mesh_id="m", pubkey="p",  # type: ignore[arg-type]
                session_id="s", pumping=True)
    pump = asyncio.create_task(service.pump(conn))
    conn.wake.set()
    await store.called()
    pump.cancel()
    done, _ = await asyncio.wait([pump], timeout=2)
    assert pump in done and pump.cancelled()
