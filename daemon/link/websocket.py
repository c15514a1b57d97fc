"""The daemon's WebSocket client of the broker protocol (DESIGN §5.1): one ``BrokerLink``.

It only moves bytes: what each frame means, the handshake, which answer belongs to which
request, the handshake's deadline and the stall of a silent broker are decided by
``linkstate.LinkState``; this carries out what it returns. ``BrokerLink.connect`` opens the
socket and runs the handshake (a refusal, a missing required feature or a broker that does
not finish in time raises a ``LinkError`` subclass); then one reader task feeds every frame
to the machine, and callers' requests go straight to the socket, each waiting on a future
the machine hands back with its answer. A claimed outbox batch is one frame and one future
(``send_many``). Deliveries go whole, frame by frame, to the bounded ``deliveries`` queue (a
full queue stops the reader, which pushes back on the broker); presence events, alone or
from the optional ``presence_batch`` frames, go to ``presence`` one by one (oldest dropped
when full). No outbox logic here.

Imports ``core``, the machine and websockets; never ``broker`` or ``cli``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any

import structlog
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.protocol import State

from tidemesh.core import features
from tidemesh.core.wire import encode
from tidemesh.daemon.link.linkstate import (
    STALL_TIMEOUT_S,
    Answered,
    Close,
    Delivered,
    Ended,
    Failed,
    FeatureUnavailable,
    HandshakeRejected,
    LinkClosed,
    LinkError,
    LinkState,
    Output,
    Phase,
    Presence,
    Ready,
    Send,
    Settled,
    Stalled,
    Unreadable,
    Unsolicited,
    refusal,
)

__all__ = ["STALL_TIMEOUT_S", "BrokerLink", "FeatureUnavailable", "HandshakeRejected",
           "LinkClosed", "LinkError"]

log = structlog.get_logger(__name__)
PRESENCE_BUFFER = 1024
# How long a closing handshake may take before the connection is simply dropped: the close
# frame itself can wait without end behind a broker that stopped reading.
CLOSE_TIMEOUT_S = 2.0
# The link's keepalive: a ping this often, the link dropped when its pong does not come
# within as long again. The broker sends no pings of its own and closes a connection silent
# for server.idle_timeout_s (60 s by default): these pings are what keep an idle link open.
KEEPALIVE_S = 20.0

Waiter = asyncio.Future[Any]


class BrokerLink:
    def __init__(self, ws: ClientConnection, state: LinkState[Waiter], ready: Ready,
                 delivery_buffer: int) -> None:
        self.ws = ws
        self.state = state
        self.hello_ack = ready.hello_ack
        self.supported = ready.supported
        # The features asked for that this session uses (``/v1/version``).
        self.negotiated = features.negotiated(ready.supported,
                                              (*state.require, *state.optional))["taken"]
        self.url = state.url                           # the broker's address
        self.broker_version = ready.broker_version     # as its challenge said
        # Bounded in frames, sized so that about ``delivery_buffer`` deliveries wait at most
        # whether the broker sends them one per frame or in batches.
        per_frame = features.deliver_batch_count(self.supported) or 1
        self.deliveries: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue(
            max(1, delivery_buffer // per_frame))
        self.presence: asyncio.Queue[dict[str, Any]] = asyncio.Queue(PRESENCE_BUFFER)
        # Kept: on Python 3.11 get_running_loop() is a getpid() call, and the reader stamps
        # every frame it reads.
        self._loop = asyncio.get_running_loop()
        self._reader: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        # The future of a resume on the wire: until its answer, deliveries are the broker's
        # pushes from before it read the resume, which it sends again after answering.
        self._resuming: Waiter | None = None
        # Called with the number of sends in each frame written (a metric, set by the relay).
        self.on_batch: Callable[[int], None] | None = None

    @classmethod
    async def connect(cls, url: str, mesh_id: str, key: SigningKey, *,
                      require: tuple[str, ...] = features.REQUIRED,
                      optional: tuple[str, ...] = features.OPTIONAL,
                      invite_token: str | None = None, display_name: str | None = None,
                      host_fingerprint: str | None = None, open_timeout: float = 10.0,
                      delivery_buffer: int = 1024,
                      stall_timeout: float = STALL_TIMEOUT_S,
                      keepalive_s: float = KEEPALIVE_S) -> BrokerLink:
        """Connect, authenticate and negotiate; raises a ``LinkError`` subclass on failure,
        a broker that does not finish the handshake within ``open_timeout`` included."""
        try:
            # max_queue: frames websockets buffers before it stops reading the socket; a
            # deliver_batch frame may hold 256 KiB, so keep it small (the reader drains it
            # into ``deliveries``, the bounded queue that pushes back on the broker).
            ws = await ws_connect(url, open_timeout=open_timeout, compression=None,
                                  max_size=8 << 20, max_queue=4, ping_interval=keepalive_s,
                                  ping_timeout=keepalive_s)
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
            # InvalidHandshake: something answered that is not the broker yet (a proxy whose
            # upstream is down, a 502); ConnectionClosed: the socket died before the upgrade
            # request went out. Retry like an unreachable broker, never stop the relay.
            raise LinkError(f"cannot reach the broker at {url}: {exc}") from exc
        loop = asyncio.get_running_loop()
        state: LinkState[Waiter] = LinkState(
            mesh_id, key, loop.time(), handshake_timeout=open_timeout,
            stall_timeout=stall_timeout, require=require, optional=optional,
            invite_token=invite_token, display_name=display_name,
            host_fingerprint=host_fingerprint, url=url)
        try:
            ready = await _open(ws, state)
        except BaseException:
            ws.transport.abort()
            raise
        link = cls(ws, state, ready, delivery_buffer)
        link._reader = asyncio.create_task(link._read(), name="broker-link-reader")
        link._watch = asyncio.create_task(link._watch_stall(), name="broker-link-watch")
        log.info("broker_link_connected", url=url, mesh_id=mesh_id,
                 pubkey=ready.hello_ack["pubkey"], session_id=ready.hello_ack["session_id"])
        return link

    async def __aenter__(self) -> BrokerLink:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- requests ------------------------------------------------------------------------

    async def send(self, client_message_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one outbox row (``SendRequest.to_payload()``); returns its ``send_result``.

        Bound it with ``asyncio.timeout`` in the caller: cancelling forgets the request (a late
        answer is dropped); the send may still commit, and a retry gets 200 duplicate.
        """
        [answer] = (await self._settle([(client_message_id, payload)])).results
        if answer is None:
            raise LinkError("the broker's answer held no result for the send")
        return answer

    async def send_many(self, items: list[tuple[str, dict[str, Any] | bytes]],
                        within: float) -> list[dict[str, Any] | None]:
        """Send a claimed batch of outbox rows as one frame; returns each ``send_result`` in
        order, or None for every row when no answer came within ``within`` seconds or before
        the link closed. Raises ``LinkError`` when the broker refused the frame as a whole.
        A row is its payload as the outbox stored it (bytes, put in the frame as they are)
        or that parsed."""
        try:
            async with asyncio.timeout(within):
                settled = await self._settle(items)
        except (TimeoutError, LinkClosed):
            return [None] * len(items)
        if settled.refused is not None:
            raise LinkError(settled.refused)
        return settled.results

    async def _settle(self, items: list[tuple[str, dict[str, Any] | bytes]]
                      ) -> Settled[Waiter]:
        fut: Waiter = self._loop.create_future()
        out = self.state.send_batch(items, self._loop.time(), fut)
        if self.on_batch is not None:
            self.on_batch(len(items))
        return await self._await(out, fut)  # type: ignore[no-any-return]

    async def request(self, op: str, name: str) -> dict[str, Any]:
        """topic_create | topic_subscribe | topic_unsubscribe | queue_consume | queue_leave."""
        return await self._call({"type": "request", "op": op, "name": name})

    async def resume(self, epoch: int, last_seq: int) -> dict[str, Any]:
        """Ask for deliveries after (epoch, last_seq); epoch 0 = nothing stored yet. When it
        returns, ``deliveries`` holds only what the broker sent after its answer: what it
        pushed before reading the resume is dropped, since it sends everything after
        ``last_seq`` again. Dropping is done by the reader, in frame order, so nothing sent
        after the answer is lost, and a reader blocked on a full queue is let go at once
        (it must read on to reach the answer)."""
        fut: Waiter = self._loop.create_future()
        out = self.state.call({"type": "resume", "epoch": epoch, "last_seq": last_seq},
                              self._loop.time(), fut)
        self._resuming = fut
        self._drop_queued()
        try:
            return await self._await(out, fut)  # type: ignore[no-any-return]
        finally:
            if self._resuming is fut:
                self._resuming = None

    async def peers(self) -> list[dict[str, Any]]:
        """The members connected to the broker now: pubkey, connections, connected_at.
        Kept here from the broker's snapshot and changes when it sends them (nothing to
        ask); else, or before the snapshot came, asked of the broker."""
        known = self.known_peers()
        if known is not None:
            return known
        answer = await self._call({"type": "peers"})
        return list(answer.get("peers", []))

    def known_peers(self) -> list[dict[str, Any]] | None:
        """The present members as this link keeps them; None when it keeps none (a broker
        without ``presence_snapshot``, or its snapshot not come yet)."""
        peerset = self.state.peerset
        return peerset.peers() if peerset is not None and peerset.synced else None

    async def rotate_key(self, signed: dict[str, str]) -> dict[str, Any]:
        """``key_rotate`` (``handshake.sign_rotation``'s fields); the ``key_rotated`` answer
        or an ``error`` frame."""
        return await self._call({"type": "key_rotate", **signed})

    async def set_profile(self, profile: dict[str, Any]) -> None:
        """Replace this member's profile at the broker (what others see in peers)."""
        refused = refusal(await self._call({"type": "profile", "profile": profile}))
        if refused is not None:
            raise LinkError(f"the broker refused the profile: {refused}")
        if self.state.peerset is not None:
            self.state.peerset.own_profile = dict(profile)

    async def ack(self, epoch: int, seq: int) -> None:
        """Cumulative ack, sent only after the inbox commit (no answer comes back)."""
        await self._send(self.state.ack(epoch, seq).frame)

    async def file_submit(self, frame: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send a shared file's frame (core/files.py) and return the future of its answer
        without waiting for it: the caller keeps a window of them in flight, and the broker
        answers them in order."""
        fut: Waiter = self._loop.create_future()
        out = self.state.call(frame, self._loop.time(), fut)
        fut.add_done_callback(lambda _: self.state.forget(out.frame["id"]))
        try:
            await self._send(out.frame)
        except BaseException:
            fut.cancel()
            raise
        return fut

    async def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        fut: Waiter = self._loop.create_future()
        return await self._await(  # type: ignore[no-any-return]
            self.state.call(frame, self._loop.time(), fut), fut)

    async def _await(self, out: Send, fut: Waiter) -> Any:
        """Write a request's frame and wait for what the reader hands its future; a caller
        that stops waiting (a timeout, a cancel) has the request forgotten."""
        try:
            await self._send(out.frame if out.wire is None else out.wire)
            return await fut
        finally:
            self.state.forget(out.frame["id"])
            _read_out(fut)

    async def _send(self, frame: dict[str, Any] | bytes) -> None:
        if self.closed:
            raise LinkClosed("the broker link is closed")
        try:
            # Text frames, as every frame of the protocol (bytes would go as a binary one).
            await self.ws.send(encode(frame) if isinstance(frame, dict) else frame.decode())
        except ConnectionClosed as exc:
            raise LinkClosed(f"the broker link closed: {exc}") from exc

    # -- reader --------------------------------------------------------------------------

    async def _read(self) -> None:
        # What the broker makes us log is bounded per link like a connection's (logfilters).
        structlog.contextvars.bind_contextvars(conn=f"broker-{id(self):x}")
        reason = "closed"
        try:
            async for raw in self.ws:
                for out in self.state.on_frame(raw, self._loop.time()):
                    await self._carry(out)
        except ConnectionClosed as exc:
            reason = str(exc)
        finally:
            code = self.ws.close_code
            log.info("broker_link_closed", code=code, reason=self.ws.close_reason)
            for out in self.state.on_closed(code, reason):
                if isinstance(out, Ended):
                    for fut in out.waiters:
                        if not fut.done():
                            fut.set_exception(out.error)

    async def _carry(self, out: Output[Waiter]) -> None:
        if isinstance(out, Delivered):
            await self._deliver(out.deliveries)
        elif isinstance(out, Answered):   # a call's future holds the answer frame
            if out.waiter is self._resuming:  # what came before it is sent again
                self._resuming = None
                self._drop_queued()
            if not out.waiter.done():
                out.waiter.set_result(out.frame)
        elif isinstance(out, Settled):    # a batch's, the whole settlement
            if not out.waiter.done():
                out.waiter.set_result(out)
        elif isinstance(out, Presence):
            if self.presence.full():  # presence is best effort; never stall deliveries for it
                self.presence.get_nowait()
            self.presence.put_nowait(out.frame)
        elif isinstance(out, Unsolicited):
            log.warning("broker_error_received", error=out.frame["error"])
        elif isinstance(out, Unreadable):
            log.warning("broker_frame_invalid", error=out.message)
        elif isinstance(out, Send):
            await self._send(out.frame)

    def _presence(self, frame: dict[str, Any]) -> None:
        if self.presence.full():  # presence is best effort; never stall deliveries for it
            self.presence.get_nowait()
        self.presence.put_nowait(frame)

    def _drop_queued(self) -> None:
        while not self.deliveries.empty():
            self.deliveries.get_nowait()

    async def _deliver(self, deliveries: list[dict[str, Any]]) -> None:
        if self._resuming is not None:   # sent again after the resume's answer
            return
        if self.deliveries.full():
            # Our own inbox is behind: the broker's later frames wait for us, not the other
            # way round, so this is no stall of the broker's.
            self.state.hold()
            try:
                await self.deliveries.put(deliveries)
            finally:
                self.state.release(self._loop.time())
        else:
            self.deliveries.put_nowait(deliveries)

    @property
    def closed(self) -> bool:
        return self._reader is None or self._reader.done()

    async def wait_closed(self) -> None:
        if self._reader is not None:
            await asyncio.shield(self._reader)

    async def close(self) -> None:
        """Close, bounded: a closing handshake that does not end within ``CLOSE_TIMEOUT_S``
        (a broker that stopped reading leaves the close frame waiting to be written) drops
        the connection instead; the link's tasks are then ended, not waited on."""
        # A connection already closed has nothing to close; asking anyway makes websockets
        # abort its transport, which Python 3.11's own loop fails with AttributeError when
        # the transport ended by writing out its buffer (a frame cut off mid-write).
        if self.ws.state is not State.CLOSED:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self.ws.close()
            except TimeoutError:
                self.ws.transport.abort()
        if self._watch is not None:
            self._watch.cancel()
        # The reader may wait to put a frame into a full deliveries queue that nobody
        # drains any more; cancelling it still fails every pending request (its finally).
        if self._reader is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(self._reader)
            except TimeoutError:
                self._reader.cancel()
        await asyncio.gather(*(t for t in (self._reader, self._watch) if t is not None),
                             return_exceptions=True)

    async def _watch_stall(self) -> None:
        """Tick the machine; cut a link whose broker leaves a request of ours unanswered too
        long (``LinkState.tick`` decides)."""
        interval = max(0.05, self.state.stall_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            for out in self.state.tick(self._loop.time()):
                if isinstance(out, Stalled):
                    log.warning("broker_link_stalled", waiting_requests=out.waiting,
                                waited_s=round(out.waited_s, 1))
                    self.ws.transport.abort()
                    return


async def _open(ws: ClientConnection, state: LinkState[Waiter]) -> Ready:
    """Run the handshake to ``Ready``; the machine's ``Failed`` is raised. Bounded by the
    machine's deadline: when it passes, ``tick`` says what that means."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with asyncio.timeout_at(state.deadline):
                return await _handshake(ws, state)
        except TimeoutError:
            for out in state.tick(loop.time()):
                if isinstance(out, Failed):
                    raise out.error from None


def _log_negotiated(ready: Ready, state: LinkState[Waiter]) -> None:
    """One INFO line of what this session settled; an optional feature whose params this
    daemon cannot use is a warning of its own (it goes on without it)."""
    settled = features.negotiated(ready.supported, (*state.require, *state.optional))
    for name in settled["param_invalid"]:
        if name in state.optional:
            log.warning("feature_optional_param_invalid", feature=name,
                        advertised=ready.supported.get(name))
    log.info("features_negotiated", broker=state.url, broker_version=ready.broker_version,
             **settled)


async def _handshake(ws: ClientConnection, state: LinkState[Waiter]) -> Ready:
    loop = asyncio.get_running_loop()
    while True:
        try:
            raw = await ws.recv()
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            outs = state.on_closed(rcvd.code if rcvd else None,
                                   rcvd.reason if rcvd else "connection lost")
        else:
            outs = state.on_frame(raw, loop.time())
        for out in outs:
            if isinstance(out, Ready):
                _log_negotiated(out, state)
                return out
            if isinstance(out, Failed):
                if isinstance(out.error, FeatureUnavailable):
                    log.warning("feature_negotiation_failed",
                                close_reason=out.error.reason.to_dict(),
                                negotiation=out.error.negotiation)
                raise out.error
            try:
                if isinstance(out, Send):
                    await ws.send(encode(out.frame))
                elif isinstance(out, Close):
                    await ws.close(out.code, out.reason)
            except ConnectionClosed as exc:
                # Lost while sending hello or the negotiation: a broken path, not a refusal.
                raise LinkError(f"the broker link closed during the handshake: {exc}") from exc
        if state.phase is Phase.CLOSED:   # every end says why (``Failed``); never read on
            raise LinkError("the broker link closed during the handshake")


def _read_out(fut: Waiter) -> None:
    """Mark the error a request's future holds as read. When the link ends while the
    request's frame is still being written, the reader fails the future and the writer
    raises its own error to the caller, so nobody reads the future's: asyncio would log
    "Future exception was never retrieved" for each such request."""
    if fut.done() and not fut.cancelled():
        fut.exception()
