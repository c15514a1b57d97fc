"""The daemon's link to the broker: one connection at a time, reconnected with backoff, and
over it the sender (outbox → broker) and the receiver (broker → inbox).

Sender: claims due rows (pending → inflight), pipelines up to ``window`` sends on the one
WebSocket, and settles each answer (done | dead | pending with backoff) through group
commits. A row that turns dead raises an ``outbox_dead`` event.

Receiver: ``resume`` from the last stored (epoch, seq); each ``deliver`` is written to the
inbox (deduped, DMs opened) and only then acked, cumulatively. Where a delivery stands
against the cursor is decided in ``receive_order.py``; a gap triggers a resume;
STALE_SEQUENCE and INVALID_SEQUENCE are reported and resynced as DESIGN §6 says.

Imports services and the link; no SQL and no HTTP here.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from nacl.signing import SigningKey
from prometheus_client import Counter, Histogram

from tidemesh.core.backoff import Backoff
from tidemesh.core.errors import InvalidRequest, TidemeshError, Unavailable, from_body
from tidemesh.core.exitcodes import Exit
from tidemesh.core.features import DEDUPE
from tidemesh.core.ids import new_ulid
from tidemesh.core.maxage import DedupeWindow, MaxAgeError, max_age_hours
from tidemesh.core.metrics import BATCH_BUCKETS, CollectorRegistry
from tidemesh.core.outcome import Kind, Settlement, classify
from tidemesh.core.sealing import UnsealError, unseal
from tidemesh.daemon import race
from tidemesh.daemon.join import MeshConfig
from tidemesh.daemon.link import BrokerLink, FeatureUnavailable, HandshakeRejected, LinkError
from tidemesh.daemon.receive_order import Placement, ReceiveOrder
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.store.inbox import Delivery
from tidemesh.daemon.store.outbox import Claimed

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
    window: int = 1024
    claim_batch: int = 256
    send_timeout_s: float = 30.0
    idle_poll_s: float = 1.0


StatusHook = Callable[[bool, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The relay's counters (spec §10 names), labelled with the mesh."""

    mesh: str
    sends: Counter
    received: Counter
    dedupe: Counter
    reconnects: Counter
    history_pruned: Counter
    send_batch: Histogram

    @classmethod
    def register(cls, registry: CollectorRegistry, mesh: str) -> RelayMetrics:
        return cls(
            mesh,
            Counter("cm_daemon_send_total", "Outbox rows settled, by outcome",
                    ["mesh", "status"], registry=registry),
            Counter("cm_daemon_recv_total", "Deliveries stored in the inbox, by kind",
                    ["mesh"], registry=registry),
            Counter("cm_daemon_dedupe_total",
                    "Duplicates absorbed: outbound (broker said duplicate) and "
                    "inbound (a redelivery already stored)", ["direction", "mesh"],
                    registry=registry),
            Counter("cm_daemon_reconnects_total", "Broker connections lost or failed",
                    ["mesh"], registry=registry),
            Counter("cm_daemon_dedupe_history_pruned_total",
                    "Duplicates whose original's history was already pruned", ["mesh"],
                    registry=registry),
            Histogram("cm_daemon_send_batch_size", "Sends in each frame written to the broker",
                      ["mesh"], registry=registry, buckets=BATCH_BUCKETS),
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
        self.link: BrokerLink | None = None
        self.metrics = metrics or RelayMetrics.register(CollectorRegistry(), mesh.mesh)

    async def run(self) -> None:
        """Connect, serve, reconnect, forever; raises RelayFatal for what cannot heal."""
        attempt = 0
        while True:
            try:
                link = await BrokerLink.connect(self.mesh.broker_url, self.mesh.mesh_id, self.key)
            except FeatureUnavailable as exc:
                raise RelayFatal(Exit.FEATURE_UNAVAILABLE, str(exc)) from exc
            except HandshakeRejected as exc:
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
        attempt += 1
        self.metrics.reconnects.labels(mesh=self.mesh.mesh).inc()
        delay = self.settings.backoff.delay(attempt, self.rng)
        log.info("broker_connect_failed", attempt=attempt, retry_in_s=round(delay, 2),
                 reason=reason)
        await self.on_status(False, {"state": "reconnecting", "reason": reason})
        await asyncio.sleep(delay)
        return attempt

    async def _serve(self, link: BrokerLink) -> None:
        link.on_batch = self.metrics.send_batch.labels(mesh=self.metrics.mesh).observe
        max_age_ms = negotiated_max_age(link.supported, self.settings) * 3_600_000
        try:
            # A session that ended with a batch on the wire (its sender cancelled) leaves those
            # rows inflight; the broker's dedupe makes sending them again harmless.
            await self.outbox.record_max_age(max_age_ms)
            released = await self.outbox.release_inflight()
            if released:
                log.info("outbox_inflight_released", rows=released)
            await link.set_profile(await self.inbox.profile())
            self.link = link
            await self.on_status(True, {"state": "connected", "broker": self.mesh.broker_url})
            async with asyncio.TaskGroup() as tg:
                tg.create_task(Sender(self, link, max_age_ms).run(), name="outbox-sender")
                tg.create_task(Receiver(self, link).run(), name="inbox-receiver")
                tg.create_task(self._presence(link), name="presence-events")
        finally:
            self.link = None
            await link.close()
            await self.on_status(False, {"state": "disconnected"})

    def _live(self) -> BrokerLink:
        if self.link is None:
            raise Unavailable("the daemon is not connected to the broker",
                              reason="broker_disconnected")
        return self.link

    async def peers(self) -> list[dict[str, Any]]:
        try:
            return await self._live().peers()
        except LinkError as exc:
            raise Unavailable(f"the broker link failed: {exc}",
                              reason="broker_disconnected") from exc

    async def set_profile(self, profile: dict[str, Any]) -> None:
        try:
            await self._live().set_profile(profile)
        except LinkError as exc:
            raise Unavailable(f"the broker link failed: {exc}",
                              reason="broker_disconnected") from exc

    async def request(self, op: str, name: str) -> None:
        """A membership operation over the live link; broker refusals raise the error tree."""
        link = self.link
        if link is None:
            raise Unavailable("the daemon is not connected to the broker",
                              reason="broker_disconnected")
        try:
            answer = await link.request(op, name)
        except LinkError as exc:
            raise Unavailable(f"the broker link failed: {exc}",
                              reason="broker_disconnected") from exc
        if answer.get("type") == "error":
            err = from_body(400, {"error": answer["error"]})
            # A broker code this daemon does not know is still the caller's 4xx, not a 500.
            raise (InvalidRequest(err.message, broker_code=answer["error"].get("code"))
                   if type(err) is TidemeshError else err)

    async def _presence(self, link: BrokerLink) -> None:
        """peer_join / peer_leave frames become events in the local log."""
        while True:
            frame = await race.next_item(link.presence, link.wait_closed())
            if frame is None:
                return
            await self.inbox.record_event(frame["type"], {
                k: v for k, v in frame.items() if k != "type"})

    async def notify_dead(self) -> None:
        """Put an ``outbox_dead`` event in the log for every dead row not yet announced.
        The event log dedupes on the row id, so a crash between the two writes only means
        the announcement is made again, never lost."""
        rows = await self.outbox.dead_to_notify()
        for row in rows:
            await self.inbox.record_event("outbox_dead", row, dedupe_key=f"outbox_dead:{row['id']}")
            log.warning("outbox_row_dead", outbox_id=row["id"],
                        client_message_id=row["client_message_id"], reason=row["last_error"])
        if rows:
            await self.outbox.mark_notified([r["id"] for r in rows])


class Sender:
    """Claims due rows in batches and keeps several batches on the wire at once; each batch
    is one coalesced frame out, and its answers are settled in one write."""

    def __init__(self, relay: Relay, link: BrokerLink, max_age_ms: int) -> None:
        self.relay = relay
        self.link = link
        self.max_age_ms = max_age_ms
        self.inflight = 0
        self.slot_freed = asyncio.Event()

    async def run(self) -> None:
        s, outbox = self.relay.settings, self.relay.outbox
        await self.relay.notify_dead()
        async with asyncio.TaskGroup() as tg:
            while not self.link.closed:
                free = s.window - self.inflight
                want = min(free, s.claim_batch)
                if want > 0:
                    outbox.accepted.clear()
                    claimed, dead = await outbox.claim(want, self.max_age_ms)
                    if claimed:
                        self.inflight += len(claimed)
                        tg.create_task(self._send(claimed))
                    if dead:
                        await self.relay.notify_dead()
                    if len(claimed) == want:
                        continue
                await self._idle(free > 0)

    async def _idle(self, has_room: bool) -> None:
        self.slot_freed.clear()
        timeout = self.relay.settings.idle_poll_s
        if has_room:
            due = await self.relay.outbox.next_due()
            if due is not None:
                timeout = min(timeout, max(0.0, due / 1000 - self.relay.clock()))
        more = self.relay.outbox.accepted if has_room else self.slot_freed
        await race.first(self.link.wait_closed(), more.wait(), within=timeout)

    async def _send(self, rows: list[Claimed]) -> None:
        relay = self.relay
        limit = relay.settings.send_timeout_s
        try:
            answers = await self.link.send_many(
                [(r.client_message_id, orjson.loads(r.payload)) for r in rows], limit)
        except LinkError:
            answers = [None] * len(rows)
        error = ("LinkClosed: the broker link closed before the answer" if self.link.closed
                 else f"TimeoutError: no answer within {limit:.0f} s")
        now = int(relay.clock() * 1000)
        settled = [classify(r.id, r.attempts, a, None if a else error, now,
                            relay.settings.backoff, relay.rng) for r, a in zip(rows, answers,
                                                                                strict=True)]
        await relay.outbox.settle_many(settled)
        self.inflight -= len(rows)
        self.slot_freed.set()
        self._account(settled, answers)
        if any(st.kind is Kind.DEAD for st in settled):
            await relay.notify_dead()

    def _account(self, settled: list[Settlement], answers: list[dict[str, Any] | None]) -> None:
        m = self.relay.metrics
        for st, answer in zip(settled, answers, strict=True):
            m.sends.labels(mesh=m.mesh, status=st.kind.value).inc()
            if st.history_pruned:
                m.history_pruned.labels(mesh=m.mesh).inc()
                log.warning("outbox_duplicate_history_pruned", outbox_id=st.row_id,
                            broker_message_id=st.broker_message_id)
            elif answer is not None and answer.get("duplicate"):
                m.dedupe.labels(direction="outbound", mesh=m.mesh).inc()
                log.info("outbox_duplicate_acknowledged", outbox_id=st.row_id,
                         broker_message_id=st.broker_message_id)


class Receiver:
    def __init__(self, relay: Relay, link: BrokerLink) -> None:
        self.relay = relay
        self.link = link

    async def run(self) -> None:
        inbox = self.relay.inbox
        order = ReceiveOrder(await inbox.receive_cursor() or (0, 0))
        order.resumed(await self._resume(order.cursor))
        while True:
            frames = await self._next_frames()
            if not frames:
                return
            stores: list[Awaitable[Any]] = []
            for f in frames:
                placement = order.place(f["epoch"], f["seq"])
                if placement in (Placement.STORED, Placement.STALE):
                    continue
                if placement is Placement.GAP:
                    log.warning("delivery_gap_detected", expected=order.cursor[1] + 1,
                                got=f["seq"])
                    await asyncio.gather(*stores)
                    stores = []
                    order.resumed(await self._resume(order.cursor))
                    break
                if f.get("reassigned"):
                    # A queue lease that lapsed here went to another consumer: skip it, but
                    # move the cursor past it so the stream stays gapless.
                    stores.append(inbox.skip(f["epoch"], f["seq"]))
                else:
                    stores.append(inbox.store(self._delivery(f)))
            self._account(await asyncio.gather(*stores))
            ack = order.ack_position()
            if ack is not None:
                await self.link.ack(*ack)

    def _account(self, results: list[Any]) -> None:
        m = self.relay.metrics
        for res in results:
            if res is None:
                continue
            if res.inbox_seq is None:
                m.dedupe.labels(direction="inbound", mesh=m.mesh).inc()
            else:
                m.received.labels(mesh=m.mesh).inc()

    async def _next_frames(self) -> list[dict[str, Any]]:
        q = self.link.deliveries
        first = await race.next_item(q, self.link.wait_closed())
        if first is None:
            return []
        frames = [first]
        while not q.empty() and len(frames) < 512:
            frames.append(q.get_nowait())
        return frames

    async def _resume(self, cursor: tuple[int, int]) -> tuple[int, int]:
        inbox = self.relay.inbox
        for _ in range(3):
            ans = await self.link.resume(*cursor)
            result = ans["result"]
            if result == "OK":
                return (ans["epoch"], ans.get("last_seq", cursor[1]))
            target = (ans["epoch"], ans["compacted_seq"] if result == "STALE_SEQUENCE"
                      else ans["broker_last_seq"])
            event = log.warning if result == "STALE_SEQUENCE" else log.error
            event("delivery_resume_refused", result=result, ours=cursor, resync_to=target)
            await inbox.record_event("broker_status", {
                "state": "resynced", "result": result, "our_position": list(cursor),
                "resynced_to": list(target), "broker_last_seq": ans["broker_last_seq"]})
            await inbox.reset_receive_cursor(*target)
            cursor = target
        raise LinkError("the broker refused to resume three times")

    def _delivery(self, f: dict[str, Any]) -> Delivery:
        body = (f["body"].encode("utf-8") if f["body_encoding"] == "utf8"
                else base64.b64decode(f["body"]))
        encoding = f["body_encoding"]
        meta = f.get("meta")
        if f["to"]["kind"] == "dm":
            try:
                body, encoding = unseal(self.relay.key, f["sender_pubkey"], body)
            except UnsealError as exc:
                log.error("dm_unseal_failed", broker_message_id=f["broker_message_id"],
                          error=str(exc))
                meta = {**(meta or {}), "tidemesh_undecryptable": str(exc)}
        now = int(self.relay.clock() * 1000)
        return Delivery(
            id=new_ulid(now), mesh=self.relay.mesh.mesh, sender_pubkey=f["sender_pubkey"],
            sender_name=None,
            client_message_id=f.get("client_message_id") or f["broker_message_id"],
            broker_message_id=f["broker_message_id"], dest_kind=f["to"]["kind"],
            dest_ref=f["to"]["ref"], body=body, body_encoding=encoding, priority=f["priority"],
            meta=meta, reply_to=f.get("reply_to"), epoch=f["epoch"], seq=f["seq"],
            sent_at=f["created_at"], received_at=now,
        )
