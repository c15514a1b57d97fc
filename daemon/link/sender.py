"""The sender: outbox → broker over one live link, for as long as that link lasts.

Claims due rows (pending → inflight), keeps up to ``window`` sends on the one WebSocket,
and settles each answer (done | dead | pending with backoff, decided by
``core.outcome.classify``) through group commits. A row that turns dead raises an
``outbox_dead`` event. After a 429 ``rate_limited`` it claims nothing until the broker's
``retry_after_ms`` (plus jitter) has passed; that wait (``SendHold``) outlives the link, so
a reconnect does not cut it short. Its counters live here, next to what they count.

Imports services and the link; no SQL and no HTTP here.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from prometheus_client import Counter, Histogram

from tidemesh.core import tracing
from tidemesh.core.backoff import Backoff
from tidemesh.core.metrics import BATCH_BUCKETS, CollectorRegistry
from tidemesh.core.outcome import Kind, Settlement, classify, unanswered
from tidemesh.daemon import race
from tidemesh.daemon.link.websocket import BrokerLink, LinkError
from tidemesh.daemon.records import Claimed
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SenderSettings:
    window: int = 1024
    claim_batch: int = 256
    send_timeout_s: float = 30.0
    idle_poll_s: float = 1.0


_KIND_AT = len(b'{"to":{"kind":"')


def payload_kind(payload: bytes) -> str:
    """A stored payload's destination kind, read off its first bytes: the outbox writes
    ``to`` first (``SendRequest.to_payload``), and parsing the row only to label a counter
    would cost the send path a JSON parse per row."""
    if payload.startswith(b'{"to":{"kind":"'):
        end = payload.find(b'"', _KIND_AT)
        kind = payload[_KIND_AT:end]
        if kind in (b"topic", b"dm", b"queue"):
            return kind.decode()
    return "unknown"


@dataclass(frozen=True, slots=True)
class SenderMetrics:
    """The send side's series (spec §10 names), labelled with the mesh. ``dedupe`` is the
    family both directions share; the sender counts its ``outbound`` half."""

    mesh: str
    sends: Counter
    dedupe: Counter
    history_pruned: Counter
    send_batch: Histogram

    @classmethod
    def register(cls, registry: CollectorRegistry, mesh: str, dedupe: Counter) -> SenderMetrics:
        return cls(
            mesh,
            Counter("cm_daemon_send_total", "Outbox rows settled, by destination kind and "
                    "outcome", ["mesh", "kind", "status"], registry=registry),
            dedupe,
            Counter("cm_daemon_dedupe_history_pruned_total",
                    "Duplicates whose original's history was already pruned", ["mesh"],
                    registry=registry),
            Histogram("cm_daemon_send_batch_size", "Sends in each frame written to the broker",
                      ["mesh"], registry=registry, buckets=BATCH_BUCKETS),
        )


@dataclass(slots=True)
class SendHold:
    """No claims before ``until_ms`` (the broker asked this member to slow down). One per
    mesh, kept across links.

    ``draining``: rows were sent back to pending in their places, and frames still on the
    wire may send back more (a 429 for each). No claim is made until those are answered, so
    the next claim takes them all in place order: claimed while an earlier row's frame was
    still unanswered, a later row could reach the broker first and, being owed too, go
    through ahead of it."""

    until_ms: int = 0
    draining: bool = False

    def extend(self, until_ms: int | None) -> None:
        if until_ms is not None:
            self.until_ms = max(self.until_ms, until_ms)
            self.draining = True


class DeadLetters:
    """Announces dead outbox rows as ``outbox_dead`` events in the local log."""

    def __init__(self, outbox: OutboxService, inbox: InboxService) -> None:
        self.outbox = outbox
        self.inbox = inbox

    async def announce(self) -> None:
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
    is one frame out (one pending request), and its answers are settled in one write."""

    def __init__(self, link: BrokerLink, outbox: OutboxService, dead: DeadLetters,
                 settings: SenderSettings, metrics: SenderMetrics, max_age_ms: int,
                 backoff: Backoff, clock: Callable[[], float], rng: random.Random,
                 hold: SendHold | None = None) -> None:
        self.link = link
        self.outbox = outbox
        self.dead = dead
        self.settings = settings
        self.metrics = metrics
        self.max_age_ms = max_age_ms
        self.backoff = backoff
        self.clock = clock
        self.rng = rng
        self.hold = SendHold() if hold is None else hold
        self.inflight = 0
        self.slot_freed = asyncio.Event()
        link.on_batch = metrics.send_batch.labels(mesh=metrics.mesh).observe
        # While the claim loop waits idle with room, a lone send's accept may claim its row
        # and hand it here (``OutboxService.Hand``): the task group it is sent in.
        self._waiting: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        await self.dead.announce()
        self.outbox.hand = self
        try:
            await self._claim_loop()
        finally:
            if self.outbox.hand is self:
                self.outbox.hand = None

    def reserve(self) -> bool:
        # Only with nothing on the wire: sends that arrive together while one is on its way
        # wait for the claim loop, which puts them in one frame (a row handed over is a
        # frame of its own: under load every row was, and alice's sends/frame fell).
        if (self._waiting is None or self.inflight or self.link.closed
                or self.outbox.accepted.is_set() or self.hold.draining
                or self.hold.until_ms / 1000 > self.clock()):
            return False
        self.inflight += 1
        return True

    def take(self, row: Claimed) -> bool:
        tg = self._waiting
        if tg is None or self.link.closed:
            self.release()
            return False
        try:
            tg.create_task(self._send([row]))
        except RuntimeError:   # the task group is ending with the session
            self.release()
            return False
        return True

    def release(self) -> None:
        self.inflight -= 1
        self.slot_freed.set()

    async def _claim_loop(self) -> None:
        s, outbox = self.settings, self.outbox
        async with asyncio.TaskGroup() as tg:
            while not self.link.closed:
                held_s = self.hold.until_ms / 1000 - self.clock()
                if held_s > 0:
                    await race.first(self.link.wait_closed(), within=held_s)
                    continue
                if self.hold.draining:
                    self.slot_freed.clear()
                    if self.inflight:
                        await race.first(self.link.wait_closed(), self.slot_freed.wait(),
                                         within=s.idle_poll_s)
                        continue
                    self.hold.draining = False
                free = s.window - self.inflight
                want = min(free, s.claim_batch)
                if want > 0:
                    outbox.accepted.clear()
                    claimed, dead = await outbox.claim(want, self.max_age_ms)
                    if claimed:
                        self.inflight += len(claimed)
                        tg.create_task(self._send(claimed))
                    if dead:
                        await self.dead.announce()
                    if len(claimed) == want:
                        continue
                await self._idle(tg, free > 0)

    async def _idle(self, tg: asyncio.TaskGroup, has_room: bool) -> None:
        self.slot_freed.clear()
        timeout = self.settings.idle_poll_s
        if has_room:
            due = await self.outbox.next_due()
            if due is not None:
                timeout = min(timeout, max(0.0, due / 1000 - self.clock()))
        more = self.outbox.accepted if has_room else self.slot_freed
        # Rows may be handed over only while everything due was claimed (has room, waiting).
        self._waiting = tg if has_room else None
        try:
            await race.first(self.link.wait_closed(), more.wait(), within=timeout)
        finally:
            self._waiting = None

    async def _send(self, rows: list[Claimed]) -> None:
        limit = self.settings.send_timeout_s
        refused: LinkError | None = None
        # The stored payloads go into the frame as their bytes; with tracing on they are
        # parsed, for the rows' traceparents (the span's parents, a lone row's onward one).
        items: list[tuple[str, dict[str, Any] | bytes]] = (
            [(r.client_message_id, orjson.loads(r.payload)) for r in rows] if tracing.enabled()
            else [(r.client_message_id, r.payload) for r in rows])
        with tracing.span("tidemesh.daemon.send", _parents(items),
                          {"tidemesh.mesh": self.metrics.mesh, "tidemesh.batch_size": len(rows)}
                          ) as hop:
            if len(items) == 1 and tracing.enabled():
                _carry(items[0], hop)
            try:
                answers = await self.link.send_many(items, limit)
            except LinkError as exc:   # refused as a whole, or the link was closed already
                answers, refused = [None] * len(rows), exc
            if len(rows) == 1 and answers[0] is not None:
                hop.set("tidemesh.status", answers[0].get("status", 0))
                hop.set("tidemesh.broker_message_id", answers[0].get("broker_message_id") or "")
        error = ("LinkClosed: the broker link closed before the answer" if self.link.closed
                 else f"LinkError: {refused}" if refused is not None
                 else f"TimeoutError: no answer within {limit:.0f} s")
        now = int(self.clock() * 1000)
        if refused is None and all(a is None for a in answers):
            # No answer at all: the rows keep their places (``core.outcome.unanswered``).
            settled = [unanswered(r.id, r.attempts, error, now, self.backoff, self.rng)
                       for r in rows]
        else:
            settled = [classify(r.id, r.attempts, a, None if a else error, now,
                                self.backoff, self.rng)
                       for r, a in zip(rows, answers, strict=True)]
        # Before the rows are pending again, so the claim loop cannot take them early.
        for st in settled:
            self.hold.extend(st.hold_until)
        await self.outbox.settle_many(settled)
        self.inflight -= len(rows)
        self.slot_freed.set()
        self._account(settled, answers, [payload_kind(r.payload) for r in rows])
        if any(st.kind is Kind.DEAD for st in settled):
            await self.dead.announce()

    def _account(self, settled: list[Settlement], answers: list[dict[str, Any] | None],
                 kinds: list[str]) -> None:
        m = self.metrics
        for st, answer, kind in zip(settled, answers, kinds, strict=True):
            m.sends.labels(mesh=m.mesh, kind=kind, status=st.kind.value).inc()
            if st.history_pruned:
                m.history_pruned.labels(mesh=m.mesh).inc()
                log.warning("outbox_duplicate_history_pruned", outbox_id=st.row_id,
                            broker_message_id=st.broker_message_id)
            elif answer is not None and answer.get("duplicate"):
                m.dedupe.labels(direction="outbound", mesh=m.mesh).inc()
                log.info("outbox_duplicate_acknowledged", outbox_id=st.row_id,
                         broker_message_id=st.broker_message_id)


def _parents(items: list[tuple[str, dict[str, Any] | bytes]]) -> list[str | None]:
    """The send span's parents: each row's stored traceparent (the accept span's)."""
    if not tracing.enabled():
        return []
    return [p.get("traceparent") if isinstance(p, dict) else None for _, p in items]


def _carry(item: tuple[str, dict[str, Any] | bytes], hop: tracing.Hop) -> None:
    """A lone row's frame carries the send span's traceparent (the row keeps its own: a
    resend is another child of the accept)."""
    cmid, payload = item
    if isinstance(payload, dict):
        payload["traceparent"] = hop.onward(payload.get("traceparent"))
    hop.set("tidemesh.client_message_id", cmid)
