"""The daemon's side of the broker protocol as a state machine, sans I/O (no sockets, no
clock, no logging): ``LinkState`` takes the broker's frames, the link's end and ticks of a
given ``now``, and returns what to do (``Send`` a frame, ``Close`` the socket) and what
happened (the events below). ``websocket.py`` moves the bytes and carries these out; the broker's
side of the same protocol is ``broker/session.py``.

    AWAIT_CHALLENGE --challenge--> hello (or join)         AWAIT_HELLO_ACK
    AWAIT_HELLO_ACK --hello_ack--> feature request          AWAIT_FEATURES
    AWAIT_FEATURES  --response, required features usable--> READY (``Ready``)
                    --a required feature unusable--> close 4010 (``Failed``)
    READY: requests matched to answers by id; deliveries and presence routed (``ROUTES``);
           with ``presence_snapshot`` negotiated, the present set kept in ``peerset``

Every request waits as one pending entry, whatever it holds: a claimed batch of sends is one
``send_batch`` frame (a ``send`` frame for one row) and its answers come back together, as
one ``Settled``. Each entry carries an opaque ``waiter`` for the caller (``websocket.py`` keeps its
future there); the machine never touches it. The handshake's deadline and the stall of a
broker that leaves requests unanswered are decided by ``tick(now)``.

Imports ``core``; never websockets, the daemon's stores or services.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

import orjson
from nacl.signing import SigningKey

from tidemesh.core import features, handshake
from tidemesh.core.features import CloseReason
from tidemesh.core.invite import explain_refusal
from tidemesh.core.wire import CloseCode, FrameType, InvalidFrame, decode
from tidemesh.daemon.link.peerset import PeerSet

Frame = dict[str, Any]
Position = tuple[int, int]   # (epoch, seq)
W = TypeVar("W")
# A request of ours the broker leaves unanswered this long means it has stalled (its loop, or
# what answers our requests, is stuck while its socket stays open), whatever else it still
# sends: its presence feed runs on its own task and may keep talking while nothing answers.
# The link is cut and the relay reconnects (to the next broker, if the mesh has one). A busy
# broker answers each request well within it.
STALL_TIMEOUT_S = 30.0


class LinkError(Exception):
    """The link to the broker failed; ``retryable`` says whether reconnecting may help."""

    retryable = True


class HandshakeRejected(LinkError):
    """The broker closed during the handshake (unknown or revoked member, bad signature …)."""

    def __init__(self, code: int | None, reason: str) -> None:
        why = explain_refusal(reason) or _WHY.get(reason)
        super().__init__(f"the broker refused this member (close {code}: {reason})"
                         + (f": {why}" if why else ""))
        self.code = code
        self.reason = reason
        # Revocation or an unknown key will not fix itself; a transient close might. A hello
        # that came too late (a stalled network) is a policy close that a retry does fix.
        self.retryable = (code not in (CloseCode.AUTH, CloseCode.POLICY,
                                       CloseCode.ROTATED_OUT) or reason == "hello_timeout")


_WHY = {
    "clone_suspected": "another host presents this member's key (a cloned data dir?); "
                       "retrying with backoff; see docs/operations.md, A cloned host",
    "key_rotated_out": "this key was rotated out (daemon rotate-keypair); a rotation left "
                       "unfinished here is finished by `tidemesh daemon rotate-keypair` or "
                       "the next `daemon up`",
}


class FeatureUnavailable(LinkError):
    """A required broker feature is missing or unusable (spec §15.5); the daemon must exit."""

    retryable = False

    def __init__(self, reason: CloseReason, supported: Any,
                 negotiation: Frame | None = None) -> None:
        super().__init__(f"broker feature {reason.feature} is unusable ({reason.kind}): "
                         f"{reason.detail}")
        self.reason = reason
        self.supported = supported
        self.negotiation = negotiation   # the broker's whole answer, for the log


class LinkClosed(LinkError):
    """The connection ended while a request was waiting for its answer."""


class Phase(StrEnum):
    AWAIT_CHALLENGE = "await_challenge"
    AWAIT_HELLO_ACK = "await_hello_ack"
    AWAIT_FEATURES = "await_features"
    READY = "ready"
    CLOSED = "closed"


# -- what to do --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Send:
    frame: Frame
    # The frame as written, when a stored payload went into it as its bytes (``frame`` then
    # holds its type and ids only); None: ``frame`` is encoded as it is.
    wire: bytes | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket with this code (the closing handshake, bounded by the shell)."""

    code: int
    reason: str


