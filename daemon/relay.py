"""The relay: the daemon's supervisor of its broker link. One connection at a time,
reconnected with backoff; over each, one session runs the sender (outbox → broker,
``sender.py``), the receiver (broker → inbox, ``receiver.py``) and the presence feed, and
ends them all together when the link drops.

What cannot heal by reconnecting (a required feature missing, this member refused or
revoked for good, a max age the broker's dedupe window cannot hold) raises ``RelayFatal``:
the daemon exits with its code. Services reach the open link through ``live_link.LiveLink``.

Imports services, the link and its workers; no SQL and no HTTP here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nacl.signing import SigningKey
from prometheus_client import Counter

from tidemesh.core.backoff import Backoff
from tidemesh.core.exitcodes import Exit
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.features import DEDUPE
from tidemesh.core.maxage import DedupeWindow, MaxAgeError, max_age_hours
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.daemon import revocation
from tidemesh.daemon.join import MeshConfig
from tidemesh.daemon.link import BrokerLink, FeatureUnavailable, HandshakeRejected, LinkError
from tidemesh.daemon.live_link import LiveLink
from tidemesh.daemon.receiver import Receiver, ReceiverMetrics, forward_presence
from tidemesh.daemon.sender import (
    DeadLetters,
    Sender,
    SenderMetrics,
    SenderSettings,
    SendHold,
)
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService

log = structlog.get_logger(__name__)


class RelayFatal(Exception):
    """A condition reconnecting cannot fix; the daemon exits with ``code``."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RelaySettings:
    backoff: Backoff
    max_age_hours: int = 168
    max_age_override_hours: int | None = None
    sender: SenderSettings = field(default_factory=SenderSettings)


StatusHook = Callable[[bool, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The relay's series (spec §10 names), labelled with the mesh: its own reconnects, and
    those of the sender and the receiver, which share the one dedupe family."""

    mesh: str
    reconnects: Counter
    sender: SenderMetrics
    receiver: ReceiverMetrics

    @classmethod
    def register(cls, registry: CollectorRegistry, mesh: str) -> RelayMetrics:
        dedupe = Counter("cm_daemon_dedupe_total",
                         "Duplicates absorbed: outbound (broker said duplicate) and "
                         "inbound (a redelivery already stored)", ["direction", "mesh"],
                         registry=registry)
        return cls(
            mesh,
            Counter("cm_daemon_reconnects_total", "Broker connections lost or failed",
                    ["mesh"], registry=registry),
            SenderMetrics.register(registry, mesh, dedupe),
            ReceiverMetrics.register(registry, mesh, dedupe),
        )


def negotiated_max_age(supported: dict[str, Any], s: RelaySettings) -> int:
    """Spec §4.9: the outbox max age must fit inside the broker's dedupe window."""
    params = supported[DEDUPE]["params"]
    window = DedupeWindow(params["mode"], params.get("dedupe_retention_days"))
    try:
        return max_age_hours(window, s.max_age_hours, s.max_age_override_hours)
    except MaxAgeError as exc:
        raise RelayFatal(Exit.FEATURE_UNAVAILABLE, f"{exc.code}: {exc}") from exc


class Relay:
    def __init__(self, mesh: MeshConfig, key: SigningKey, outbox: OutboxService,
                 inbox: InboxService, settings: RelaySettings, on_status: StatusHook,
                 rng: random.Random | None = None, metrics: RelayMetrics | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.mesh = mesh
        self.clock = clock
        self.key = key
        self.outbox = outbox
        self.inbox = inbox
        self.settings = settings
        self.on_status = on_status
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self.live = LiveLink()
        self.dead = DeadLetters(outbox, inbox)
        self.send_hold = SendHold()   # a broker's retry_after_ms outlasts the link it came on
        self.metrics = metrics or RelayMetrics.register(CollectorRegistry(), mesh.mesh)
        self.rotation = BrokerRotation.of(mesh.broker_urls)

    async def run(self) -> None:
        """Connect, serve, reconnect, forever; raises RelayFatal for what cannot heal. A broker
        that fails hands over to the mesh's next address (``core/failover.py``)."""
        attempt = 0
        while True:
            try:
                link = await BrokerLink.connect(self.rotation.current, self.mesh.mesh_id,
                                                self.key)
            except FeatureUnavailable as exc:
                raise RelayFatal(Exit.FEATURE_UNAVAILABLE, str(exc)) from exc
            except HandshakeRejected as exc:
                if exc.reason == revocation.REASON:
                    # Said before exiting, so the event log and the record explain the exit.
                    await self.on_status(False, {"state": "revoked", "reason": exc.reason})
                    raise RelayFatal(Exit.REVOKED, str(exc)) from exc
                if not exc.retryable:
                    raise RelayFatal(Exit.FAILURE, str(exc)) from exc
                attempt = await self._pause(attempt, str(exc))
                continue
            except LinkError as exc:
                attempt = await self._pause(attempt, str(exc))
                continue
            attempt = 0
            try:
                await self._serve(link)
            except* LinkError as group:
                log.info("broker_link_lost", reason=str(group.exceptions[0]))
            attempt = await self._pause(attempt, "connection lost")

    async def _pause(self, attempt: int, reason: str) -> int:
        failed = self.rotation.current
        if self.rotation.failed() != failed:
            log.info("broker_failed_over", failed=failed, next=self.rotation.current)
        attempt += 1
        self.metrics.reconnects.labels(mesh=self.mesh.mesh).inc()
        delay = self.settings.backoff.delay(attempt, self.rng)
        log.info("broker_connect_failed", attempt=attempt, retry_in_s=round(delay, 2),
                 reason=reason)
        await self.on_status(False, {"state": "reconnecting", "reason": reason})
        await asyncio.sleep(delay)
        return attempt

    async def _serve(self, link: BrokerLink) -> None:
        max_age_ms = negotiated_max_age(link.supported, self.settings) * 3_600_000
        try:
            # A session that ended with a batch on the wire (its sender cancelled) leaves those
            # rows inflight; the broker's dedupe makes sending them again harmless.
            await self.outbox.record_max_age(max_age_ms)
            released = await self.outbox.release_inflight()
            if released:
                log.info("outbox_inflight_released", rows=released)
            await link.set_profile(await self.inbox.profile())
            self.live.current = link
            await self.on_status(True, {"state": "connected", "broker": self.rotation.current})
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._sender(link, max_age_ms).run(), name="outbox-sender")
                tg.create_task(self._receiver(link).run(), name="inbox-receiver")
                tg.create_task(forward_presence(link, self.inbox), name="presence-events")
        finally:
            self.live.current = None
            await link.close()
            await self.on_status(False, {"state": "disconnected"})

    def _sender(self, link: BrokerLink, max_age_ms: int) -> Sender:
        return Sender(link, self.outbox, self.dead, self.settings.sender, self.metrics.sender,
                      max_age_ms, self.settings.backoff, self.clock, self.rng, self.send_hold)

    def _receiver(self, link: BrokerLink) -> Receiver:
        return Receiver(link, self.inbox, self.key, self.mesh.mesh, self.metrics.receiver,
                        self.clock)
