"""Several brokers on one PostgreSQL database (DESIGN §10): what one broker tells the others.

A send accepted here may be for a member connected to another broker; that broker's pump must
wake. The ``Cluster`` port carries such wake-ups between brokers (PostgreSQL LISTEN/NOTIFY in
``broker/store/postgres/cluster.py``); the embedded SQLite store serves one broker, whose
``SingleBroker`` carries nothing. The delivery table stays the only truth: a wake-up that is
lost only delays a delivery until the safety poll (``Peering.poll``) finds the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import structlog

from tidemesh.broker.service.connections import Connections

log = structlog.get_logger(__name__)

Key = tuple[str, str]  # (mesh_id, member pubkey)


class ClusterEvents(Protocol):
    """What the cluster adapter calls when another broker tells this one something."""

    def on_wake(self, keys: Iterable[Key]) -> None: ...

    def on_listening(self) -> None: ...


class Cluster(Protocol):
    broker_id: str

    def publish_wake(self, keys: set[Key]) -> None:
        """Tell the other brokers that these recipients have new committed deliveries;
        returns at once (the adapter sends in the background, after the commit)."""
        ...

    async def run(self, events: ClusterEvents) -> None:
        """Hear the other brokers until cancelled, reconnecting when the channel drops."""
        ...

    async def unacked(self, keys: Sequence[Key]) -> list[tuple[str, str, int, int]]:
        """(mesh_id, pubkey, epoch, last_seq) of these recipients with unacked deliveries."""
        ...


class SingleBroker:
    """The embedded store's broker is the only one: nothing to tell, nothing to hear."""

    broker_id = "single"

    def publish_wake(self, keys: set[Key]) -> None:
        return None

    async def run(self, events: ClusterEvents) -> None:
        return None

    async def unacked(self, keys: Sequence[Key]) -> list[tuple[str, str, int, int]]:
        return []


class Peering:
    """This broker's side of the cluster: wakes local pumps for the others' accepts."""

    def __init__(self, cluster: Cluster, connections: Connections) -> None:
        self.cluster = cluster
        self.connections = connections
        connections.relay = cluster.publish_wake

    def on_wake(self, keys: Iterable[Key]) -> None:
        self.connections.wake_local(keys)

    def on_listening(self) -> None:
        # Wake-ups sent while this broker was not listening are lost: look at every pump.
        self.connections.wake_local(list(self.connections.conns))

    async def run(self) -> None:
        await self.cluster.run(self)

    async def poll(self) -> int:
        """The safety net under NOTIFY: wake the local pumps whose recipients have committed
        deliveries past what was sent. Returns how many were woken."""
        conns = self.connections.conns
        behind: list[Key] = []
        for mesh_id, pubkey, epoch, last_seq in await self.cluster.unacked(list(conns)):
            if any(c.pumping and c.epoch == epoch and c.sent_seq < last_seq
                   for c in conns.get((mesh_id, pubkey), ())):
                behind.append((mesh_id, pubkey))
        if behind:
            log.info("broker_pumps_polled_awake", recipients=len(behind))
            self.connections.wake_local(behind)
        return len(behind)
