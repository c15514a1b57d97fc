"""GET /v1/events: Server-Sent Events from the durable event log, then live.

Every event carries ``id:``, the gapless id of the local event log, so a program that
reconnects with ``Last-Event-ID`` (or ``?since=``) gets exactly what it missed, across
daemon restarts. Subscribing happens before the backlog is read, and live events at or
below the last replayed id are skipped, so nothing falls between backlog and live.
"""

from __future__ import annotations

import asyncio

import orjson
import structlog
from aiohttp import web

from tidemesh.core import numbers
from tidemesh.core.errors import InvalidRequest
from tidemesh.daemon import race
from tidemesh.daemon.api.keys import BUS, INBOX, STATE
from tidemesh.daemon.records import Event
from tidemesh.daemon.service.events import Subscriber
from tidemesh.daemon.service.inbox import InboxService

log = structlog.get_logger(__name__)
BACKLOG_PAGE = 500


def _start_id(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("since") or "0"
    start = numbers.decimal(raw)
    if start is None or start > numbers.MAX_ID:
        raise InvalidRequest("Last-Event-ID / since must be a non-negative event id",
                             field="since")
    return start


def frame(event: Event) -> bytes:
    return (f"id: {event.id}\nevent: {event.type}\ndata: ".encode()
            + orjson.dumps(event.data) + b"\n\n")


async def get_events(request: web.Request) -> web.StreamResponse:
    after = _start_id(request)
    state, bus, inbox = request.app[STATE], request.app[BUS], request.app[INBOX]
    sub = bus.subscribe()
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache, no-transform",
        "X-Accel-Buffering": "no",
    })
    try:
        await resp.prepare(request)
        await resp.write(b"retry: 2000\n: connected\n\n")
        after = await _reconcile(resp, inbox, after)
        after = await _replay(resp, inbox, after, state.sse_write_timeout_s)
        await _live(resp, sub, after, state.sse_keepalive_s, state.sse_write_timeout_s)
    except (ConnectionResetError, TimeoutError) as exc:
        log.info("event_stream_closed", reason=type(exc).__name__)
    finally:
        bus.unsubscribe(sub)
    return resp


def notice(kind: str, data: dict[str, int]) -> bytes:
    """An event about the stream itself: no ``id:``, so a client's Last-Event-ID stays put."""
    return f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


async def _reconcile(resp: web.StreamResponse, inbox: InboxService, after: int) -> int:
    """A start id the log can no longer serve is answered, never met with silence: older than
    what retention kept (history_truncated), or newer than any event given (cursor_ahead,
    e.g. after the inbox was rebuilt). Both replay from the oldest event kept."""
    pruned, last = await inbox.event_bounds()
    if after > last:
        await resp.write(notice("cursor_ahead", {
            "requested_after": after, "last_event_id": last, "replay_from": pruned + 1}))
        log.info("event_stream_cursor_ahead", requested_after=after, last_event_id=last)
        return pruned
    if after < pruned:
        await resp.write(notice("history_truncated", {
            "requested_after": after, "oldest_available": pruned + 1,
            "missed": pruned - after}))
        return pruned
    return after


async def _write(resp: web.StreamResponse, data: bytes, stall_s: float) -> None:
    async with asyncio.timeout(stall_s):
        await resp.write(data)


async def _replay(resp: web.StreamResponse, inbox: InboxService, after: int,
                  stall_s: float) -> int:
    while True:
        events = await inbox.events_after(after, BACKLOG_PAGE)
        for ev in events:
            await _write(resp, frame(ev), stall_s)
            after = ev.id
        if len(events) < BACKLOG_PAGE:
            return after


async def _live(resp: web.StreamResponse, sub: Subscriber, after: int, keepalive: float,
                stall_s: float) -> None:
    while not sub.dropped.is_set():
        ev = await race.next_item(sub.queue, sub.dropped.wait(), within=keepalive)
        if ev is None:
            if not sub.dropped.is_set():
                await _write(resp, b": keepalive\n\n", stall_s)
            continue
        if ev.id > after:
            await _write(resp, frame(ev), stall_s)
            after = ev.id
    log.info("event_stream_dropped", reason="closed_or_buffer_full", last_id=after)
