"""The per-connection protocol state machine, sans I/O (no sockets, no database, no clock).

``Session.on_text(raw, now)`` decodes one frame and returns the actions the server must
carry out: send a frame, close the socket, or hand a request to the service. Membership is
looked up by the service (it needs the store) and fed back through ``on_member``.

    AWAIT_HELLO --hello/join, good signature, our nonce--> AUTHENTICATING
    AUTHENTICATING --member ok--> READY        --unknown/revoked--> closed 4002
    READY: send, send_batch, request, ack, resume, peers, profile, feature_negotiation_request,
           file_open, file_chunk, file_close, file_fetch

A frame that fails its schema gets an ``error`` frame and the connection lives on; more than
``max_bad`` of them inside ``window_s`` close it (1008). Must not import websockets or stores.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import tidemesh
from tidemesh.core import handshake
from tidemesh.core.errors import TidemeshError
from tidemesh.core.wire import (
    HELLO_MAX_BYTES,
    MAX_FRAME_BYTES,
    PROTOCOL,
    CloseCode,
    FrameType,
    InvalidFrame,
    decode,
    error_frame,
)


class Phase(StrEnum):
    AWAIT_HELLO = "await_hello"
    AUTHENTICATING = "authenticating"
    READY = "ready"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Send:
    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Look the member up (or redeem the invite) and call ``on_member`` with the outcome."""

    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A READY-phase frame, for the route table (``broker/service/routes.py``) to handle."""

    frame: dict[str, Any]


Action = Send | Close | Authenticate | Dispatch

# The frames legal once READY; who handles each is the route table's business.
READY_TYPES = frozenset({
    FrameType.SEND, FrameType.SEND_BATCH, FrameType.REQUEST, FrameType.ACK, FrameType.RESUME,
    FrameType.FEATURE_REQUEST, FrameType.PEERS, FrameType.PROFILE, FrameType.KEY_ROTATE,
    FrameType.FILE_OPEN, FrameType.FILE_CHUNK, FrameType.FILE_CLOSE, FrameType.FILE_FETCH,
})
# A hello refusal with a close code of its own: the daemon's fix is another key, not a retry.
ROTATED_OUT = "key_rotated_out"


@dataclass(slots=True)
class Session:
    nonce: str
    max_bad: int = 20
    window_s: float = 10.0
    phase: Phase = Phase.AWAIT_HELLO
    mesh_id: str | None = None
    pubkey: str | None = None
    bad: deque[float] = field(default_factory=deque)

    def challenge(self) -> Send:
        # The version lets a daemon say which broker build it is on (its /v1/health).
        return Send({"type": "challenge", "nonce": self.nonce, "protocol": PROTOCOL,
                     "broker_version": tidemesh.__version__})

    def on_text(self, raw: str | bytes, now: float) -> list[Action]:
        if self.phase is Phase.CLOSED:
            return []
        try:
            frame = decode(raw, HELLO_MAX_BYTES if self.phase is Phase.AWAIT_HELLO
                           else MAX_FRAME_BYTES)
        except InvalidFrame as exc:
            return self._bad_frame(exc, now)
        kind = FrameType(frame["type"])
        if self.phase is Phase.AWAIT_HELLO:
            return self._on_hello(frame) if kind in (FrameType.HELLO, FrameType.JOIN) else (
                self._close(CloseCode.POLICY, "hello_required"))
        if self.phase is Phase.AUTHENTICATING:
            return self._close(CloseCode.POLICY, "wait_for_hello_ack")
        if kind in (FrameType.HELLO, FrameType.JOIN):
            return self._close(CloseCode.POLICY, "nonce_replayed")
        if kind not in READY_TYPES:
            return self._bad_frame(InvalidFrame(f"{kind} is not a daemon frame", field="type",
                                                id=frame.get("id")), now)
        return [Dispatch(frame)]

    def _on_hello(self, frame: dict[str, Any]) -> list[Action]:
        if frame["nonce"] != self.nonce:
            return self._close(CloseCode.POLICY, "nonce_replayed")
        if not handshake.verify(frame["mesh_id"], frame["pubkey"], frame["nonce"],
                                frame["signature"]):
            return self._close(CloseCode.POLICY, "bad_signature")
        self.phase = Phase.AUTHENTICATING
        return [Authenticate(frame)]

    def on_member(self, mesh_id: str, mesh_name: str, pubkey: str, session_id: str,
                  problem: str | None, joined: bool = False,
                  clone_suspected: bool = False,
                  name_taken_by: tuple[str, ...] = ()) -> list[Action]:
        """The service's answer to ``Authenticate``: ``problem`` is a close reason or None."""
        if problem is not None:
            return self._close(CloseCode.ROTATED_OUT if problem == ROTATED_OUT
                               else CloseCode.AUTH, problem)
        self.phase, self.mesh_id, self.pubkey = Phase.READY, mesh_id, pubkey
        ack = {"type": "hello_ack", "mesh_id": mesh_id, "mesh_name": mesh_name,
               "pubkey": pubkey, "session_id": session_id, "joined": joined}
        if clone_suspected:   # only ever for a hello with host_fingerprint: a daemon that knows it
            ack["clone_suspected"] = True
        if name_taken_by:     # only on a join: an old daemon ignores what it does not read
            ack["name_taken_by"] = list(name_taken_by)
        return [Send(ack)]

    def refuse(self, code: int, reason: str) -> list[Action]:
        """The service refused an authenticated member (a suspected clone, clone.policy)."""
        return self._close(code, reason)

    def _bad_frame(self, exc: TidemeshError, now: float) -> list[Action]:
        self.bad.append(now)
        while self.bad and self.bad[0] < now - self.window_s:
            self.bad.popleft()
        if len(self.bad) > self.max_bad:
            return self._close(CloseCode.POLICY, "too_many_bad_frames")
        details = {k: v for k, v in exc.details.items() if k != "id"}
        request_id = exc.details.get("id")
        return [Send(error_frame(exc.code, exc.message,
                                 request_id if isinstance(request_id, str) else None, **details))]

    def _close(self, code: int, reason: str) -> list[Action]:
        self.phase = Phase.CLOSED
        return [Close(code, reason)]


class ResumeResult(StrEnum):
    OK = "OK"
    STALE_SEQUENCE = "STALE_SEQUENCE"
    INVALID_SEQUENCE = "INVALID_SEQUENCE"


def decide_resume(epoch: int, last_seq: int, cur_epoch: int, cur_last: int,
                  cur_compacted: int) -> ResumeResult:
    """DESIGN §6: epoch 0 means "nothing stored yet" (a fresh daemon)."""
    if epoch == 0:
        epoch, last_seq = cur_epoch, 0
    if epoch != cur_epoch:
        return ResumeResult.STALE_SEQUENCE
    if last_seq > cur_last:
        return ResumeResult.INVALID_SEQUENCE
    if last_seq < cur_compacted:
        return ResumeResult.STALE_SEQUENCE
    return ResumeResult.OK
