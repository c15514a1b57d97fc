"""Broker use cases, one job per module, and the table that routes a frame to them.

``auth`` (who may connect), ``connections`` (the registry and presence), ``send`` (B1, then
the store's accept), ``delivery`` (resume, the pump, acks, queue leases), ``destinations``
(topic and queue requests), ``files`` (shared files' chunks), ``negotiation`` (features),
``retention`` (the sweep), ``rotation`` (a member's move to a new key), ``ratelimit`` (each
member's send budget), ``cluster`` (what several brokers on one database tell each other),
``metrics`` (the Prometheus series) and ``routes`` (frame type → handler).
Independent of websockets: a connection is reached through the ``Peer`` protocol. Never
awaits the network inside a transaction: the store commits first, then frames go out.
"""

from __future__ import annotations

from tidemesh.broker.accept import Limits
from tidemesh.broker.service.auth import Auth, AuthOutcome
from tidemesh.broker.service.clone import ClonePolicy, Clones
from tidemesh.broker.service.cluster import Peering
from tidemesh.broker.service.connections import PROFILE_RATE, Conn, Connections, Peer, now_ms
from tidemesh.broker.service.delivery import Deliveries, deliver_frame
from tidemesh.broker.service.destinations import Destinations
from tidemesh.broker.service.files import Files
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.service.negotiation import Negotiation
from tidemesh.broker.service.ratelimit import Limiter
from tidemesh.broker.service.retention import Retention
from tidemesh.broker.service.rotation import Rotations
from tidemesh.broker.service.routes import Route, route_table
from tidemesh.broker.service.send import Sends
from tidemesh.broker.store.base import Store
from tidemesh.broker.store.cluster import Cluster, SingleBroker
from tidemesh.broker.store.files import FileLimits
from tidemesh.core.ratelimit import Rate
from tidemesh.core.wire import FrameType

UNLIMITED = Rate(0, 1)
# The settings' defaults (broker/config.py files.*).
FILE_LIMITS = FileLimits(max_bytes=1 << 30, member_quota_bytes=4 << 30,
                         retention_ms=7 * 86_400_000)
__all__ = ["AuthOutcome", "BrokerService", "Conn", "Peer", "deliver_frame"]


class BrokerService:
    """Builds the broker's use cases over one store; the server and the composition root
    reach them through its attributes and ``routes``."""

    def __init__(self, store: Store, limits: Limits, *, retention_days: int = 30,
                 stall_window_hours: int = 24, member_rate: Rate = UNLIMITED,
                 cluster: Cluster | SingleBroker | None = None,
                 session_expiry_s: float = 15.0, profile_rate: Rate = PROFILE_RATE,
                 clone_policy: ClonePolicy = ClonePolicy.WARN, clone_quarantine_s: float = 120.0,
                 file_limits: FileLimits = FILE_LIMITS) -> None:
        self.store = store
        self.limits = limits
        self.connections = Connections(profile_rate)
        self.peering = Peering(cluster or SingleBroker(), self.connections,
                               session_expiry_s=session_expiry_s)
        self.metrics = Metrics(self.connections.active, store)
        self.connections.presence_failed = self.metrics.presence_failed.inc
        self.connections.revoked_closed = self.metrics.revocations.inc
        self.connections.presence_resynced = self.metrics.presence_resyncs.inc
        told = {kind: self.metrics.presence_entries.labels(kind=kind)
                for kind in ("event", "snapshot")}
        self.connections.presence_told = lambda kind, n: told[kind].inc(n)
        self.connections.resync_failed = self.metrics.background_errors.labels(
            task="presence_resync", kind="transient").inc
        self.auth = Auth(store, self.metrics, self.connections)
        self.clones = Clones(clone_policy, self.connections, self.metrics, self.peering,
                             quarantine_s=clone_quarantine_s)
        self.limiter = Limiter(member_rate, store)
        self.sends = Sends(store, limits, self.metrics, self.connections, self.limiter)
        self.deliveries = Deliveries(store, self.metrics, self.connections)
        self.destinations = Destinations(store)
        self.files = Files(store, file_limits)
        self.negotiation = Negotiation(limits)
        self.rotations = Rotations(store, self.connections)
        self.retention = Retention(store, self.metrics, retention_days=retention_days,
                                   stall_window_hours=stall_window_hours)
        self.routes: dict[FrameType, Route] = route_table(self)

    @property
    def conns(self) -> dict[tuple[str, str], set[Conn]]:
        return self.connections.conns

    # The background jobs the composition root supervises.

    # With several brokers each job runs on one broker at a time (``Peering.exclusively``);
    # a broker that skips the round answers zeros.

    async def sweep(self) -> tuple[int, int]:
        return await self.peering.exclusively("retention", self.retention.sweep) or (0, 0)

    async def recheck_members(self) -> None:
        await self.auth.recheck_members()

    async def refresh_limits(self) -> None:
        now = now_ms()
        await self.limiter.refresh(now)
        self.connections.prune_budgets(now)

    async def reassign_lapsed(self, lease_s: float) -> int:
        moved = await self.peering.exclusively(
            "queue_leases", lambda: self.deliveries.reassign_lapsed(lease_s))
        return moved or 0