# -- what happened -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is done: the link may carry requests."""

    hello_ack: Frame
    supported: dict[str, Any]
    broker_version: str | None


@dataclass(frozen=True, slots=True)
class Failed:
    """The handshake failed: raise ``error`` (after carrying out any ``Close`` before it)."""

    error: LinkError


@dataclass(frozen=True, slots=True)
class Answered(Generic[W]):
    """A request's answer frame (an ``error`` frame included: the caller reads it)."""

    waiter: W
    frame: Frame


@dataclass(frozen=True, slots=True)
class Settled(Generic[W]):
    """A batch of sends answered at once: one result per send, in order, None for a send the
    broker did not answer; ``refused`` when the broker refused the whole frame instead."""

    waiter: W
    results: list[Frame | None]
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    """One ``deliver`` or ``deliver_batch`` frame's deliveries, whole and in order: the unit
    the receiver places against its cursor (``receive_order.py``) and stores."""

    deliveries: list[Frame]


@dataclass(frozen=True, slots=True)
class Presence:
    frame: Frame


@dataclass(frozen=True, slots=True)
class Unsolicited:
    """An ``error`` frame that answers nothing waiting (late, or for a forgotten request)."""

    frame: Frame


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A frame that did not decode; the link lives on."""

    message: str


@dataclass(frozen=True, slots=True)
class Stalled:
    """A request waited longer than the stall timeout for its answer: drop the connection
    (the relay reconnects). ``waited_s``: how long the oldest request waited."""

    waiting: int
    waited_s: float


@dataclass(frozen=True, slots=True)
class Ended(Generic[W]):
    """The connection ended: fail every waiter with ``error``."""

    waiters: list[W]
    error: LinkClosed


Output = (Send | Close | Ready | Failed | Answered[W] | Settled[W] | Delivered | Presence
          | Unsolicited | Unreadable | Stalled | Ended[W])


@dataclass(slots=True)
class Pending(Generic[W]):
    waiter: W
    items: list[str] | None = None   # a batch's send ids, in order; None for a single request
    since: float = 0.0               # when it went out


# -- the machine ---------------------------------------------------------------------------

@dataclass(slots=True)
class LinkState(Generic[W]):
    mesh_id: str
    key: SigningKey
    now: float                                   # when the socket opened
    handshake_timeout: float = 10.0
    stall_timeout: float = STALL_TIMEOUT_S
    require: tuple[str, ...] = features.REQUIRED
    optional: tuple[str, ...] = features.OPTIONAL
    invite_token: str | None = None
    display_name: str | None = None
    host_fingerprint: str | None = None
    url: str = "the broker"                      # for messages only
    phase: Phase = Phase.AWAIT_CHALLENGE
    hello_ack: Frame = field(default_factory=dict)
    supported: dict[str, Any] = field(default_factory=dict)
    broker_version: str | None = None
    pending: dict[str, Pending[W]] = field(default_factory=dict)
    held: bool = False                           # our own deliveries queue is full
    # When our full deliveries queue last stopped holding the broker's frames back: answers
    # wait behind those, so no request's wait counts from before it.
    released_at: float = 0.0
    deadline: float = 0.0                        # the handshake's
    # Who is present, from the broker's snapshot and batches (``presence_snapshot``
    # negotiated); None with a broker that sends none.
    peerset: PeerSet | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.deadline = self.now + self.handshake_timeout

    # -- frames in -----------------------------------------------------------------------

    def on_frame(self, raw: str | bytes, now: float) -> list[Output[W]]:
        if self.phase is Phase.CLOSED:
            return []
        handshaking = self.phase is not Phase.READY
        try:
            frame = decode(raw)
        except InvalidFrame as exc:
            if handshaking:
                return self._fail(LinkError(f"the broker sent a bad {self._expected} frame: "
                                            f"{exc.message}"))
            return [Unreadable(exc.message)]
        if handshaking:
            return self._handshake(frame)
        route = ROUTES.get(frame["type"])
        return route(self, frame) if route is not None else self._answer(frame)

    def on_closed(self, code: int | None, reason: str) -> list[Output[W]]:
        """The connection ended (``code`` None: no close frame came)."""
        was, self.phase = self.phase, Phase.CLOSED
        if was not in (Phase.READY, Phase.CLOSED):
            return [Failed(HandshakeRejected(code, reason))]
        # After a stall too: what still waits learns that no answer will come.
        waiters = [p.waiter for p in self.pending.values()]
        self.pending.clear()
        if was is Phase.CLOSED and not waiters:
            return []
        return [Ended(waiters, LinkClosed(f"the broker link closed ({code}): {reason}"))]

    def tick(self, now: float) -> list[Output[W]]:
        """Time passed: a handshake past its deadline fails; a broker that leaves a request
        of ours unanswered for ``stall_timeout`` has stalled, even if it says other things."""
        if self.phase is Phase.CLOSED:
            return []
        if self.phase is not Phase.READY:
            if now < self.deadline:
                return []
            return self._fail(LinkError(f"the broker at {self.url} did not finish the "
                                        f"handshake within {self.handshake_timeout:g} s"))
        if not self.pending or self.held:   # idle, or the broker waits for us: no stall
            return []
        oldest = min(p.since for p in self.pending.values())
        waited = now - max(oldest, self.released_at)
        if waited <= self.stall_timeout:
            return []
        self.phase = Phase.CLOSED
        return [Stalled(len(self.pending), waited)]

    def hold(self) -> None:
        """Our deliveries queue is full: the broker's next frames wait for us (no stall)."""
        self.held = True

    def release(self, now: float) -> None:
        self.held = False
        self.released_at = now

    # -- requests out --------------------------------------------------------------------

    def call(self, frame: Frame, now: float, waiter: W) -> Send:
        """A request that one frame answers (``resume``, ``peers``, ``profile``, ``request``
        …): the frame with its new id, to send; its answer comes as ``Answered``."""
        request_id = f"r{next(self._ids)}"
        self._wait(request_id, Pending(waiter), now)
        return Send({**frame, "id": request_id})

    def send_batch(self, items: list[tuple[str, Frame | bytes]], now: float,
                   waiter: W) -> Send:
        """Outbox rows (client_message_id, ``SendRequest.to_payload()``: the bytes the outbox
        stored, or that parsed) as one frame: a ``send`` for one, else a ``send_batch``; their
        answers come as one ``Settled``. Stored bytes go into the frame as they are
        (``_spliced``), not parsed and encoded again."""
        ids = [f"r{next(self._ids)}" for _ in items]
        sends = [self._send_item(cmid, payload, rid)
                 for (cmid, payload), rid in zip(items, ids, strict=True)]
        if len(sends) == 1:
            self._wait(ids[0], Pending(waiter, ids), now)
            [send] = sends
            if isinstance(send, bytes):
                return Send({"type": FrameType.SEND.value, "id": ids[0],
                             "client_message_id": items[0][0]},
                            b'{"type":"send",' + send[1:])
            return Send({"type": FrameType.SEND.value, **send})
        batch_id = f"b{next(self._ids)}"
        self._wait(batch_id, Pending(waiter, ids), now)
        return Send({"type": FrameType.SEND_BATCH.value, "id": batch_id,
                     "sends": [orjson.Fragment(s) if isinstance(s, bytes) else s
                               for s in sends]})

    def ack(self, epoch: int, seq: int) -> Send:
        """Cumulative ack, sent only after the inbox commit (nothing answers it)."""
        return Send({"type": FrameType.ACK.value, "epoch": epoch, "seq": seq})

    def forget(self, request_id: str) -> None:
        """The caller stopped waiting (a timeout, a cancel): a late answer is dropped."""
        self.pending.pop(request_id, None)

    def _wait(self, request_id: str, pending: Pending[W], now: float) -> None:
        if self.phase is not Phase.READY:
            raise LinkClosed("the broker link is closed")
        pending.since = now
        self.pending[request_id] = pending

    def _send_item(self, cmid: str, payload: Frame | bytes, rid: str) -> Frame | bytes:
        if isinstance(payload, bytes) and features.TRACE_CONTEXT in self.supported:
            spliced = _spliced(payload, cmid, rid)
            if spliced is not None:
                return spliced
        fields: Frame = orjson.loads(payload) if isinstance(payload, bytes) else payload
        item = {k: v for k, v in fields.items() if v is not None or k in ("meta", "reply_to")}
        if features.TRACE_CONTEXT not in self.supported:
            # A broker from before trace context refuses a send frame that carries one.
            item.pop("traceparent", None)
        item.update(client_message_id=cmid, id=rid)
        return item

    # -- READY frames ----------------------------------------------------------------------

    def _answer(self, frame: Frame) -> list[Output[W]]:
        pending = self.pending.pop(frame.get("id") or "", None)
        if pending is None:
            return [Unsolicited(frame)] if frame["type"] == FrameType.ERROR else []
        if pending.items is None:
            return [Answered(pending.waiter, frame)]
        if frame["type"] == FrameType.SEND_RESULTS:
            by_id = {r.get("id"): r for r in frame["results"]}
            return [Settled(pending.waiter, [by_id.get(i) for i in pending.items])]
        if len(pending.items) == 1:    # a lone send's answer is its result, whatever it says
            return [Settled(pending.waiter, [frame])]
        error = frame.get("error") or {}
        return [Settled(pending.waiter, [None] * len(pending.items),
                        f"the broker refused the batch: {error.get('code', frame['type'])}: "
                        f"{error.get('message', '')}")]

    def _deliver(self, frame: Frame) -> list[Output[W]]:
        return [Delivered([frame])]

    def _deliver_batch(self, frame: Frame) -> list[Output[W]]:
        return [Delivered(frame["deliveries"])]

    def _presence(self, frame: Frame) -> list[Output[W]]:
        if self.peerset is not None and frame["type"] == FrameType.PEER_KEY_ROTATED:
            self.peerset.apply(frame)
        return [Presence(frame)]

    def _presence_batch(self, frame: Frame) -> list[Output[W]]:
        me = self.hello_ack.get("pubkey")
        if self.peerset is not None:
            self.peerset.on_batch(frame)
        # The mesh's one frame names us too. An update is no event (the peer set holds it),
        # and a join's event has the fields it had before the snapshot feature.
        return [Presence({k: v for k, v in event.items() if k != "connections"})
                for event in frame["events"]
                if event["pubkey"] != me and event["type"] != FrameType.PEER_UPDATE]

    def _presence_snapshot(self, frame: Frame) -> list[Output[W]]:
        if self.peerset is not None:
            self.peerset.on_snapshot(frame)
        return []

    # -- the handshake -------------------------------------------------------------------

    @property
    def _expected(self) -> str:
        return {Phase.AWAIT_CHALLENGE: FrameType.CHALLENGE,
                Phase.AWAIT_HELLO_ACK: FrameType.HELLO_ACK}.get(
                    self.phase, FrameType.FEATURE_RESPONSE).value

    def _handshake(self, frame: Frame) -> list[Output[W]]:
        kind = frame["type"]
        if kind == FrameType.ERROR:
            return self._fail(LinkError(f"the broker answered {frame['error']['code']}: "
                                        f"{frame['error']['message']}"))
        if self.phase is Phase.AWAIT_FEATURES and (kind in PRESENCE_FRAMES
                                                   or kind == FrameType.PRESENCE_BATCH):
            # Once hello_ack is out the broker counts us as connected and may announce other
            # members (many reconnect at once after a broker restart): not the answer.
            return []
        if kind != self._expected:
            return self._fail(LinkError(f"expected {self._expected} from the broker, "
                                        f"got {kind}"))
        if self.phase is Phase.AWAIT_CHALLENGE:
            return self._on_challenge(frame)
        if self.phase is Phase.AWAIT_HELLO_ACK:
            self.hello_ack = frame
            self.phase = Phase.AWAIT_FEATURES
            return [Send({"type": FrameType.FEATURE_REQUEST.value, "id": "features",
                          "require": list(self.require), "optional": list(self.optional)})]
        return self._on_features(frame)

    def _on_challenge(self, challenge: Frame) -> list[Output[W]]:
        self.broker_version = challenge.get("broker_version")
        pubkey, signature = handshake.sign(self.key, self.mesh_id, challenge["nonce"])
        hello: Frame = {"type": FrameType.HELLO.value, "mesh_id": self.mesh_id,
                        "pubkey": pubkey, "nonce": challenge["nonce"], "signature": signature}
        if self.invite_token is not None:
            hello.update(type=FrameType.JOIN.value, invite_token=self.invite_token,
                         display_name=self.display_name)
        elif self.host_fingerprint is not None:
            # Lets the broker tell a clone of this data dir (same key, other host) from a
            # reconnect of this daemon (docs/operations.md "A cloned host").
            hello["host_fingerprint"] = handshake.host_mark(pubkey, self.host_fingerprint)
        self.phase = Phase.AWAIT_HELLO_ACK
        return [Send(hello)]

    def _on_features(self, answer: Frame) -> list[Output[W]]:
        supported = answer["supported"]
        reason = features.validate(supported, self.require)
        if reason is None and answer["missing_required"]:
            reason = CloseReason("feature_unavailable", answer["missing_required"][0],
                                 "the broker reports it missing")
        if reason is not None:
            self.phase = Phase.CLOSED
            return [Close(CloseCode.FEATURE, features.close_reason_text(reason)),
                    Failed(FeatureUnavailable(reason, supported, answer))]
        self.supported = dict(supported)
        if features.presence_snapshot(self.supported, (*self.require, *self.optional)):
            self.peerset = PeerSet(str(self.hello_ack["pubkey"]))
        self.phase = Phase.READY
        return [Ready(self.hello_ack, self.supported, self.broker_version)]

    def _fail(self, error: LinkError) -> list[Output[W]]:
        self.phase = Phase.CLOSED
        return [Failed(error)]


