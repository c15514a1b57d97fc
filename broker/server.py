"""The websockets adapter: one handler per connection, plus ``/metrics`` on the same port.

Reads frames, feeds them to the pure ``Session``, and carries out its actions. Send frames
are pipelined: each ``send`` or ``send_batch`` runs in its own task as one store operation
(at most ``max_inflight`` sends per connection; past that the reader stops reading, which
pushes back on the daemon through TCP), and its answer goes out when it has committed,
matched by ``id``. Every task of a connection lives in that connection's
``TaskGroup``; its frames go out through its own writer task (``WsPeer``, over the queue of
``broker/outgoing.py``), so that no one waits on another member's socket. The only module
of the broker that imports websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tidemesh.broker.console import Console
from tidemesh.broker.outgoing import CloseAfter, Outgoing, QueueLimits
from tidemesh.broker.service import BrokerService, Conn, routes
from tidemesh.broker.service.clone import NOT_SUSPECTED
from tidemesh.broker.service.clone import REASON as CLONE_REASON
from tidemesh.broker.service.connections import now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.session import Authenticate, Close, Dispatch, Send, Session
from tidemesh.core import handshake, metrics
from tidemesh.core.wire import CloseCode, FrameType, encode

log = structlog.get_logger(__name__)
# How long a close may take before the TCP connection is dropped instead.
CLOSE_GRACE_S = 5.0


class WsPeer:
    """A connection's far end. Frames go out through the connection's own writer task
    (``run``), so that what one member's socket does never holds up anyone else: its own
    tasks wait for room in its queue, presence about others is coalesced and never waits,
    and a reader that takes nothing for ``slow_reader_s`` is cut off (4012 ``slow_reader``).
    """

    def __init__(self, ws: ServerConnection, metrics: Metrics, limits: QueueLimits,
                 slow_reader_s: float) -> None:
        self.ws = ws
        self.metrics = metrics
        self.out = Outgoing(limits)
        self.slow_reader_s = slow_reader_s
        self._queued = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._writer: asyncio.Task[None] | None = None
        self._shutting = False

    def start(self) -> None:
        self._writer = asyncio.create_task(self.run(), name="broker-connection-writer")

    async def stop(self) -> None:
        """The handler is done: a close under way finishes (bounded by its grace), anything
        else the writer was doing is dropped."""
        assert self._writer is not None
        if not self._shutting:
            self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer

    async def close_now(self, code: int, reason: str) -> None:
        """Close from the handler itself, ahead of whatever is queued."""
        assert self._writer is not None
        if not self._shutting:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            await self.shut(code, reason)

    async def send_frame(self, frame: dict[str, Any]) -> None:
        """Queue one of the connection's own frames, after waiting for room (at most until
        the writer cuts a reader off); dropped once the connection is closing."""
        await self.send_text(encode(frame))

    async def send_text(self, text: str) -> None:
        """``send_frame`` for a frame encoded already."""
        while not self.out.has_room():
            self._room.clear()
            await self._room.wait()
        self.out.put(text)
        self._queued.set()

    def tell(self, frame: dict[str, Any]) -> None:
        """Queue a presence event about another member; never waits."""
        if self.out.tell(frame):
            self.metrics.presence_dropped.inc()
        self._queued.set()

    def tell_batch(self, text: str) -> bool:
        """Queue an encoded presence_batch frame; never waits. True when an older one was
        pushed out."""
        dropped = self.out.tell_batch(text) > 0
        if dropped:
            self.metrics.presence_dropped.inc()
        self._queued.set()
        return dropped

    async def close(self, code: int, reason: str) -> None:
        """Close after the frames already queued; returns at once (the writer closes)."""
        self.out.close_after(code, reason)
        self._queued.set()
        self._room.set()   # waiting producers stop waiting: their frames are dropped

    def gone(self) -> None:
        """The connection ended: nothing more is sent, and no producer waits for room."""
        self.out.cut()
        self._room.set()

    async def run(self) -> None:
        """The writer: frames out in queue order until the close or the end."""
        try:
            while True:
                await self._queued.wait()
                self._queued.clear()
                while (item := self.out.take()) is not None:
                    if self.out.has_room():
                        self._room.set()
                    if isinstance(item, CloseAfter):
                        await self.shut(item.code, item.reason)
                        return
                    try:
                        async with asyncio.timeout(self.slow_reader_s):
                            await self.ws.send(item if isinstance(item, str) else encode(item))
                    except TimeoutError:
                        await self._cut()
                        return
        except ConnectionClosed:
            pass
        finally:
            self.gone()

    async def _cut(self) -> None:
        self.gone()
        self.metrics.slow_readers.inc()
        log.warning("broker_slow_reader_closed", slow_reader_s=self.slow_reader_s,
                    remote=str(self.ws.remote_address))
        await self.shut(CloseCode.SLOW_READER, "slow_reader")

    async def shut(self, code: int, reason: str) -> None:
        self._shutting = True
        # A reader that does not read cannot take the close frame either: past the grace,
        # drop the TCP connection.
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self.ws.close(code, reason)
        except TimeoutError:
            self.ws.transport.abort()


class HeardConnection(ServerConnection):
    """A connection that knows when its peer last said anything: a frame, a ping or a pong
    (any bytes). The broker sends no keepalive pings of its own by default: each is a frame,
    a task wake-up and a timer per member, most of an idle broker's CPU at 1,000 members
    (docs/broker.md, Admission). Members ping the broker; ``BrokerServer.close_silent`` closes
    one that has said nothing for ``server.idle_timeout_s``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heard_at = time.monotonic()
        self.peer: WsPeer | None = None

    def data_received(self, data: bytes) -> None:
        self.heard_at = time.monotonic()
        super().data_received(data)


