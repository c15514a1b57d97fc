"""The receiver: broker → inbox over one live link, for as long as that link lasts.

``resume`` from the last stored (epoch, seq); each frame from the broker (one ``deliver``
or a ``deliver_batch``) is written to the inbox in one transaction (deduped, DMs opened) and
only then acked, cumulatively: one ack for the highest contiguous seq stored. Where a
delivery stands against the cursor is decided in ``receive_order.py``; a gap triggers a
resume; STALE_SEQUENCE and INVALID_SEQUENCE are reported and resynced as DESIGN §6 says.
Turning a ``deliver`` frame into an inbox ``Delivery`` is ``delivery_of``, pure. Its counters
live here.

Imports services and the link; no SQL and no HTTP here.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from nacl.signing import SigningKey
from prometheus_client import Counter, Histogram

from tidemesh.core import tracing
from tidemesh.core.ids import derived_ulid
from tidemesh.core.metrics import BATCH_BUCKETS, CollectorRegistry
from tidemesh.core.sealing import (
    UnsealError,
    binding_problem,
    sealed_fields_problems,
    unseal,
)
from tidemesh.daemon import race
from tidemesh.daemon.link.linkstate import resume_outcome
from tidemesh.daemon.link.receive_order import Position, ReceiveOrder
from tidemesh.daemon.link.websocket import BrokerLink, LinkError
from tidemesh.daemon.membership.keyring import Keyring
from tidemesh.daemon.records import Delivery, StoreResult, Void
from tidemesh.daemon.service.inbox import InboxService

log = structlog.get_logger(__name__)
# Deliveries taken off the link's queue at once (whole frames): stored together, acked once.
BATCH = 512
RESUME_TRIES = 3


@dataclass(frozen=True, slots=True)
class ReceiverMetrics:
    """The receive side's series (named in docs/operations.md), labelled with the mesh.
    ``dedupe`` is the family both directions share; the receiver counts its ``inbound``
    half."""

    mesh: str
    received: Counter
    dedupe: Counter
    frame_size: Histogram
    invalid: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry, mesh: str,
                 dedupe: Counter) -> ReceiverMetrics:
        return cls(mesh, Counter("cm_daemon_recv_total", "Deliveries stored in the inbox, by "
                                 "destination kind and sender (peer, or self: this member's "
                                 "own key)", ["mesh", "kind", "from_type"], registry=registry),
                   dedupe,
                   Histogram("cm_daemon_deliver_batch_size",
                             "Deliveries in each frame received from the broker",
                             ["mesh"], registry=registry, buckets=BATCH_BUCKETS),
                   Counter("cm_daemon_invalid_inbound_total", "Deliveries stored marked "
                           "because what they carried could not be used as sent "
                           "(undecryptable, header_refused)", ["mesh", "reason"],
                           registry=registry))


def delivery_of(f: dict[str, Any], key: SigningKey, mesh: str, now_ms: int,
                entry_id: str | None = None, keyring: Keyring | None = None) -> Delivery:
    """A ``deliver`` frame as the inbox stores it: body decoded, a DM opened (with the
    ``keyring``'s archived keys too, when given). A DM that does not open is still stored,
    marked ``tidemesh_undecryptable`` in its meta. The inbox id is derived from the sender
    and client_message_id (the inbox's own key), so a message keeps its id, and a hook its
    ``TIDEMESH_EVENT_ID``, in an inbox rebuilt from the broker; ``entry_id`` overrides it."""
    body = (f["body"].encode("utf-8") if f["body_encoding"] == "utf8"
            else base64.b64decode(f["body"]))
    encoding = f["body_encoding"]
    meta, reply_to = f.get("meta"), f.get("reply_to")
    if f["to"]["kind"] == "dm":
        try:
            opened = (unseal(key, f["sender_pubkey"], body) if keyring is None else
                      keyring.open(f["sender_pubkey"], f["to"]["ref"], body, now_ms))
            if opened.sealed_fields and opened.priority != f["priority"]:
                raise UnsealError(f"the priority outside ({f['priority']}) is not the one "
                                  f"sealed ({opened.priority}): changed on the way")
            wrong = binding_problem(opened, f["sender_pubkey"], f["to"]["ref"],
                                    f.get("client_message_id"))
            if wrong is not None:
                raise UnsealError(wrong)
        except UnsealError as exc:
            log.error("dm_unseal_failed", broker_message_id=f["broker_message_id"],
                      error=str(exc))
            meta = {**(meta or {}), "tidemesh_undecryptable": str(exc)}
        else:
            body, encoding = opened.body, opened.encoding
            if opened.sealed_fields:   # what came in the clear is not the sender's
                meta, reply_to = opened.meta, opened.reply_to
            problems = sealed_fields_problems(opened)
            if problems:
                meta, reply_to, encoding = _readable(f, problems, meta, reply_to, encoding)
            if not opened.bound:   # an envelope of an earlier version: it names nobody
                meta = {**(meta or {}), "tidemesh_unbound": True}
    cmid = f.get("client_message_id") or f["broker_message_id"]
    return Delivery(
        id=entry_id or derived_ulid(f["created_at"], f"{f['sender_pubkey']}\n{cmid}"),
        mesh=mesh, sender_pubkey=f["sender_pubkey"], sender_name=f.get("sender_name"),
        client_message_id=cmid,
        broker_message_id=f["broker_message_id"], dest_kind=f["to"]["kind"],
        dest_ref=f["to"]["ref"], body=body, body_encoding=encoding, priority=f["priority"],
        meta=meta, reply_to=reply_to, epoch=f["epoch"], seq=f["seq"],
        sent_at=f["created_at"], received_at=now_ms, traceparent=f.get("traceparent"),
    )


def _readable(f: dict[str, Any], problems: dict[str, str], meta: dict[str, Any] | None,
              reply_to: str | None, encoding: str
              ) -> tuple[dict[str, Any] | None, str | None, str]:
    """A DM whose sealed header a clear send could not have carried: the fields at fault
    dropped (a body that is not the UTF-8 it claims kept as bytes) and the reasons put in
    ``meta.tidemesh_meta_unreadable``; stored and acked as an undecryptable one is."""
    reason = "; ".join(f"{field} {why}" for field, why in sorted(problems.items()))
    log.warning("dm_header_refused", broker_message_id=f["broker_message_id"],
                sender=f["sender_pubkey"][:16], reason=reason)
    kept = meta if "meta" not in problems else None
    return ({**(kept or {}), "tidemesh_meta_unreadable": reason},
            None if "reply_to" in problems else reply_to,
            "base64" if "body" in problems else encoding)


class Receiver:
    def __init__(self, link: BrokerLink, inbox: InboxService, key: SigningKey, mesh: str,
                 metrics: ReceiverMetrics, clock: Callable[[], float],
                 keyring: Keyring | None = None) -> None:
        self.keyring = keyring
        self.link = link
        self.inbox = inbox
        self.key = key
        self.me = key.verify_key.encode().hex()   # this member's own key, for from_type
        self.mesh = mesh
        self.metrics = metrics
        self.clock = clock

    async def run(self) -> None:
        stored = await self.inbox.receive_cursor()
        order = ReceiveOrder(stored or (0, 0))
        order.resumed(await self._resume(order.cursor, fresh=stored is None))
        while frames := await self._next_frames():
            plan = order.plan([[(d["epoch"], d["seq"]) for d in f] for f in frames])
            # One inbox write per frame; started in frame order, so stored in that order.
            await asyncio.gather(*(
                self._write([f[i] for i in store])
                for f, store in zip(frames, plan.store, strict=True) if store))
            if plan.gap is not None:
                log.warning("delivery_gap_detected", expected=order.cursor[1] + 1,
                            got=plan.gap[1])
                order.resumed(await self._resume(order.cursor))
            ack = order.ack_position()
            if ack is not None:
                await self.link.ack(*ack)

    async def _write(self, frame: list[dict[str, Any]]) -> list[StoreResult | None]:
        now = int(self.clock() * 1000)
        # A queue lease that lapsed here went to another consumer: not stored, but the cursor
        # moves past it so the stream stays gapless.
        items = [Void(d["epoch"], d["seq"], now) if d.get("reassigned")
                 else delivery_of(d, self.key, self.mesh, now, keyring=self.keyring)
                 for d in frame]
        with tracing.span("tidemesh.daemon.store", _parents(items),
                          {"tidemesh.mesh": self.mesh, "tidemesh.batch_size": len(items)}) as hop:
            if len(items) == 1 and isinstance(items[0], Delivery):
                items[0] = _traced(items[0], hop)
            results = await self.inbox.store_frame(items)
        self._account(items, results)
        return results

    def _account(self, items: list[Delivery | Void], results: list[StoreResult | None]
                 ) -> None:
        m = self.metrics
        for d, res in zip(items, results, strict=True):
            if res is None or not isinstance(d, Delivery):
                continue
            if res.inbox_seq is None:
                m.dedupe.labels(direction="inbound", mesh=m.mesh).inc()
                continue
            m.received.labels(mesh=m.mesh, kind=d.dest_kind,
                              from_type="self" if d.sender_pubkey == self.me else "peer").inc()
            if d.meta:
                if "tidemesh_undecryptable" in d.meta:
                    m.invalid.labels(mesh=m.mesh, reason="undecryptable").inc()
                elif "tidemesh_meta_unreadable" in d.meta:
                    m.invalid.labels(mesh=m.mesh, reason="header_refused").inc()

    async def _next_frames(self) -> list[list[dict[str, Any]]]:
        """The frames waiting on the link (at least one), each a list of deliveries."""
        q = self.link.deliveries
        first = await race.next_item(q, self.link.wait_closed())
        if first is None:
            return []
        frames, count = [first], len(first)
        while not q.empty() and count < BATCH:
            frames.append(q.get_nowait())
            count += len(frames[-1])
        observe = self.metrics.frame_size.labels(mesh=self.metrics.mesh).observe
        for f in frames:
            observe(len(f))
        return frames

    async def _resume(self, cursor: Position, fresh: bool = False) -> Position:
        """Resume from ``cursor``. ``fresh``: this inbox has stored nothing yet, so what the
        broker says this member acknowledged was handled by an inbox before it."""
        for _ in range(RESUME_TRIES):
            outcome = resume_outcome(await self.link.resume(*cursor), cursor)
            if fresh and outcome.acked_seq:
                fresh = False
                await self.inbox.record_handled(outcome.position[0], outcome.acked_seq)
            if outcome.ok:
                return outcome.position
            target = outcome.position
            event = log.warning if outcome.result == "STALE_SEQUENCE" else log.error
            event("delivery_resume_refused", result=outcome.result, ours=cursor,
                  resync_to=target)
            await self.inbox.record_event("broker_status", {
                "state": "resynced", "result": outcome.result, "our_position": list(cursor),
                "resynced_to": list(target), "broker_last_seq": outcome.broker_last_seq})
            await self.inbox.reset_receive_cursor(*target)
            cursor = target
        raise LinkError("the broker refused to resume three times")


def _parents(items: list[Delivery | Void]) -> list[str | None]:
    if not tracing.enabled():
        return []
    return [d.traceparent for d in items if isinstance(d, Delivery)]


def _traced(d: Delivery, hop: tracing.Hop) -> Delivery:
    """A lone delivery stored with the store span's traceparent: the inbox item, its event
    and the hooks it fires then name this span as their parent."""
    hop.set("tidemesh.broker_message_id", d.broker_message_id)
    hop.set("tidemesh.client_message_id", d.client_message_id)
    hop.set("tidemesh.kind", d.dest_kind)
    onward = hop.onward(d.traceparent)
    return d if onward is d.traceparent else dataclasses.replace(d, traceparent=onward)


async def forward_presence(link: BrokerLink, inbox: InboxService,
                           on_clone: Callable[[dict[str, Any]], Awaitable[None]] | None = None
                           ) -> None:
    """peer_join / peer_leave frames become events in the local log, until the link closes;
    a clone_suspected frame goes to ``on_clone`` (which records its own event)."""
    while True:
        frame = await race.next_item(link.presence, link.wait_closed())
        if frame is None:
            return
        if frame["type"] == "clone_suspected":
            if on_clone is not None:
                await on_clone(frame)
            continue
        await inbox.record_event(frame["type"], {k: v for k, v in frame.items() if k != "type"})