def _spliced(payload: bytes, cmid: str, rid: str) -> bytes | None:
    """A stored payload (an object orjson wrote: compact, no ids of the frame's) as a frame
    item, its ids added before its closing brace: the same bytes as parsing it and encoding
    the item. None when it holds a null other than meta's or reply_to's (the item leaves
    those out, so it is parsed); a null inside a string or in meta only costs that parse."""
    nulls = payload.count(b":null")
    if nulls and nulls != payload.count(b'"meta":null') + payload.count(b'"reply_to":null'):
        return None
    return b"".join((payload[:-1], b',"client_message_id":', orjson.dumps(cmid),
                     b',"id":"', rid.encode(), b'"}'))


PRESENCE_FRAMES = frozenset({FrameType.PEER_JOIN, FrameType.PEER_LEAVE,
                             FrameType.CLONE_SUSPECTED, FrameType.PEER_KEY_ROTATED})

# What a READY link does with each frame the broker starts; every frame not named here
# answers a request of ours by its id (``_answer``), so a new request needs no row. A new
# frame the broker starts is one row here, and its event one branch of
# ``BrokerLink._carry`` (websocket.py).
ROUTES: dict[str, Callable[[LinkState[Any], Frame], list[Any]]] = {
    FrameType.DELIVER: LinkState._deliver,
    FrameType.DELIVER_BATCH: LinkState._deliver_batch,
    **dict.fromkeys(PRESENCE_FRAMES, LinkState._presence),
    FrameType.PRESENCE_BATCH: LinkState._presence_batch,
    FrameType.PRESENCE_SNAPSHOT: LinkState._presence_snapshot,
}


