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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
from nacl.signing import SigningKey
from prometheus_client import Counter

from tidemesh.core import cancelling, features
from tidemesh.core.backoff import Backoff
from tidemesh.core.exitcodes import Exit
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.features import DEDUPE
from tidemesh.core.maxage import DedupeWindow, MaxAgeError, max_age_hours
from tidemesh.core.metrics import CollectorRegistry
from tidemesh.daemon.link.live_link import LiveLink
from tidemesh.daemon.link.receiver import Receiver, ReceiverMetrics, forward_presence
from tidemesh.daemon.link.sender import (
    DeadLetters,
    Sender,
    SenderMetrics,
    SenderSettings,
    SendHold,
)
from tidemesh.daemon.link.websocket import (
    STALL_TIMEOUT_S,
    BrokerLink,
    FeatureUnavailable,
    HandshakeRejected,
    LinkError,
)
from tidemesh.daemon.membership import revocation
from tidemesh.daemon.membership.join import MeshConfig
from tidemesh.daemon.membership.keyring import Keyring
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService

log = structlog.get_logger(__name__)
CLONE_REASON = "clone_suspected"   # the broker's close reason (4013) under clone.policy refuse_*


class RelayFatal(Exception):
    """A condition reconnecting cannot fix; the daemon exits with ``code``."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


def fatal_of(exc: BaseException) -> RelayFatal | None:
    """The ``RelayFatal`` in what a session raised (a TaskGroup wraps its tasks' errors in
    groups), or None: everything else a session meets (the network, the broker, a store
    that is busy or restarting, a timeout) is transient, and the relay reconnects."""
    if isinstance(exc, RelayFatal):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = fatal_of(inner)
            if found is not None:
                return found
    return None


def describe(exc: BaseException) -> str:
    """One line for a session's end: the first leaf of a group, with its type."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) if isinstance(exc, LinkError) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class RelaySettings:
    backoff: Backoff
    max_age_hours: int = 168
    max_age_override_hours: int | None = None
    sender: SenderSettings = field(default_factory=SenderSettings)
    handshake_timeout_s: float = 10.0
    stall_timeout_s: float = STALL_TIMEOUT_S
    presence_feed: bool = True   # false: presence_on_demand (the broker sends no presence)


