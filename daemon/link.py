"""The daemon's WebSocket client of the broker protocol (DESIGN §5.1): one ``BrokerLink``.

``BrokerLink.connect`` does the whole opening: challenge → signed hello (or join) →
hello_ack → feature negotiation. A missing or invalid required feature, or a dedupe
retention under 3 days, closes the socket with 4010 and the structured ``close_reason`` of
spec §15.5 and raises ``FeatureUnavailable`` naming the feature. After that, requests are
pipelined: each gets a fresh ``id`` and a future that the one reader task resolves when the
answer with that ``id`` arrives. Concurrent ``send`` calls are coalesced by one writer task
into a ``send_batch`` frame (answered by one ``send_results``). The link asks for the
optional ``deliver_batch`` feature; each ``deliver`` or ``deliver_batch`` frame goes whole, as
a list of deliveries, to the bounded ``deliveries`` queue (a full queue stops the reader,
which pushes back on the broker); ``peer_join``/``peer_leave``, alone or in the optional
``presence_batch`` frames, go to ``presence`` one by one (oldest dropped when full). No
outbox logic here.

Imports ``core`` and websockets; never ``broker`` or ``cli``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from types import TracebackType
from typing import Any

import structlog
from nacl.signing import SigningKey
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tidemesh.core import features, handshake
from tidemesh.core.features import CloseReason
from tidemesh.core.invite import explain_refusal
from tidemesh.core.wire import CloseCode, InvalidFrame, decode, encode

log = structlog.get_logger(__name__)
PRESENCE_BUFFER = 1024
# A broker with requests of ours waiting that sends no frame at all for this long has stalled
# (its loop or its store is stuck while its socket stays open): the link is cut and the relay
# reconnects. A busy broker still answers something well within it.
STALL_TIMEOUT_S = 30.0
# How long a closing handshake may take before the connection is simply dropped: the close
# frame itself can wait without end behind a broker that stopped reading.
CLOSE_TIMEOUT_S = 2.0


class LinkError(Exception):
    """The link to the broker failed; ``retryable`` says whether reconnecting may help."""

    retryable = True


class HandshakeRejected(LinkError):
    """The broker closed during the handshake (unknown or revoked member, bad signature …)."""

    def __init__(self, code: int | None, reason: str) -> None:
        why = explain_refusal(reason) or (
            "another host presents this member's key (a cloned data dir?); retrying with "
            "backoff; see docs/operations.md, A cloned host" if reason == "clone_suspected"
            else None)
        super().__init__(f"the broker refused this member (close {code}: {reason})"
                         + (f": {why}" if why else ""))
        self.code = code
        self.reason = reason
        # Revocation or an unknown key will not fix itself; a transient close might. A hello
        # that came too late (a stalled network) is a policy close that a retry does fix.
        self.retryable = (code not in (CloseCode.AUTH, CloseCode.POLICY)
                          or reason == "hello_timeout")


class FeatureUnavailable(LinkError):
    """A required broker feature is missing or unusable (spec §15.5); the daemon must exit."""

    retryable = False

    def __init__(self, reason: CloseReason, supported: Any) -> None:
        super().__init__(f"broker feature {reason.feature} is unusable ({reason.kind}): "
                         f"{reason.detail}")
        self.reason = reason
        self.supported = supported


class LinkClosed(LinkError):
    """The connection ended while a request was waiting for its answer."""


class BrokerLink:
    def __init__(self, ws: ClientConnection, hello_ack: dict[str, Any],
                 supported: dict[str, Any], delivery_buffer: int,
                 stall_timeout: float = STALL_TIMEOUT_S) -> None:
        self.ws = ws
        self.stall_timeout = stall_timeout
        self.hello_ack = hello_ack
        self.supported = supported
        # A broker from before trace context refuses a send frame that carries one.
        self._untraced = features.TRACE_CONTEXT not in supported
        self.url = ""                            # the broker's address (set by connect)
        self.broker_version: str | None = None   # as its challenge said
        # Bounded in frames, sized so that about ``delivery_buffer`` deliveries wait at most
        # whether the broker sends them one per frame or in batches.
        per_frame = features.deliver_batch_count(supported) or 1
        self.deliveries: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue(
            max(1, delivery_buffer // per_frame))
        self.presence: asyncio.Queue[dict[str, Any]] = asyncio.Queue(PRESENCE_BUFFER)
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        # Kept: on Python 3.11 get_running_loop() is a getpid() call, and the reader stamps
        # every frame it reads.
        self._loop = asyncio.get_running_loop()
        self._last_frame = self._loop.time()
        self._held_by_us = False
        self._outgoing: list[dict[str, Any]] = []
        self._wake_writer = asyncio.Event()
        # Called with the number of sends in each frame written (a metric, set by the relay).
        self.on_batch: Callable[[int], None] | None = None

    @classmethod
    async def connect(cls, url: str, mesh_id: str, key: SigningKey, *,
                      require: tuple[str, ...] = features.REQUIRED,
                      optional: tuple[str, ...] = features.OPTIONAL,
                      invite_token: str | None = None, display_name: str | None = None,
                      host_fingerprint: str | None = None, open_timeout: float = 10.0,
                      delivery_buffer: int = 1024,
                      stall_timeout: float = STALL_TIMEOUT_S) -> BrokerLink:
        """Connect, authenticate and negotiate; raises a ``LinkError`` subclass on failure,
        a broker that does not finish the handshake within ``open_timeout`` included."""
        try:
            # max_queue: frames websockets buffers before it stops reading the socket; a
            # deliver_batch frame may hold 256 KiB, so keep it small (the reader drains it
            # into ``deliveries``, the bounded queue that pushes back on the broker).
            ws = await ws_connect(url, open_timeout=open_timeout, compression=None,
                                  max_size=8 << 20, max_queue=4, ping_interval=20,
                                  ping_timeout=20)
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
            # InvalidHandshake: something answered that is not the broker yet (a proxy whose
            # upstream is down, a 502); ConnectionClosed: the socket died before the upgrade
            # request went out. Retry like an unreachable broker, never stop the relay.
            raise LinkError(f"cannot reach the broker at {url}: {exc}") from exc
        try:
            async with asyncio.timeout(open_timeout):
                ack, version = await _hello(ws, mesh_id, key, invite_token, display_name,
                                            host_fingerprint)
                supported = await _negotiate(ws, require, optional)
        except ConnectionClosed as exc:
            # Lost while sending hello or the negotiation: a broken path, not a refusal.
            ws.transport.abort()
            raise LinkError(f"the broker link closed during the handshake: {exc}") from exc
        except TimeoutError as exc:
            # A broker that accepted the socket and then went quiet: as unreachable as a
            # closed port, and as retryable.
            ws.transport.abort()
            raise LinkError(f"the broker at {url} did not finish the handshake within "
                            f"{open_timeout:g} s") from exc
        except BaseException:
            ws.transport.abort()
            raise
        link = cls(ws, ack, supported, delivery_buffer, stall_timeout)
        link.url, link.broker_version = url, version
        link._reader = asyncio.create_task(link._read(), name="broker-link-reader")
        link._writer = asyncio.create_task(link._write(), name="broker-link-writer")
        link._watch = asyncio.create_task(link._watch_stall(), name="broker-link-watch")
        log.info("broker_link_connected", url=url, mesh_id=mesh_id, pubkey=ack["pubkey"],
                 session_id=ack["session_id"])
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
        frame = {k: v for k, v in payload.items() if v is not None or k in ("meta", "reply_to")}
        if self._untraced:
            frame.pop("traceparent", None)
        frame.update(client_message_id=client_message_id, id=f"r{next(self._ids)}")
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self.closed:
            raise LinkClosed("the broker link is closed")
        self._pending[frame["id"]] = fut
        self._outgoing.append(frame)
        self._wake_writer.set()
        try:
            return await fut
        finally:
            self._pending.pop(frame["id"], None)

    async def send_many(
        self, items: list[tuple[str, dict[str, Any]]], within: float
    ) -> list[dict[str, Any] | None]:
        """Send many outbox rows at once; returns each ``send_result`` in order, or None for
        a row with no answer within ``within`` seconds or before the link closed."""
        if self.closed:
            raise LinkClosed("the broker link is closed")
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[dict[str, Any]]] = []
        ids: list[str] = []
        for cmid, payload in items:
            frame = {k: v for k, v in payload.items()
                     if v is not None or k in ("meta", "reply_to")}
            if self._untraced:
                frame.pop("traceparent", None)
            frame.update(client_message_id=cmid, id=f"r{next(self._ids)}")
            fut: asyncio.Future[dict[str, Any]] = loop.create_future()
            self._pending[frame["id"]] = fut
            self._outgoing.append(frame)
            futs.append(fut)
            ids.append(frame["id"])
        self._wake_writer.set()
        try:
            await asyncio.wait(futs, timeout=within)
        finally:
            for rid, fut in zip(ids, futs, strict=True):
                self._pending.pop(rid, None)
                if not fut.done():
                    fut.cancel()
        return [f.result() if f.done() and not f.cancelled() and f.exception() is None
                else None for f in futs]

    async def request(self, op: str, name: str) -> dict[str, Any]:
        """topic_create | topic_subscribe | topic_unsubscribe | queue_consume | queue_leave."""
        return await self._call({"type": "request", "op": op, "name": name})

    async def resume(self, epoch: int, last_seq: int) -> dict[str, Any]:
        """Ask for deliveries after (epoch, last_seq); epoch 0 = nothing stored yet."""
        return await self._call({"type": "resume", "epoch": epoch, "last_seq": last_seq})

    async def peers(self) -> list[dict[str, Any]]:
        """The members connected to the broker now: pubkey, connections, connected_at."""
        answer = await self._call({"type": "peers"})
        return list(answer.get("peers", []))

    async def set_profile(self, profile: dict[str, Any]) -> None:
        """Replace this member's profile at the broker (what others see in peers)."""
        answer = await self._call({"type": "profile", "profile": profile})
        if answer.get("type") == "error":
            raise LinkError(f"the broker refused the profile: {answer['error']}")

    async def ack(self, epoch: int, seq: int) -> None:
        """Cumulative ack, sent only after the inbox commit (no answer comes back)."""
        await self._send({"type": "ack", "epoch": epoch, "seq": seq})

    async def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        request_id = f"r{next(self._ids)}"
        frame["id"] = request_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            await self._send(frame)
            return await fut
        finally:
            self._pending.pop(request_id, None)

    async def _write(self) -> None:
        """Coalesce the sends queued since the last write into one frame (fewer frames, fewer
        syscalls at both ends); a lone send goes as a plain ``send`` frame."""
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            batch, self._outgoing = self._outgoing, []
            if not batch:
                continue
            frame = ({"type": "send", **batch[0]} if len(batch) == 1 else
                     {"type": "send_batch", "id": f"b{next(self._ids)}", "sends": batch})
            if self.on_batch is not None:
                self.on_batch(len(batch))
            try:
                await self._send(frame)
            except LinkClosed as exc:
                for item in batch:
                    fut = self._pending.get(item["id"])
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)

    async def _send(self, frame: dict[str, Any]) -> None:
        if self._reader is None or self._reader.done():
            raise LinkClosed("the broker link is closed")
        try:
            await self.ws.send(encode(frame))
        except ConnectionClosed as exc:
            raise LinkClosed(f"the broker link closed: {exc}") from exc

    # -- reader --------------------------------------------------------------------------

    async def _read(self) -> None:
        # What the broker makes us log is bounded per link like a connection's (logfilters).
        structlog.contextvars.bind_contextvars(conn=f"broker-{id(self):x}")
        reason = "closed"
        try:
            async for raw in self.ws:
                self._last_frame = self._loop.time()
                await self._route(raw)
        except ConnectionClosed as exc:
            reason = str(exc)
        finally:
            code = self.ws.close_code
            log.info("broker_link_closed", code=code, reason=self.ws.close_reason)
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(LinkClosed(f"the broker link closed ({code}): {reason}"))
            if self._writer is not None:
                self._writer.cancel()

    async def _route(self, raw: str | bytes) -> None:
        try:
            frame = decode(raw)
        except InvalidFrame as exc:
            log.warning("broker_frame_invalid", error=exc.message)
            return
        if frame["type"] == "deliver":
            await self._deliver([frame])
            return
        if frame["type"] == "deliver_batch":
            await self._deliver(frame["deliveries"])
            return
        if frame["type"] == "send_results":
            for result in frame["results"]:
                self._resolve(result)
            return
        if frame["type"] in ("peer_join", "peer_leave", "clone_suspected"):
            self._presence(frame)
            return
        if frame["type"] == "presence_batch":
            me = self.hello_ack.get("pubkey")
            for event in frame["events"]:   # the mesh's one frame names us too
                if event["pubkey"] != me:
                    self._presence(event)
            return
        if not self._resolve(frame) and frame["type"] == "error":
            log.warning("broker_error_received", error=frame["error"])

    def _presence(self, frame: dict[str, Any]) -> None:
        if self.presence.full():  # presence is best effort; never stall deliveries for it
            self.presence.get_nowait()
        self.presence.put_nowait(frame)

    async def _deliver(self, deliveries: list[dict[str, Any]]) -> None:
        if self.deliveries.full():
            # Our own inbox is behind: the broker's later frames wait for us, not the other
            # way round, so this is no stall of the broker's (``_watch_stall``).
            self._held_by_us = True
            try:
                await self.deliveries.put(deliveries)
            finally:
                self._held_by_us = False
                self._last_frame = self._loop.time()
        else:
            self.deliveries.put_nowait(deliveries)

    def _resolve(self, frame: dict[str, Any]) -> bool:
        fut = self._pending.get(frame.get("id") or "")
        if fut is None or fut.done():
            return False
        fut.set_result(frame)
        return True

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
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close()
        except TimeoutError:
            self.ws.transport.abort()
        # The reader may wait to put a frame into a full deliveries queue that nobody
        # drains any more; cancelling it still fails every pending request (its finally).
        tasks = [t for t in (self._reader, self._writer, self._watch) if t is not None]
        for t in tasks:
            if t is not self._reader:
                t.cancel()
        if self._reader is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(self._reader)
            except TimeoutError:
                self._reader.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_stall(self) -> None:
        """Cut a link whose broker leaves our requests unanswered and says nothing else."""
        interval = max(0.05, self.stall_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = self._loop.time()
            if not self._pending or self._held_by_us:   # idle, or waiting for us: no stall
                self._last_frame = now
                continue
            quiet = now - self._last_frame
            if quiet > self.stall_timeout:
                log.warning("broker_link_stalled", waiting_requests=len(self._pending),
                            quiet_s=round(quiet, 1))
                self.ws.transport.abort()
                return


PRESENCE_FRAMES = frozenset({"peer_join", "peer_leave", "clone_suspected"})


async def _recv(ws: ClientConnection, expect: str,
                skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    frame = await _recv_one(ws, expect)
    while frame["type"] in skip:
        frame = await _recv_one(ws, expect)
    if frame["type"] != expect:
        raise LinkError(f"expected {expect} from the broker, got {frame['type']}")
    return frame


async def _recv_one(ws: ClientConnection, expect: str) -> dict[str, Any]:
    try:
        frame = decode(await ws.recv())
    except ConnectionClosed as exc:
        rcvd = exc.rcvd
        raise HandshakeRejected(rcvd.code if rcvd else None,
                                rcvd.reason if rcvd else "connection lost") from exc
    except InvalidFrame as exc:
        raise LinkError(f"the broker sent a bad {expect} frame: {exc.message}") from exc
    if frame["type"] == "error":
        raise LinkError(f"the broker answered {frame['error']['code']}: "
                        f"{frame['error']['message']}")
    return frame


async def _hello(ws: ClientConnection, mesh_id: str, key: SigningKey, invite_token: str | None,
                 display_name: str | None, host_fingerprint: str | None = None
                 ) -> tuple[dict[str, Any], str | None]:
    """The hello_ack, and the broker's version when its challenge says it."""
    challenge = await _recv(ws, "challenge")
    pubkey, signature = handshake.sign(key, mesh_id, challenge["nonce"])
    frame: dict[str, Any] = {"type": "hello", "mesh_id": mesh_id, "pubkey": pubkey,
                             "nonce": challenge["nonce"], "signature": signature}
    if host_fingerprint is not None and invite_token is None:
        # Lets the broker tell a clone of this data dir (same key, other host) from a
        # reconnect of this daemon (docs/operations.md "A cloned host").
        frame["host_fingerprint"] = handshake.host_mark(pubkey, host_fingerprint)
    if invite_token is not None:
        frame.update(type="join", invite_token=invite_token, display_name=display_name)
    await ws.send(encode(frame))
    return await _recv(ws, "hello_ack"), challenge.get("broker_version")


async def _negotiate(ws: ClientConnection, require: tuple[str, ...],
                     optional: tuple[str, ...]) -> dict[str, Any]:
    await ws.send(encode({"type": "feature_negotiation_request", "id": "features",
                          "require": list(require), "optional": list(optional)}))
    # Once hello_ack is out the broker counts us as connected and may announce other members
    # (many reconnect at once after a broker restart): not the answer, so skip them.
    answer = await _recv(ws, "feature_negotiation_response", skip=PRESENCE_FRAMES)
    supported = answer["supported"]
    reason = features.validate(supported, require)
    if reason is None and answer["missing_required"]:
        reason = CloseReason("feature_unavailable", answer["missing_required"][0],
                             "the broker reports it missing")
    if reason is not None:
        log.warning("feature_negotiation_failed", close_reason=reason.to_dict(),
                    negotiation=answer)
        await ws.close(CloseCode.FEATURE, features.close_reason_text(reason))
        raise FeatureUnavailable(reason, supported)
    return dict(supported)
