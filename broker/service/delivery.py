"""Getting committed messages to recipients: resume (where a daemon's stream picks up), the
per-connection pump, acks, and moving lapsed queue leases to another consumer.

The pump first has the store hand the member what its topics logged (a topic is a log, a
subscriber a cursor: ``broker/topiclog.py``), then reads its committed deliveries in seq
order, so deliveries are gapless and in order no matter which connection accepted the
message; frames go out only after the store commits.
A daemon that negotiated ``deliver_batch`` gets each page of due deliveries as few frames as
the caps allow (``batch_groups``); any other gets one ``deliver`` frame per delivery.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import structlog

from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.session import ResumeResult, decide_resume
from tidemesh.broker.store.base import DeliveryRow, Store
from tidemesh.core import heap, tracing
from tidemesh.core.backoff import Backoff
from tidemesh.core.cancelling import being_cancelled
from tidemesh.core.features import DELIVER_BATCH_MAX_BYTES, DELIVER_BATCH_MAX_COUNT

log = structlog.get_logger(__name__)
PUMP_PAGE = DELIVER_BATCH_MAX_COUNT
# Rows all pumps may read at once: pumps woken together share one page query, and a full
# page for each of 1,000 members (a burst) was 256,000 rows decoded at once; the broker's
# RSS went from 110 to 566 MB and stayed there, its allocator keeping the pages it had
# used (bench/members.py, issue #30; 193 MB with this budget). A page is smaller with many
# connections; a member behind gets the rest on its next page.
PUMP_ROWS = 32_768
PUMP_PAGE_MIN = 32
PUMP_BACKOFF = Backoff(initial_s=0.5, maximum_s=10.0)
# '{"type":"deliver_batch","deliveries":[' … ']}' around the items and their commas.
BATCH_HEAD = b'{"type":"deliver_batch","deliveries":['
BATCH_TAIL = b"]}"
BATCH_ENVELOPE_BYTES = len(BATCH_HEAD + BATCH_TAIL)


class Deliveries:
    def __init__(self, store: Store, metrics: Metrics, connections: Connections) -> None:
        self.store = store
        self.metrics = metrics
        self.connections = connections
        self._rng = random.Random()  # noqa: S311 - jitter, not secrets
        self.sent = 0   # deliveries pushed, for the heap trim after a burst
        self._trim = heap.TrimPolicy()

    async def resume(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        cur = await self.store.cursor(conn.mesh_id, conn.pubkey)
        result = decide_resume(frame["epoch"], frame["last_seq"], cur.epoch, cur.last_seq,
                               cur.compacted_seq)
        answer = {"type": "resume_ack", "id": frame["id"], "result": result.value,
                  "epoch": cur.epoch, "broker_last_seq": cur.last_seq,
                  "compacted_seq": cur.compacted_seq,
                  # A daemon with a rebuilt inbox stores what is at or below this again
                  # without running its hooks or offering it again (daemon/store/handled.py).
                  "acked_seq": cur.acked_seq}
        if result is ResumeResult.OK:
            last = frame["last_seq"] if frame["epoch"] else 0
            answer["last_seq"] = last
            if last:  # what the daemon stored is acked by the resume itself
                await self.store.ack(conn.mesh_id, conn.pubkey, cur.epoch, last, now_ms())
            conn.epoch, conn.sent_seq, conn.pumping = cur.epoch, last, True
            conn.wake.set()
        else:
            log.warning("broker_resume_refused", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                        result=result.value, epoch=frame["epoch"], last_seq=frame["last_seq"])
        return answer

    async def ack(self, conn: Conn, frame: dict[str, Any]) -> None:
        await self.store.ack(conn.mesh_id, conn.pubkey, frame["epoch"], frame["seq"], now_ms())

    async def pump(self, conn: Conn) -> None:
        """Send committed deliveries after ``conn.sent_seq``, in order, whenever woken. A
        store that fails (down, restarting) is retried after a backoff, the connection
        kept: the rows wait in the store."""
        failures = 0
        while True:
            await conn.wake.wait()
            conn.wake.clear()
            if not conn.pumping or conn.muted:
                continue
            try:
                await self._send_due(conn)
            except self.store.outage_errors as exc:
                if being_cancelled():   # the cancel came as a store error: stop, not retry
                    raise asyncio.CancelledError from exc
                failures += 1
                delay = PUMP_BACKOFF.delay(failures, self._rng)
                self.metrics.background_errors.labels(task="pump", kind="transient").inc()
                if failures == 1:   # once per outage and connection, not once per retry
                    log.warning("broker_pump_retrying", mesh_id=conn.mesh_id,
                                pubkey=conn.pubkey, error=repr(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                conn.wake.set()
                continue
            if failures:
                log.info("broker_pump_recovered", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                         failures=failures)
                failures = 0

    async def _send_due(self, conn: Conn) -> None:
        # What the member's topics logged since it was last handed any takes its next seqs
        # first (pumps woken together share the transaction); again once its pages have
        # caught up, if the hand-out left some (more than it gives at once). What is logged
        # meanwhile wakes the pump again: a burst costs a hand-out per wake-up, not per page.
        # The first page comes with the hand-out (one store call: on PostgreSQL one
        # transaction, no second turn of the pool before the frames go out).
        page = page_size(self.connections.count)
        logged, conn.logged = conn.logged, False
        more, rows = await self.store.hand_out_page(conn.mesh_id, conn.pubkey, conn.epoch,
                                                    conn.sent_seq, page, now_ms(), logged)
        while True:
            await self._send_page(conn, rows)
            full, page = len(rows) >= page, page_size(self.connections.count)
            if full:
                rows = await self.store.deliveries_after(conn.mesh_id, conn.pubkey, conn.epoch,
                                                         conn.sent_seq, page)
            elif more:
                more, rows = await self.store.hand_out_page(conn.mesh_id, conn.pubkey,
                                                            conn.epoch, conn.sent_seq, page,
                                                            now_ms())
            else:
                return

    async def _send_page(self, conn: Conn, rows: list[DeliveryRow]) -> None:
        """A page as few frames as the caps allow (one per delivery for a daemon that did
        not negotiate ``deliver_batch``), each delivery encoded once: its frame's dict is
        gone before the next is built, so a pump waiting for room in its queue holds the
        page's rows and their bytes, not their frames (1,000 pumps hold a page each)."""
        parts = [orjson.dumps(deliver_frame(row, conn.trace_context)) for row in rows]
        groups = batch_groups(parts) if conn.batch_deliveries else [(i, i + 1)
                                                                   for i in range(len(parts))]
        for first, end in groups:
            with _delivery_span(conn, rows[first:end]) as onward:
                if onward is not None:   # a lone delivery's frame names the push's span
                    parts[first] = orjson.dumps({**deliver_frame(rows[first]),
                                                 "traceparent": onward})
                await conn.peer.send_text(
                    parts[first].decode() if end - first == 1
                    else (BATCH_HEAD + b",".join(parts[first:end]) + BATCH_TAIL).decode())
            conn.sent_seq = rows[end - 1].seq
            self.sent += end - first
            self.metrics.delivered.inc(end - first)
            self.metrics.deliver_batch.observe(end - first)

    async def trim_heap(self) -> None:
        """Once a burst of deliveries has gone quiet, give the C heap's free pages back to
        the system (``core/heap.py``): what the burst's pages and frames took stays otherwise."""
        if self._trim.due(self.sent):
            start = time.perf_counter()
            trimmed = heap.trim()
            log.debug("broker_heap_trimmed", released=trimmed,
                      took_ms=round(1000 * (time.perf_counter() - start), 2))

    async def reassign_lapsed(self, lease_s: float) -> int:
        """Queue leases (DESIGN §5.4): deliveries not acked within the lease go to another
        consumer; both recipients' pumps are woken (the old one gets a void delivery)."""
        now = now_ms()
        moved = await self.store.reassign_lapsed(now - int(lease_s * 1000), now)
        for m in moved:
            log.info("broker_queue_lease_lapsed", mesh_id=m.mesh_id,
                     broker_message_id=m.broker_message_id, from_pubkey=m.from_pubkey,
                     to_pubkey=m.to_pubkey)
        self.connections.wake({(m.mesh_id, m.to_pubkey) for m in moved})
        return len(moved)