StatusHook = Callable[[bool, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The relay's series (spec §10 names), labelled with the mesh: its own reconnects, and
    those of the sender and the receiver, which share the one dedupe family."""

    mesh: str
    reconnects: Counter
    clones: Counter
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
            Counter("cm_daemon_reconnects_total", "Broker connections lost or failed, by why "
                    "(connection_lost, handshake_rejected, timeout, refused, link_error, other)",
                    ["mesh", "reason"], registry=registry),
            Counter("cm_daemon_clone_suspected_total", "Times the broker said another host "
                    "presents this member's key (refused, or told on the hello_ack or later)",
                    ["mesh", "how"], registry=registry),
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


def reconnect_reason(exc: BaseException) -> str:
    """A bounded label for why a session ended or did not start (the log has the detail)."""
    if isinstance(exc, HandshakeRejected):
        return "handshake_rejected"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, LinkError | OSError):
        return "link_error"
    return "other"


class Relay:
    def __init__(self, mesh: MeshConfig, key: SigningKey, outbox: OutboxService,
                 inbox: InboxService, settings: RelaySettings, on_status: StatusHook,
                 rng: random.Random | None = None, metrics: RelayMetrics | None = None,
                 clock: Callable[[], float] = time.time,
                 host_fingerprint: str | None = None, keyring: Keyring | None = None) -> None:
        self.mesh = mesh
        self.keyring = keyring   # opens DMs sealed to rotated-out keys too
        self.host_fingerprint = host_fingerprint
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

    def reload_addresses(self, mesh_file: Path) -> None:
        """SIGHUP: take the broker addresses a later ``daemon join`` wrote to mesh.json, so a
        daemon dialling a dead broker reaches the new ones without a restart. Another mesh
        or member in the file is not this daemon's to adopt: that needs a restart."""
        try:
            saved = MeshConfig.load(mesh_file)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("mesh_config_reload_failed", error=str(exc), kept=list(self.rotation.urls))
            return
        if (saved.mesh_id, saved.member_pubkey) != (self.mesh.mesh_id, self.mesh.member_pubkey):
            log.warning("mesh_config_changed", needs_restart=True,
                        hint="mesh.json names another mesh or member: restart the daemon")
            return
        new = self.rotation.readdressed(saved.broker_urls)
        if new.urls != self.rotation.urls:
            self.rotation, self.mesh = new, saved
            log.info("broker_addresses_reloaded", urls=list(new.urls), current=new.current)

    async def run(self) -> None:
        """Connect, serve, reconnect, forever; raises RelayFatal for what cannot heal. A broker
        that fails hands over to the mesh's next address (``core/failover.py``). Whatever
        else ends a session, from the link, the broker or a store, is logged, counted and
        retried after the backoff: one hung broker must not take its daemons down."""
        attempt = 0
        while True:
            connected = False
            try:
                link = await self._connect()
                connected = True
                await self._serve(link)
                reason, why = "connection lost", "connection_lost"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # sorted by fatal_of; the rest is retried
                if cancelling.asked_to_stop():   # the stop's cancel came back as this error
                    raise asyncio.CancelledError from exc
                fatal = fatal_of(exc)
                if fatal is not None:
                    raise fatal from None
                reason, why = describe(exc), reconnect_reason(exc)
                if connected:
                    log.warning("broker_session_ended", reason=reason)
            if connected:
                attempt = 0
            attempt = await self._pause(attempt, reason, why)

    async def _connect(self) -> BrokerLink:
        s = self.settings
        try:
            return await BrokerLink.connect(self.rotation.current, self.mesh.mesh_id, self.key,
                                            open_timeout=s.handshake_timeout_s,
                                            stall_timeout=s.stall_timeout_s,
                                            host_fingerprint=self.host_fingerprint,
                                            optional=features.optional_for(s.presence_feed))
        except FeatureUnavailable as exc:
            # Said before exiting 4010's code, so an SSE reader learns why the daemon stops.
            await self.on_status(False, {"state": "feature_negotiation_failed",
                                         "reason": exc.reason.to_dict(), "error": str(exc)})
            raise RelayFatal(Exit.FEATURE_UNAVAILABLE, str(exc)) from exc
        except HandshakeRejected as exc:
            if exc.reason == revocation.REASON:
                # Said before exiting, so the event log and the record explain the exit.
                await self.on_status(False, {"state": "revoked", "reason": exc.reason})
                raise RelayFatal(Exit.REVOKED, str(exc)) from exc
            if exc.reason == CLONE_REASON:
                # Retried with the backoff: the other host may be stopped or re-joined.
                await self.clone_suspected("refused", {"reason": exc.reason})
            if not exc.retryable:
                raise RelayFatal(Exit.FAILURE, str(exc)) from exc
            raise

    async def clone_suspected(self, how: str, detail: dict[str, Any]) -> None:
        """The broker says another host presents this member's key: count it, say it."""
        self.metrics.clones.labels(mesh=self.mesh.mesh, how=how).inc()
        log.warning("clone_suspected", how=how, hint="another host uses this member's key; "
                    "on the copy, `tidemesh daemon join INVITE --remint` gives it a key of its "
                    "own (docs/operations.md, A cloned host)", **detail)
        await self._status(False if how == "refused" else self.live.current is not None,
                           {"state": "clone_suspected", "how": how, **detail})

    async def _pause(self, attempt: int, reason: str, why: str) -> int:
        failed = self.rotation.current
        if self.rotation.failed() != failed:
            log.info("broker_failed_over", failed=failed, next=self.rotation.current)
        attempt += 1
        self.metrics.reconnects.labels(mesh=self.mesh.mesh, reason=why).inc()
        delay = self.settings.backoff.delay(attempt, self.rng)
        log.info("broker_connect_failed", attempt=attempt, retry_in_s=round(delay, 2),
                 reason=reason)
        await self._status(False, {"state": "reconnecting", "reason": reason})
        await asyncio.sleep(delay)
        return attempt

    async def _status(self, connected: bool, detail: dict[str, Any]) -> None:
        """Report the link's state; a store too busy to record it does not end the relay."""
        try:
            await self.on_status(connected, detail)
        except Exception as exc:  # reporting is best effort
            log.warning("broker_status_not_recorded", state=detail.get("state"),
                        error=f"{type(exc).__name__}: {exc}")

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
            clone = bool(link.hello_ack.get("clone_suspected"))
            await self.on_status(True, {"state": "connected", "broker": self.rotation.current,
                                        "clone_suspected": clone})
            if clone:
                await self.clone_suspected("on_hello", {"receives_deliveries": True})
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._sender(link, max_age_ms).run(), name="outbox-sender")
                tg.create_task(self._receiver(link).run(), name="inbox-receiver")
                tg.create_task(forward_presence(link, self.inbox, self._told_clone),
                               name="presence-events")
        finally:
            self.live.current = None
            await link.close()
            await self._status(False, {"state": "disconnected"})

    async def _told_clone(self, frame: dict[str, Any]) -> None:
        await self.clone_suspected("told", {"policy": frame["policy"],
                                            "receives_deliveries": frame["receives_deliveries"]})

    def _sender(self, link: BrokerLink, max_age_ms: int) -> Sender:
        # The link cuts itself when a frame waits ``stall_timeout_s`` for its answer, and then
        # the sender's frames end unanswered; its own limit is a backstop that must not come
        # first: a frame given up on while the link stays open is sent again on that link.
        settings = replace(self.settings.sender,
                           send_timeout_s=2 * self.settings.stall_timeout_s)
        return Sender(link, self.outbox, self.dead, settings, self.metrics.sender,
                      max_age_ms, self.settings.backoff, self.clock, self.rng, self.send_hold)

    def _receiver(self, link: BrokerLink) -> Receiver:
        return Receiver(link, self.inbox, self.key, self.mesh.mesh, self.metrics.receiver,
                        self.clock, self.keyring)
