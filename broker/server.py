"""The websockets adapter: one handler per connection, plus ``/metrics`` on the same port.

Reads frames, feeds them to the pure ``Session``, and carries out its actions. Send frames
are pipelined: each ``send`` or ``send_batch`` runs in its own task as one store operation
(at most ``max_inflight`` sends per connection; past that the reader stops reading, which
pushes back on the daemon through TCP), and its answer goes out when it has committed,
matched by ``id``. Every task of a connection lives in that connection's
``TaskGroup``. The only module of the broker that imports websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tidemesh.broker.service import BrokerService, Conn, routes
from tidemesh.broker.service.connections import now_ms
from tidemesh.broker.session import Authenticate, Close, Dispatch, Send, Session
from tidemesh.core import handshake, metrics
from tidemesh.core.wire import CloseCode, FrameType, encode

log = structlog.get_logger(__name__)


class WsPeer:
    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws

    async def send_frame(self, frame: dict[str, Any]) -> None:
        await self.ws.send(encode(frame))

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code, reason)


class BrokerServer:
    def __init__(self, service: BrokerService, *, max_inflight: int = 256, max_bad: int = 20,
                 bad_window_s: float = 10.0, max_frame_bytes: int = 4 << 20,
                 hello_timeout_s: float = 10.0) -> None:
        self.service = service
        self.max_inflight = max_inflight
        self.max_bad = max_bad
        self.bad_window_s = bad_window_s
        self.max_frame_bytes = max_frame_bytes
        self.hello_timeout_s = hello_timeout_s
        self.server: Server | None = None
        # The loop watchdog's view (core/watchdog.py), set by the composition root.
        self.loop_state: Callable[[], dict[str, Any]] = lambda: {"state": "ok"}

    async def start(self, host: str, port: int) -> BrokerServer:
        self.server = await serve(self.handler, host, port, process_request=self.http,
                                  max_size=self.max_frame_bytes, compression=None,
                                  ping_interval=20, ping_timeout=20)
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
        if self.server is None:
            return
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
        peer = WsPeer(ws)
        session = Session(handshake.new_nonce(), self.max_bad, self.bad_window_s)
        conn: Conn | None = None
        try:
            await peer.send_frame(session.challenge().frame)
            async with asyncio.timeout(self.hello_timeout_s) as deadline, \
                    asyncio.TaskGroup() as tg:
                inflight = asyncio.Semaphore(self.max_inflight)
                pump: asyncio.Task[None] | None = None
                loop = asyncio.get_running_loop()   # once: each call is a getpid() on 3.11
                try:
                    async for raw in ws:
                        if conn is not None and conn.hold_until_ms > (now := now_ms()):
                            await asyncio.sleep((conn.hold_until_ms - now) / 1000)
                        for action in session.on_text(raw, loop.time()):
                            if isinstance(action, Authenticate):
                                conn = await self._authenticate(peer, session, action)
                                if conn is not None:
                                    deadline.reschedule(None)
                                    pump = tg.create_task(self._pump(conn))
                            elif isinstance(action, Dispatch):
                                assert conn is not None
                                await self._dispatch(tg, inflight, conn, action.frame)
                            else:
                                await self._carry_out(peer, action)
                finally:
                    if pump is not None:
                        pump.cancel()
        except ConnectionClosed:
            pass
        except TimeoutError:  # no good hello in time: a socket squatter, not a member
            self.service.auth.handshake_closed("hello_timeout")
            await ws.close(CloseCode.POLICY, "hello_timeout")
        except Exception as exc:  # one broken connection must not take the server down
            await self._failed(ws, exc)
        finally:
            if conn is not None:
                await self._left(conn)

    async def _left(self, conn: Conn) -> None:
        last = self.service.connections.unregister(conn)
        try:
            gone = await self.service.peering.disconnected(conn, last)
        except self.service.store.outage_errors as exc:
            # The next heartbeat releases it (and announces the leave) once the store is back.
            log.warning("broker_session_release_failed", error=repr(exc))
            self.service.peering.release_later(conn)
            return
        if gone:
            await self.service.connections.announce(conn, "peer_leave")

    async def _failed(self, ws: ServerConnection, exc: Exception) -> None:
        rest = exc.split(ConnectionClosed)[1] if isinstance(exc, ExceptionGroup) else exc
        if rest is None:
            return  # the TaskGroup wrapped a dropped connection (kill -9, a cut): normal
        outage = self.service.store.outage_errors
        if (rest.split(outage)[1] is None if isinstance(rest, ExceptionGroup)
                else isinstance(rest, outage)):
            # The database is down or restarting: the member should come back, not worry.
            log.warning("broker_connection_closed_store_unavailable", error=repr(rest))
            await ws.close(CloseCode.TRY_AGAIN_LATER, "store_unavailable")
            return
        log.error("broker_connection_failed", error=repr(exc), exc_info=True)
        await ws.close(CloseCode.INTERNAL, "internal_error")

    async def _pump(self, conn: Conn) -> None:
        # Undelivered rows stay in delivery_queue; the next resume sends them.
        with contextlib.suppress(ConnectionClosed):
            await self.service.deliveries.pump(conn)

    async def _authenticate(self, peer: WsPeer, session: Session,
                            action: Authenticate) -> Conn | None:
        out = await self.service.auth.authenticate(action.frame)
        conn, first = None, False
        if out.problem is None:
            conn, first = self.service.connections.register(peer, out.mesh_id, out.pubkey,
                                                            out.display_name)
        for a in session.on_member(out.mesh_id, out.mesh_name, out.pubkey,
                                   conn.session_id if conn else "", out.problem, out.joined):
            await self._carry_out(peer, a)
        if conn is not None and await self.service.peering.connected(conn, first):
            await self.service.connections.announce(conn, "peer_join")
        return conn

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
            answer = await route.handle(conn, frame)
            if answer is not None:
                await conn.peer.send_frame(answer)
        except ConnectionClosed:
            # Committed (or not) all the same; the daemon's retry gets 200 duplicate.
            log.info("broker_result_undelivered", id=frame["id"],
                     sends=len(frame.get("sends", [frame])))
        finally:
            for _ in range(permits):
                inflight.release()