def page_size(connections: int) -> int:
    """Rows one pump reads at once with ``connections`` open (``PUMP_ROWS``)."""
    return max(PUMP_PAGE_MIN, min(PUMP_PAGE, PUMP_ROWS // max(1, connections)))


@contextlib.contextmanager
def _delivery_span(conn: Conn, rows: Sequence[DeliveryRow]) -> Iterator[str | None]:
    """The push of one frame to the recipient's connection queue. A lone delivery's frame
    carries the span's traceparent (yielded: the frame is encoded again with it), so the
    recipient's inbox store is its child. A daemon that takes no trace context gets no
    span (it would start a trace of its own)."""
    if not tracing.enabled() or not conn.trace_context:
        yield None
        return
    with tracing.span("tidemesh.broker.deliver", [r.traceparent for r in rows],
                      {"tidemesh.mesh": conn.mesh_id, "tidemesh.batch_size": len(rows)}) as hop:
        onward = None
        if len(rows) == 1:
            hop.set("tidemesh.broker_message_id", rows[0].broker_message_id)
            hop.set("tidemesh.seq", rows[0].seq)
            if rows[0].traceparent is not None:
                onward = hop.onward(rows[0].traceparent)
        yield onward


def batch_groups(parts: Sequence[bytes], max_count: int = DELIVER_BATCH_MAX_COUNT,
                 max_bytes: int = DELIVER_BATCH_MAX_BYTES) -> list[tuple[int, int]]:
    """Split encoded ``deliver`` frames, kept in order, into runs ``[first, end)`` that each
    fit one ``deliver_batch`` frame: at most ``max_count`` items and ``max_bytes`` encoded.
    An item larger than the byte cap on its own makes a run of one."""
    groups: list[tuple[int, int]] = []
    first, size = 0, BATCH_ENVELOPE_BYTES
    for i, part in enumerate(parts):
        n = len(part) + 1  # its comma
        if i > first and (i - first >= max_count or size + n > max_bytes):
            groups.append((first, i))
            first, size = i, BATCH_ENVELOPE_BYTES
        size += n
    if parts:
        groups.append((first, len(parts)))
    return groups


def deliver_frame(row: DeliveryRow, trace_context: bool = True) -> dict[str, Any]:
    body = (row.body.decode("utf-8") if row.body_encoding == "utf8"
            else base64.b64encode(row.body).decode("ascii"))
    frame: dict[str, Any] = {
        "type": "deliver", "epoch": row.epoch, "seq": row.seq,
        "broker_message_id": row.broker_message_id, "sender_pubkey": row.sender_pubkey,
        "client_message_id": row.client_message_id, "to": {"kind": row.kind, "ref": row.ref},
        "body": body, "body_encoding": row.body_encoding, "priority": row.priority,
        "meta": row.meta, "reply_to": row.reply_to, "created_at": row.created_at,
    }
    if row.history_id is not None:
        frame["history_id"] = row.history_id
    if row.reassigned:
        frame["reassigned"] = True
    if row.sender_name is not None:
        frame["sender_name"] = row.sender_name
    if trace_context and row.traceparent is not None:
        frame["traceparent"] = row.traceparent
    return frame