@dataclass(slots=True)
class Live:
    """One connection as its handler holds it: what the finally must undo."""

    peer: WsPeer
    session: Session
    conn: Conn | None = None    # registered (set the moment it is)
    pump: asyncio.Task[None] | None = None
    resync: asyncio.Task[None] | None = None    # presence snapshots again after a drop
    joins: bool = False         # its peer_join is still to be announced


class BrokerServer:
    def __init__(self, service: BrokerService, *, max_inflight: int = 256, max_bad: int = 20,
                 bad_window_s: float = 10.0, max_frame_bytes: int = 4 << 20,
                 hello_timeout_s: float = 10.0, send_queue_frames: int = 1024,
                 slow_reader_s: float = 30.0, handshake_concurrency: int = 64,
                 ping_interval_s: float = 0.0, idle_timeout_s: float = 60.0) -> None:
        self.service = service
        self.ping_interval_s = ping_interval_s or None   # 0: no pings of the broker's own
        self.idle_timeout_s = idle_timeout_s
        # Hellos authenticated at once (store lookups, the session claim); the others wait
        # their turn off the hello clock (issue #30: a storm of 1,000 overran it).
        self.admission = asyncio.Semaphore(handshake_concurrency)
        self.queue_limits = QueueLimits(frames=send_queue_frames)
        self.slow_reader_s = slow_reader_s
        self.max_inflight = max_inflight
        self.max_bad = max_bad
        self.bad_window_s = bad_window_s
        self.max_frame_bytes = max_frame_bytes
        self.hello_timeout_s = hello_timeout_s
        self.server: Server | None = None
        # The loop watchdog's view (core/watchdog.py), set by the composition root.
        self.loop_state: Callable[[], dict[str, Any]] = lambda: {"state": "ok"}
        self.console: Console | None = None   # set when console.enabled

    async def start(self, host: str, port: int) -> BrokerServer:
        self.server = await serve(self.handler, host, port, process_request=self.process,
                                  create_connection=HeardConnection,
                                  max_size=self.max_frame_bytes, compression=None,
                                  ping_interval=self.ping_interval_s,
                                  ping_timeout=self.ping_interval_s)
        log.info("broker_listening", host=host, port=self.port)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(next(iter(self.server.sockets)).getsockname()[1])

    async def stop(self, within: float = 10.0) -> None:
        """Close every connection, bounded: a closing handshake whose frame cannot be written
        (a member that stopped reading) would wait without end, so whatever is still open
        after ``within`` seconds is dropped."""
        if self.server is not None:
            self.server.close()
            try:
                async with asyncio.timeout(within):
                    await self.server.wait_closed()
            except TimeoutError:
                dropped = 0
                for conn in list(self.server.all_connections):
                    conn.transport.abort()
                    dropped += 1
                log.warning("broker_connections_dropped_on_stop", connections=dropped,
                            within_s=within)
        self.service.connections.stop()

    async def close_silent(self) -> int:
        """Close (4015 silent) each open connection heard from not once, not even a ping,
        in ``idle_timeout_s``: its member's host or network went away without a word, and
        without this it would stay registered and present. Returns how many; the broker's
        job of ``server.idle_timeout_s / 4`` runs it."""
        if self.server is None:
            return 0
        cutoff = time.monotonic() - self.idle_timeout_s
        silent = [peer for ws in self.server.connections
                  if isinstance(ws, HeardConnection) and ws.heard_at < cutoff
                  and (peer := ws.peer) is not None]
        for peer in silent:
            await peer.close(CloseCode.SILENT, "silent")
        if silent:
            self.service.metrics.silent_closed.inc(len(silent))
            log.warning("broker_silent_connections_closed", connections=len(silent),
                        idle_timeout_s=self.idle_timeout_s)
        return len(silent)

    async def process(self, connection: ServerConnection, request: Request
                      ) -> Response | None:
        if self.console is not None and request.path.startswith("/console"):
            status, headers, body = await self.console.respond(
                dict(request.headers.raw_items()), request.path, self.loop_state()["state"])
            resp = connection.respond(status, body)
            for name, value in headers.items():
                if name in resp.headers:
                    del resp.headers[name]
                resp.headers[name] = value
            return resp
        return self.http(connection, request)

    def http(self, connection: ServerConnection, request: Request) -> Response | None:
        """Plain HTTP on the WebSocket port: ``/metrics`` and ``/healthz``."""
        if request.path == "/metrics":
            resp = connection.respond(
                HTTPStatus.OK, metrics.render(self.service.metrics.registry).decode())
            del resp.headers["Content-Type"]
            resp.headers["Content-Type"] = metrics.CONTENT_TYPE_LATEST
            return resp
        if request.path == "/healthz":
            if self.loop_state()["state"] == "stalled":
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "stalled\n")
            return connection.respond(HTTPStatus.OK, "ok\n")
        return None

    async def handler(self, ws: ServerConnection) -> None:
        # Each connection runs in its own task: this binds its lines alone, and lets
        # logfilters.Repeats bound what one connection can make the broker write.
        structlog.contextvars.bind_contextvars(conn=ws.id.hex[:12])
        peer = WsPeer(ws, self.service.metrics, self.queue_limits, self.slow_reader_s)
        if isinstance(ws, HeardConnection):
            ws.peer = peer
        peer.start()
        live = Live(peer, Session(handshake.new_nonce(), self.max_bad, self.bad_window_s))
        try:
            await self._serve(ws, live)
        except ConnectionClosed:
            pass
        except TimeoutError:  # no good hello in time: a socket squatter, not a member
            self.service.auth.handshake_closed("hello_timeout")
            await peer.close_now(CloseCode.POLICY, "hello_timeout")
        except Exception as exc:  # one broken connection must not take the server down
            await self._failed(peer, exc)
        finally:
            # Unregistered first, with nothing awaited before: the registry (and the
            # connections gauge) never keeps a connection that ended, however it ended.
            conn = live.conn
            last = self.service.connections.unregister(conn) if conn is not None else False
            await peer.stop()
            if conn is not None:
                await self._left(conn, last)

    async def _serve(self, ws: ServerConnection, live: Live) -> None:
        await live.peer.send_frame(live.session.challenge().frame)
        async with asyncio.timeout(self.hello_timeout_s) as deadline, \
                asyncio.TaskGroup() as tg:
            inflight = asyncio.Semaphore(self.max_inflight)
            loop = asyncio.get_running_loop()   # once: each call is a getpid() on 3.11
            try:
                async for raw in ws:
                    conn = live.conn
                    if conn is not None and conn.hold_until_ms > (now := now_ms()):
                        await asyncio.sleep((conn.hold_until_ms - now) / 1000)
                    for action in live.session.on_text(raw, loop.time()):
                        if isinstance(action, Authenticate):
                            await self._admitted(live, action, tg, deadline)
                            if live.conn is not None:
                                deadline.reschedule(None)
                                # Announced outside the hello deadline.
                                await self._announce_join(live)
                        elif isinstance(action, Dispatch):
                            assert live.conn is not None
                            await self._dispatch(tg, inflight, live.conn, action.frame)
                        else:
                            await self._carry_out(live.peer, action)
            finally:
                live.peer.gone()   # the reader ended: no task of this connection waits for room
                for task in (live.pump, live.resync):
                    if task is not None:
                        task.cancel()

    async def _admitted(self, live: Live, action: Authenticate, tg: asyncio.TaskGroup,
                        deadline: asyncio.Timeout) -> None:
        """Authenticate once a handshake slot is free. The good hello came in time: waiting
        for the slot is not on its clock, the authentication is (a clock of its own)."""
        metrics = self.service.metrics
        deadline.reschedule(None)
        metrics.handshakes_waiting.inc()
        try:
            await self.admission.acquire()
        finally:
            metrics.handshakes_waiting.dec()
        try:
            metrics.handshakes_running.inc()
            deadline.reschedule(asyncio.get_running_loop().time() + self.hello_timeout_s)
            await self._authenticate(live, action, tg)
        finally:
            metrics.handshakes_running.dec()
            self.admission.release()

    async def _left(self, conn: Conn, last: bool) -> None:
        try:
            gone = await self.service.peering.disconnected(conn, last)
        except self.service.store.outage_errors as exc:
            # The next heartbeat releases it (and announces the leave) once the store is back.
            log.warning("broker_session_release_failed", error=repr(exc))
            self.service.peering.release_later(conn)
            return
        if gone or (last and conn.rotated_out):
            await self.service.connections.announce(conn, "peer_leave")

    async def _failed(self, peer: WsPeer, exc: Exception) -> None:
        rest = exc.split(ConnectionClosed)[1] if isinstance(exc, ExceptionGroup) else exc
        if rest is None:
            return  # the TaskGroup wrapped a dropped connection (kill -9, a cut): normal
        outage = self.service.store.outage_errors
        if (rest.split(outage)[1] is None if isinstance(rest, ExceptionGroup)
                else isinstance(rest, outage)):
            # The database is down or restarting: the member should come back, not worry.
            log.warning("broker_connection_closed_store_unavailable", error=repr(rest))
            await peer.close_now(CloseCode.TRY_AGAIN_LATER, "store_unavailable")
            return
        log.error("broker_connection_failed", error=repr(exc), exc_info=True)
        await peer.close_now(CloseCode.INTERNAL, "internal_error")

    async def _resync(self, conn: Conn) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.service.connections.resync(conn)

    async def _pump(self, conn: Conn) -> None:
        # Undelivered rows stay in delivery_queue; the next resume sends them.
        with contextlib.suppress(ConnectionClosed):
            await self.service.deliveries.pump(conn)

    async def _authenticate(self, live: Live, action: Authenticate,
                            tg: asyncio.TaskGroup) -> None:
        """Check the hello, register the member (in ``live``, before anything else is
        awaited, so that the handler's finally unregisters it whatever happens next), answer
        hello_ack or the close, and claim the member's session."""
        out = await self.service.auth.authenticate(action.frame)
        first = False
        host = action.frame.get("host_fingerprint")
        clone = NOT_SUSPECTED
        if out.problem is None:
            clone = await self.service.clones.check(out.mesh_id, out.pubkey, host)
            if clone.refuse_new:
                self.service.metrics.rejected.labels(reason=CLONE_REASON).inc()
                for a in live.session.refuse(CloseCode.CLONE, CLONE_REASON):
                    await self._carry_out(live.peer, a)
                return
            live.conn, first = self.service.connections.register(
                live.peer, out.mesh_id, out.pubkey, out.display_name, host)
        conn = live.conn
        for a in live.session.on_member(out.mesh_id, out.mesh_name, out.pubkey,
                                        conn.session_id if conn else "", out.problem,
                                        out.joined, clone.suspected, out.name_taken_by):
            await self._carry_out(live.peer, a)
        if conn is not None:
            live.joins = await self.service.peering.connected(conn, first)
            live.pump = tg.create_task(self._pump(conn))
            live.resync = tg.create_task(self._resync(conn))

    async def _announce_join(self, live: Live) -> None:
        if live.joins and live.conn is not None:
            live.joins = False
            await self.service.connections.announce(live.conn, "peer_join")

    async def _carry_out(self, peer: WsPeer, action: Send | Close | Authenticate | Dispatch
                         ) -> None:
        if isinstance(action, Send):
            if action.frame.get("type") == "error":
                self.service.metrics.bad_frames.inc()
            await peer.send_frame(action.frame)
        elif isinstance(action, Close):
            if action.reason in ("hello_required", "nonce_replayed", "bad_signature"):
                self.service.auth.handshake_closed(action.reason)
            await peer.close(action.code, action.reason)

    async def _dispatch(self, tg: asyncio.TaskGroup, inflight: asyncio.Semaphore, conn: Conn,
                        frame: dict[str, Any]) -> None:
        route = self.service.routes[FrameType(frame["type"])]
        if route.sends is None:
            answer = await routes.handle(route, conn, frame)
            if answer is not None:
                await conn.peer.send_frame(answer)
            if frame["type"] == FrameType.FEATURE_REQUEST and conn.presence_snapshot:
                # After the answer (the daemon drops presence until it has it), off the hello
                # clock: who is present now; from here on only the batches it does not cover.
                for text in await self.service.connections.snapshot(conn):
                    await conn.peer.send_text(text)
            return
        # Each frame's accept is started here, one task per frame in arrival order, and
        # reaches the store's queue on its first step: so one connection's sends are accepted
        # in the order they arrived, whether they came alone or in a send_batch.
        # One permit per send, capped so that one batch can always get its permits.
        permits = min(route.sends(frame), self.max_inflight)
        for _ in range(permits):
            await inflight.acquire()
        tg.create_task(self._accept(inflight, permits, conn, route, frame))

    async def _accept(self, inflight: asyncio.Semaphore, permits: int, conn: Conn,
                      route: routes.Route, frame: dict[str, Any]) -> None:
        try:
            # Committed (or not) all the same if the connection is gone: the answer is
            # dropped and the daemon's retry gets 200 duplicate.
            answer = await route.handle(conn, frame)
            if answer is not None:
                await conn.peer.send_frame(answer)
        finally:
            for _ in range(permits):
                inflight.release()
            # Whatever became of the answer, the topics the sends logged wake their readers.
            await self.service.sends.wake_topics(conn)
