"""The pure session state machine and the resume decision, without sockets."""

from __future__ import annotations

from typing import Any

from nacl.signing import SigningKey

from tidemesh.broker.session import (
    Authenticate,
    Close,
    Dispatch,
    Phase,
    ResumeResult,
    Send,
    Session,
    decide_resume,
)
from tidemesh.core import handshake
from tidemesh.core.wire import encode

MESH = "01J0000000000000000000000A"


def _hello(nonce: str, key: SigningKey | None = None) -> str:
    pk, sig = handshake.sign(key or SigningKey.generate(), MESH, nonce)
    return encode({"type": "hello", "mesh_id": MESH, "pubkey": pk, "nonce": nonce,
                   "signature": sig})


def _ready() -> Session:
    s = Session(handshake.new_nonce())
    [auth] = s.on_text(_hello(s.nonce), 0)
    assert isinstance(auth, Authenticate) and s.phase is Phase.AUTHENTICATING
    [ack] = s.on_member(MESH, "m", auth.frame["pubkey"], MESH, None)
    assert isinstance(ack, Send) and ack.frame["type"] == "hello_ack"
    return s


def test_anything_before_hello_closes_1008() -> None:
    s = Session(handshake.new_nonce())
    assert s.on_text(encode({"type": "ack", "epoch": 1, "seq": 1}), 0) == [
        Close(1008, "hello_required")]


def test_a_frame_too_deep_or_too_big_before_hello_is_an_error_frame() -> None:
    s = Session(handshake.new_nonce())
    deep = '{"type":"hello","x":' + '{"a":' * 600 + "1" + "}" * 601   # 3.6 KB, 601 deep
    big = encode({"type": "hello", "x": "y" * 5000})                    # shallow, 5 KB
    for frame, why in ((deep, "deeper than 64"), (big, "over the limit of 4096")):
        [err] = s.on_text(frame, 0)
        assert isinstance(err, Send) and err.frame["error"]["code"] == "invalid_frame"
        assert why in err.frame["error"]["message"]
    assert s.phase is Phase.AWAIT_HELLO  # a good hello may still come
    assert isinstance(s.on_text(_hello(s.nonce), 0)[0], Authenticate)


def test_a_ready_frame_nested_deeper_than_the_limit_is_an_error_frame() -> None:
    s = _ready()
    # The frame is one level, so its "x" may nest 63 more: 64 in all.
    for depth, refused in ((64, True), (63, False)):
        frame = '{"type":"peers","id":"p","x":' + "[" * depth + "]" * depth + "}"
        [answer] = s.on_text(frame, 1)
        assert isinstance(answer, Send), answer  # "x" is no field of peers: an error either way
        assert ("deeper than 64" in answer.frame["error"]["message"]) is refused


def test_hello_for_another_nonce_is_a_replay() -> None:
    s = Session(handshake.new_nonce())
    assert s.on_text(_hello(handshake.new_nonce()), 0) == [Close(1008, "nonce_replayed")]


def test_member_problem_closes_4002() -> None:
    s = Session(handshake.new_nonce())
    s.on_text(_hello(s.nonce), 0)
    assert s.on_member(MESH, "", "p", "", "member_revoked") == [Close(4002, "member_revoked")]
    assert s.on_text("{}", 1) == []


def test_ready_frames_are_dispatched_and_a_second_hello_closes() -> None:
    s = _ready()
    frame: dict[str, Any] = {"type": "resume", "id": "r1", "epoch": 0, "last_seq": 0}
    assert s.on_text(encode(frame), 1) == [Dispatch(frame)]
    assert s.on_text(_hello(s.nonce), 1) == [Close(1008, "nonce_replayed")]


def test_bad_frames_answer_until_the_window_overflows() -> None:
    s = Session(handshake.new_nonce(), max_bad=3, window_s=10)
    for t in range(3):
        [err] = s.on_text("nope", t)
        assert isinstance(err, Send) and err.frame["error"]["code"] == "invalid_frame"
    assert s.on_text("nope", 100) != [Close(1008, "too_many_bad_frames")]  # old ones expired
    for t in range(2):
        s.on_text("nope", 101 + t)
    assert s.on_text("nope", 103) == [Close(1008, "too_many_bad_frames")]


def test_resume_decisions() -> None:
    assert decide_resume(0, 0, 1, 5, 0) is ResumeResult.OK
    assert decide_resume(0, 0, 1, 5, 2) is ResumeResult.STALE_SEQUENCE
    assert decide_resume(1, 5, 1, 5, 0) is ResumeResult.OK
    assert decide_resume(1, 6, 1, 5, 0) is ResumeResult.INVALID_SEQUENCE
    assert decide_resume(1, 1, 1, 5, 3) is ResumeResult.STALE_SEQUENCE
    assert decide_resume(2, 1, 1, 5, 0) is ResumeResult.STALE_SEQUENCE