# -- answers read ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    """What a ``resume_ack`` means for the receive cursor (DESIGN §6): ``OK`` the broker
    delivers after ``position``; otherwise the cursor moves to ``position`` and the receiver
    resumes again (STALE_SEQUENCE: past what the broker compacted; INVALID_SEQUENCE: back to
    the broker's last seq)."""

    result: str
    position: Position
    broker_last_seq: int | None = None
    acked_seq: int | None = None   # what the broker holds acknowledged (None: an older one)

    @property
    def ok(self) -> bool:
        return self.result == "OK"


def resume_outcome(answer: Frame, cursor: Position) -> ResumeOutcome:
    if answer.get("type") != FrameType.RESUME_ACK:
        error = answer.get("error") or {}
        raise LinkError(f"the broker refused the resume: {error.get('code', answer.get('type'))}"
                        f": {error.get('message', '')}")
    result, acked = answer["result"], answer.get("acked_seq")
    if result == "OK":
        return ResumeOutcome(result, (answer["epoch"], answer.get("last_seq", cursor[1])),
                             acked_seq=acked)
    seq = answer["compacted_seq"] if result == "STALE_SEQUENCE" else answer["broker_last_seq"]
    return ResumeOutcome(result, (answer["epoch"], seq), answer["broker_last_seq"], acked)


def refusal(answer: Frame) -> str | None:
    """What a broker's ``error`` answer to a request says, or None for any other answer."""
    if answer.get("type") != FrameType.ERROR:
        return None
    return f"{answer['error']['code']}: {answer['error']['message']}"
