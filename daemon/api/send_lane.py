"""The Unix socket's HTTP/1.1 protocol: the answer routes (``routes.LANE``: the two send
routes) framed without aiohttp's request machinery, everything else handed to aiohttp.

Programs on the Unix socket call POST /v1/send and /v1/send_batch far more than anything
else. aiohttp's per-request objects (request, router match, middleware chain, response) cost
the event loop more than the send itself (docs/daemon.md, "The send lane", has the figures).
So this protocol frames requests itself: it finds each head, has httptools parse it, and
when the head is a plain request to one of the lane's routes it calls the same ``answer``
function aiohttp calls for that route, through the middleware's ``plain_unix`` (budget,
in-flight cap, error envelope, metrics). The lane holds no route logic: it only frames.

The first request that is anything else (another route, a query string, a token, a chunked
or oversized body, a head httptools refuses) hands the connection, with every byte not yet
answered, to aiohttp's protocol for the rest of its life: one request in flight per
connection, so nothing is answered out of order. The loopback TCP port stays on aiohttp
throughout; it needs the token and Host checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools
import structlog

from tidemesh.core import numbers
from tidemesh.daemon.api.connections import HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_HEAD
from tidemesh.daemon.api.exchange import JSON_HEADERS, Answer, Answerer, Parsed
from tidemesh.daemon.api.keys import STATE
from tidemesh.daemon.api.middleware import plain_unix
from tidemesh.daemon.api.routes import LANE

log = structlog.get_logger(__name__)

# Headers the lane does not frame or guard: a token (the middleware's capability and TCP
# checks), bodies not framed by a Content-Length, protocol switches. aiohttp has them.
_HAND_OVER = {b"authorization", b"transfer-encoding", b"expect", b"upgrade"}
# Bytes of later requests buffered while one is answered before reading pauses.
_READ_AHEAD = 256 * 1024


@dataclass(slots=True)
class LaneHead:
    """A request head the lane answers itself: which route, the body's length, the header
    fields as ``Parsed.headers``, and how the connection goes on."""

    method: str
    path: str
    answer: Answerer
    length: int
    headers: dict[str, str]
    keep_alive: bool
    http10: bool


class _Fields:
    """httptools' callbacks for one head: the target and the header fields."""

    __slots__ = ("headers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


def lane_head(head: bytes, max_body: int) -> LaneHead | None:
    """The head (request line to the blank line included) as a request the lane answers,
    or None when aiohttp should have it."""
    fields = _Fields()
    parser = httptools.HttpRequestParser(fields)
    try:
        parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        # aiohttp answers these (its 400, or its own take on an upgrade or CONNECT).
        return None
    method = parser.get_method()
    route = LANE.get((method, fields.url))
    if route is None:
        return None
    length: int | None = None
    headers: dict[str, str] = {}
    for name, value in fields.headers:
        lname = name.lower()
        if lname == b"content-length":
            length = None if length is not None else numbers.decimal(value.strip(b" \t"))
            if length is None:
                return None
        elif lname in _HAND_OVER:
            return None
        # As aiohttp decodes them; the first of a name counts, as in its ``headers.get``.
        headers.setdefault(lname.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
    if length is None or length > max_body:
        return None
    return LaneHead(method.decode(), route[0], route[1], length, headers,
                    parser.should_keep_alive(), parser.get_http_version() == "1.0")


class _Date:
    """The Date header's value, made once a second."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = 0
        self.value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second, self.value = second, formatdate(second, usegmt=True).encode()
        return self.value


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
# The header fields of nearly every answer, framed once.
_JSON_FIELDS = b"".join(n.encode() + b": " + v.encode() + b"\r\n" for n, v in JSON_HEADERS)


class Lane:
    """What every connection of the lane shares: the app (its services and state), the
    limits, the connections still open (for shutdown) and the factory of aiohttp's protocol
    (for hand-overs)."""

    def __init__(self, app: Any, max_body: int,
                 aiohttp_protocol: Callable[[], asyncio.Protocol],
                 keepalive_s: float = IDLE_TIMEOUT_S,
                 header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
        self.app = app
        self.state = app[STATE]
        self.keepalive_s = keepalive_s
        self.header_timeout_s = header_timeout_s
        # No deadline of a connection comes sooner than this after the timer is armed.
        self.first_check_s = min(keepalive_s, header_timeout_s)
        self.max_body = max_body
        self.aiohttp_protocol = aiohttp_protocol
        self.connections: set[LaneConnection] = set()
        self.closing = False
        self._date = _Date()

    def protocol(self) -> LaneConnection:
        return LaneConnection(self)

    async def answer(self, head: LaneHead, body: bytes) -> Answer:
        """The route's answer to one framed request; never raises."""
        return await plain_unix(self.app, Parsed(head.method, head.path, head.headers, body,
                                                 "unix"), head.answer)

    def response(self, answer: Answer, head: LaneHead) -> bytes:
        """The answer framed as aiohttp frames it: the request's HTTP version, and a
        Connection header only where it differs from that version's default."""
        connection = (b"Connection: keep-alive\r\n" if head.keep_alive and head.http10 else
                      b"Connection: close\r\n" if not head.keep_alive and not head.http10 else
                      b"")
        fields = (_JSON_FIELDS if answer.headers is JSON_HEADERS else
                  b"".join(name.encode() + b": " + value.encode() + b"\r\n"
                           for name, value in answer.headers))
        status = answer.status
        return b"".join((
            b"HTTP/1.0 " if head.http10 else b"HTTP/1.1 ", str(status).encode(), b" ",
            _REASONS.get(status, b""), b"\r\n", fields, b"Content-Length: ",
            str(len(answer.body)).encode(), b"\r\nDate: ", self._date.now(), b"\r\n",
            connection, b"\r\n", answer.body))

    def close_idle(self) -> None:
        """Close idle connections now and busy ones after their answer; refuse new ones."""
        self.closing = True
        for conn in list(self.connections):
            conn.close_when_idle()

    async def close(self, grace_s: float) -> None:
        """After the drain: wait up to ``grace_s`` for answers still being written, then cut
        off what is left (the drain has counted it). ``close_idle`` ran before the drain, and
        a busy connection closes itself after its answer while the lane is closing."""
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self.connections):
            conn.abort()


class LaneConnection(asyncio.Protocol):
    """One connection on the Unix socket, while the lane answers it."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: LaneHead | None = None
        self.head_len = 0
        self.task: asyncio.Task[None] | None = None
        self.reading_paused = False
        self.writable: asyncio.Future[None] | None = None
        self.eof = False
        # Idle keep-alive and the header timeout: one timer per connection, moved on lazily
        # (``_idle_check``), so a request costs two clock reads, not a timer. ``active_at``:
        # the last answer; ``request_at``: the first byte of the request being read (for the
        # first request, the connection itself).
        self.active_at = 0.0
        self.request_at = 0.0
        self.answered = False
        self.idle_timer: asyncio.TimerHandle | None = None
        # Kept from connection_made: on Python 3.11 every get_running_loop() is a getpid()
        # system call, and the lane would make two a request.
        self.loop: asyncio.AbstractEventLoop | None = None

    # -------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        if self.lane.closing:
            transport.close()
            return
        self.lane.connections.add(self)
        self.loop = loop = asyncio.get_running_loop()
        self.active_at = self.request_at = loop.time()
        self.idle_timer = loop.call_at(self.request_at + self.lane.first_check_s,
                                       self._idle_check)

    def connection_lost(self, exc: Exception | None) -> None:
        # A request being answered still commits; only its answer has nowhere to go.
        self.lane.connections.discard(self)
        self.transport = None
        self._stop_idle_timer()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self.buf and self.loop is not None:
            self.request_at = self.loop.time()
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > _READ_AHEAD and not self.reading_paused and self.transport:
            self.transport.pause_reading()
            self.reading_paused = True

    def eof_received(self) -> bool:
        self.eof = True
        # Keep the write side open while a request is answered; close once it is.
        return self.task is not None

    def pause_writing(self) -> None:
        if self.loop is not None and (self.writable is None or self.writable.done()):
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # -------------------------------------------------------------- framing
    def _next(self) -> None:
        """Start answering the next buffered request, if it is all here."""
        buf = self.buf
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._hand_over()
                return
            self.head_len = end + 4
            self.head = lane_head(bytes(buf[:self.head_len]), self.lane.max_body)
            if self.head is None:
                self._hand_over()
                return
        need = self.head_len + self.head.length
        if len(buf) < need:
            return
        body = bytes(buf[self.head_len:need])
        del buf[:need]
        head, self.head = self.head, None
        assert self.loop is not None  # set with the transport
        self.task = self.loop.create_task(self._serve(head, body))

    async def _serve(self, head: LaneHead, body: bytes) -> None:
        try:
            await self._answer(head, body)
        except Exception:  # the answer itself never raises: this is a defect, logged
            log.exception("ipc_lane_failed", path=head.path)
            self.abort()

    async def _answer(self, head: LaneHead, body: bytes) -> None:
        answer = await self.lane.answer(head, body)
        transport = self.transport
        if transport is None:
            self.task = None
            return
        transport.write(self.lane.response(answer, head))
        assert self.loop is not None
        self.active_at = self.loop.time()
        self.answered = True
        if self.writable is not None:
            await self.writable
        self.task = None
        if not head.keep_alive or self.eof or self.lane.closing:
            transport.close()
            return
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        if self.buf:   # the next request's clock starts with this answer at the latest
            self.request_at = self.active_at
            self._next()

    def _hand_over(self) -> None:
        """From here on aiohttp's protocol owns the connection, starting with what is
        buffered (the request the lane does not answer, and anything after it)."""
        transport = self.transport
        if transport is None:
            return
        self.lane.connections.discard(self)
        self._stop_idle_timer()   # aiohttp keeps its own from here
        protocol = self.lane.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            protocol.data_received(data)
        if self.reading_paused:
            transport.resume_reading()
        if self.eof:
            protocol.eof_received()
        self.transport = None

    # -------------------------------------------------------------- idle keep-alive
    def _idle_check(self) -> None:
        """Close the connection when it has waited too long: idle since its last answer for
        the keep-alive time, or a request head (the first from the connection's start, a
        later one from its first byte) not complete within the header timeout, or a body
        not complete within the keep-alive time of its request's start."""
        transport, loop = self.transport, self.loop
        if transport is None or loop is None:
            return
        now = loop.time()
        lane = self.lane
        if self.task is not None:            # being answered: look again later
            self.idle_timer = loop.call_at(now + lane.first_check_s, self._idle_check)
            return
        if self.buf or not self.answered:    # a request is (or should be) arriving
            wait = lane.header_timeout_s if self.head is None else lane.keepalive_s
            due = self.request_at + wait
        else:
            due = self.active_at + lane.keepalive_s
        if now >= due:
            transport.close()
            return
        self.idle_timer = loop.call_at(due, self._idle_check)

    def _stop_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    # -------------------------------------------------------------- shutdown
    def close_when_idle(self) -> None:
        if self.task is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.close()
