"""The daemon's side of the broker protocol, sans I/O: frames and ticks in, frames and events
out, no socket and no clock (``daemon/link/linkstate.py``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from nacl.signing import SigningKey

from tidemesh.broker.session import Authenticate, Session
from tidemesh.broker.session import Send as BrokerSend
from tidemesh.core import features, handshake
from tidemesh.core.send import Destination, Priority, SendRequest
from tidemesh.core.wire import FrameType, encode, load_schema
from tidemesh.daemon.link.linkstate import (
    ROUTES,
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
    Phase,
    Presence,
    Ready,
    Send,
    Settled,
    Stalled,
    Unreadable,
    Unsolicited,
    refusal,
    resume_outcome,
)
from tidemesh.daemon.link.receive_order import ReceiveOrder

MESH = "01J0000000000000000000000A"
PUBKEY = "ab" * 32
SUPPORTED = features.advertise("retention_scoped", 7, 1 << 20)


def _machine(**kw: Any) -> LinkState[str]:
    return LinkState(MESH, SigningKey.generate(), 100.0, handshake_timeout=10,
                     stall_timeout=30, **kw)


def _challenge(nonce: str | None = None) -> str:
    return encode({"type": "challenge", "nonce": nonce or handshake.new_nonce(),
                   "protocol": 1, "broker_version": "9.9.9"})


def _ack() -> str:
    return encode({"type": "hello_ack", "mesh_id": MESH, "mesh_name": "team", "pubkey": PUBKEY,
                   "session_id": MESH})


def _features(supported: dict[str, Any] | None = None,
              missing: list[str] | None = None) -> str:
    return encode({"type": "feature_negotiation_response", "id": "features",
                   "supported": SUPPORTED if supported is None else supported,
                   "missing_required": missing or []})


def _ready(**kw: Any) -> LinkState[str]:
    m = _machine(**kw)
    m.on_frame(_challenge(), 100)
    m.on_frame(_ack(), 100)
    [ready] = m.on_frame(_features(), 100)
    assert isinstance(ready, Ready)
    return m


def _join(n: int = 1) -> str:
    return encode({"type": "peer_join", "mesh_id": MESH, "pubkey": PUBKEY, "at": n})


def _delivery(seq: int) -> dict[str, Any]:
    return {"type": "deliver", "epoch": 1, "seq": seq,
            "broker_message_id": MESH[:-4] + f"{seq:04d}", "sender_pubkey": PUBKEY,
            "to": {"kind": "topic", "ref": "ops"}, "body": "hi", "body_encoding": "utf8",
            "priority": "next", "created_at": 1}


def _result(request_id: str, status: int = 201) -> dict[str, Any]:
    return {"type": "send_result", "id": request_id, "status": status,
            "client_message_id": "c"}


# -- the handshake ---------------------------------------------------------------------------

def test_the_hello_answers_the_brokers_challenge_and_the_broker_accepts_it() -> None:
    broker = Session(handshake.new_nonce())
    m = _machine(host_fingerprint="host-1")
    [hello] = m.on_frame(encode(broker.challenge().frame), 100)
    assert isinstance(hello, Send) and hello.frame["type"] == "hello"
    assert hello.frame["host_fingerprint"] == handshake.host_mark(hello.frame["pubkey"],
                                                                  "host-1")
    [auth] = broker.on_text(encode(hello.frame), 100)   # the broker's own machine checks it
    assert isinstance(auth, Authenticate)
    [ack] = broker.on_member(MESH, "team", hello.frame["pubkey"], MESH, None)
    assert isinstance(ack, BrokerSend)
    [request] = m.on_frame(encode(ack.frame), 100)
    assert isinstance(request, Send)
    assert request.frame == {"type": "feature_negotiation_request", "id": "features",
                             "require": list(features.REQUIRED),
                             "optional": list(features.OPTIONAL)}
    assert m.phase is Phase.AWAIT_FEATURES


def test_a_join_carries_the_invite_and_no_host_mark() -> None:
    m = _machine(invite_token="tok", display_name="bob", host_fingerprint="host-1")
    [join] = m.on_frame(_challenge(), 100)
    assert isinstance(join, Send)
    assert join.frame["type"] == "join" and join.frame["invite_token"] == "tok"
    assert join.frame["display_name"] == "bob" and "host_fingerprint" not in join.frame


def test_negotiation_skips_presence_and_ends_ready_with_what_the_broker_said() -> None:
    m = _machine()
    m.on_frame(_challenge(), 100)
    m.on_frame(_ack(), 100)
    assert m.on_frame(_join(), 100) == []      # others reconnecting meanwhile: not the answer
    [ready] = m.on_frame(_features(), 100)
    assert ready == Ready(m.hello_ack, SUPPORTED, "9.9.9")
    assert ready.hello_ack["mesh_name"] == "team" and m.phase is Phase.READY


@pytest.mark.parametrize(("supported", "missing", "feature"), [
    ({k: v for k, v in SUPPORTED.items() if k != features.DEDUPE}, [features.DEDUPE],
     features.DEDUPE),
    (features.advertise("retention_scoped", 1, 1 << 20), [], features.DEDUPE),  # under 3 days
])
def test_an_unusable_required_feature_closes_4010_and_fails(
        supported: dict[str, Any], missing: list[str], feature: str) -> None:
    m = _machine()
    m.on_frame(_challenge(), 100)
    m.on_frame(_ack(), 100)
    close, failed = m.on_frame(_features(supported, missing), 100)
    assert isinstance(close, Close) and close.code == 4010
    assert feature in close.reason
    assert isinstance(failed, Failed) and isinstance(failed.error, FeatureUnavailable)
    assert failed.error.reason.feature == feature and not failed.error.retryable
    assert m.phase is Phase.CLOSED


@pytest.mark.parametrize(("frame", "says"), [
    (encode({"type": "error", "error": {"code": "busy", "message": "later"}}),
     "the broker answered busy: later"),
    (_ack(), "expected challenge from the broker, got hello_ack"),
    ("{oops", "the broker sent a bad challenge frame"),
])
def test_a_wrong_frame_during_the_handshake_fails_it(frame: str, says: str) -> None:
    m = _machine()
    [failed] = m.on_frame(frame, 100)
    assert isinstance(failed, Failed) and says in str(failed.error)
    assert m.on_frame(_challenge(), 100) == []


@pytest.mark.parametrize(("code", "reason", "retryable"), [
    (4002, "member_revoked", False), (1008, "hello_timeout", True), (None, "lost", True)])
def test_a_close_during_the_handshake_is_a_refusal(code: int | None, reason: str,
                                                   retryable: bool) -> None:
    m = _machine()
    m.on_frame(_challenge(), 100)
    [failed] = m.on_closed(code, reason)
    assert isinstance(failed, Failed) and isinstance(failed.error, HandshakeRejected)
    assert (failed.error.code, failed.error.reason) == (code, reason)
    assert failed.error.retryable is retryable


def test_the_handshake_fails_at_its_deadline_not_before() -> None:
    m = _machine(url="ws://b")
    m.on_frame(_challenge(), 105)
    assert m.tick(109.9) == []
    [failed] = m.tick(110)
    assert isinstance(failed, Failed) and failed.error.retryable
    assert str(failed.error) == "the broker at ws://b did not finish the handshake within 10 s"


# -- requests and their answers --------------------------------------------------------------

def test_answers_find_their_request_by_id_in_any_order() -> None:
    m = _ready()
    first = m.call({"type": "peers"}, 101, "w1")
    second = m.call({"type": "resume", "epoch": 0, "last_seq": 0}, 101, "w2")
    assert first.frame["id"] != second.frame["id"]
    ack = {"type": "resume_ack", "id": second.frame["id"], "result": "OK", "epoch": 1,
           "broker_last_seq": 0, "compacted_seq": 0}
    assert m.on_frame(encode(ack), 102) == [Answered("w2", ack)]
    peers = {"type": "peers", "id": first.frame["id"], "peers": []}
    assert m.on_frame(encode(peers), 102) == [Answered("w1", peers)]
    assert m.pending == {}


def test_a_late_or_unknown_answer_is_dropped_and_an_unknown_error_is_told() -> None:
    m = _ready()
    sent = m.call({"type": "peers"}, 101, "w")
    m.forget(sent.frame["id"])
    assert m.on_frame(encode({"type": "peers", "id": sent.frame["id"], "peers": []}), 102) == []
    error = {"type": "error", "id": "r999", "error": {"code": "x", "message": "y"}}
    assert m.on_frame(encode(error), 102) == [Unsolicited(error)]
    assert refusal(error) == "x: y" and refusal({"type": "result", "id": "r", "ok": True}) is None


def test_a_claimed_batch_is_one_frame_one_pending_entry_and_settles_at_once() -> None:
    m = _ready()
    rows = [(f"c{i}", {"to": {"kind": "topic", "ref": "ops"}, "body": f"b{i}",
                       "meta": None, "ttl": None}) for i in range(3)]
    sent = m.send_batch(rows, 101, "batch")
    frame = sent.frame
    assert frame["type"] == "send_batch" and len(frame["sends"]) == 3
    assert list(m.pending) == [frame["id"]]
    first = frame["sends"][0]
    assert first["client_message_id"] == "c0" and first["meta"] is None and "ttl" not in first
    ids = [s["id"] for s in frame["sends"]]
    answer = {"type": "send_results", "id": frame["id"],
              "results": [_result(ids[2]), _result(ids[0], 409)]}   # one missing, out of order
    assert m.on_frame(encode(answer), 102) == [
        Settled("batch", [_result(ids[0], 409), None, _result(ids[2])])]
    assert m.pending == {}


def test_a_lone_row_goes_as_a_send_frame_and_its_answer_is_its_result() -> None:
    m = _ready()
    sent = m.send_batch([("c", {"to": {"kind": "topic", "ref": "ops"}, "body": "b"})], 101, "w")
    assert sent.frame["type"] == "send" and sent.frame["client_message_id"] == "c"
    result = _result(sent.frame["id"])
    assert m.on_frame(encode(result), 102) == [Settled("w", [result])]


def test_a_batch_refused_as_a_whole_settles_with_the_refusal() -> None:
    m = _ready()
    sent = m.send_batch([("a", {"body": "1"}), ("b", {"body": "2"})], 101, "w")
    error = {"type": "error", "id": sent.frame["id"],
             "error": {"code": "invalid_frame", "message": "no"}}
    [settled] = m.on_frame(encode(error), 102)
    assert settled == Settled("w", [None, None],
                              "the broker refused the batch: invalid_frame: no")


def test_trace_context_goes_only_to_a_broker_that_supports_it() -> None:
    row = [("c", {"body": "b", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})]
    assert "traceparent" in _ready().send_batch(row, 101, "w").frame
    old = _machine()
    old.on_frame(_challenge(), 100)
    old.on_frame(_ack(), 100)
    old.on_frame(_features({k: v for k, v in SUPPORTED.items()
                            if k != features.TRACE_CONTEXT}), 100)
    assert "traceparent" not in old.send_batch(row, 101, "w").frame


def _old_broker() -> LinkState[str]:
    old = _machine()
    old.on_frame(_challenge(), 100)
    old.on_frame(_ack(), 100)
    old.on_frame(_features({k: v for k, v in SUPPORTED.items()
                            if k != features.TRACE_CONTEXT}), 100)
    return old


def _on_wire(sent: Send) -> Any:
    return orjson.loads(sent.wire if sent.wire is not None else encode(sent.frame))


@pytest.mark.parametrize("broker", [_ready, _old_broker])
@pytest.mark.parametrize("count", [1, 3])
def test_stored_payloads_go_on_the_wire_as_the_frame_their_parse_would_make(
        broker: Any, count: int) -> None:
    """The outbox's bytes go into the frame as they are; a row with a null the frame leaves
    out (an old row's traceparent), or for a broker without trace context, is parsed."""
    tp = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    rows = [(f'c"{i}', SendRequest(
        Destination.parse("topic:ops"), (f"héllo {i}" + '":null' * (i == 2)).encode(), "utf8",
        Priority.NEXT, {"k": [1, None], "reply_to": None} if i == 1 else None, None, None,
        traceparent=None if i == 0 else tp).to_payload()) for i in range(3)]
    rows = rows if count == 3 else rows[1:2]
    spliced, parsed = broker(), broker()
    from_bytes = spliced.send_batch([(c, orjson.dumps(p)) for c, p in rows], 101, "w")
    from_dicts = parsed.send_batch(rows, 101, "w")
    assert _on_wire(from_bytes) == _on_wire(from_dicts)
    assert from_bytes.frame["id"] == from_dicts.frame["id"] and spliced.pending == parsed.pending
    sends = [_on_wire(from_bytes)] if count == 1 else _on_wire(from_bytes)["sends"]
    assert [s["client_message_id"] for s in sends] == [c for c, _ in rows]
    assert broker is _ready or all("traceparent" not in s for s in sends)
    # The row whose only nulls are meta's and reply_to's went as its stored bytes.
    assert broker is _old_broker or (from_bytes.wire is not None if count == 1 else
                                     isinstance(from_bytes.frame["sends"][1], orjson.Fragment))


def test_requests_before_ready_or_after_the_end_are_refused() -> None:
    with pytest.raises(LinkClosed):
        _machine().call({"type": "peers"}, 100, "w")
    m = _ready()
    m.call({"type": "peers"}, 101, "a")
    m.send_batch([("c", {"body": "b"})], 101, "b")
    [ended] = m.on_closed(1006, "gone")
    assert isinstance(ended, Ended) and ended.waiters == ["a", "b"]
    assert str(ended.error) == "the broker link closed (1006): gone"
    with pytest.raises(LinkClosed):
        m.call({"type": "peers"}, 102, "c")
    assert m.on_closed(1006, "gone") == []


# -- frames the broker starts ----------------------------------------------------------------

def test_deliveries_go_whole_and_in_order_and_a_gap_is_the_receivers_to_find() -> None:
    m = _ready()
    out = [*m.on_frame(encode(_delivery(1)), 101),
           *m.on_frame(encode({"type": "deliver_batch",
                               "deliveries": [_delivery(2), _delivery(4)]}), 101)]
    assert out == [Delivered([_delivery(1)]),
                   Delivered([_delivery(2), _delivery(4)])]
    # The receiver places what the link handed over against its cursor: seq 3 is missing.
    assert isinstance(out[0], Delivered) and isinstance(out[1], Delivered)
    plan = ReceiveOrder((1, 0)).plan([[(d["epoch"], d["seq"]) for d in f.deliveries]
                                      for f in (out[0], out[1])])
    assert plan.store == [[0], [0]] and plan.gap == (1, 4)


def test_presence_and_unreadable_frames() -> None:
    m = _ready()
    [presence] = m.on_frame(_join(), 101)
    assert isinstance(presence, Presence) and presence.frame["type"] == "peer_join"
    other = {"type": "peer_leave", "mesh_id": MESH, "pubkey": "cd" * 32, "at": 2}
    batch = {"type": "presence_batch", "mesh_id": MESH,
             "events": [{"type": "peer_join", "mesh_id": MESH, "pubkey": PUBKEY, "at": 1}, other]}
    assert m.on_frame(encode(batch), 101) == [Presence(other)]   # the one naming us is ours
    [bad] = m.on_frame("[]", 101)
    assert isinstance(bad, Unreadable) and m.phase is Phase.READY


def test_every_frame_the_broker_starts_has_a_route() -> None:
    """A broker → daemon frame that answers no request (its schema asks no id) is a
    handshake frame, an error, or a row of ``ROUTES``: a new one cannot be forgotten."""
    started = set()
    for kind in FrameType:
        schema = load_schema(kind.value)
        if (schema["title"].startswith("broker → daemon")
                and "id" not in schema.get("required", [])):
            started.add(kind.value)
    assert started - {"challenge", "hello_ack", "error"} == set(ROUTES)


# -- the stall, decided on now ---------------------------------------------------------------

def test_a_broker_that_leaves_a_request_unanswered_has_stalled() -> None:
    m = _ready()
    assert m.tick(1000) == []                       # idle: nothing owed, no stall
    m.call({"type": "peers"}, 1000, "w")           # its wait starts here
    assert m.tick(1030) == []
    [stalled] = m.tick(1030.5)
    assert stalled == Stalled(1, 30.5)
    assert m.phase is Phase.CLOSED and m.tick(2000) == []
    [ended] = m.on_closed(None, "aborted")          # the link cut: the request learns it
    assert isinstance(ended, Ended) and ended.waiters == ["w"]


def test_a_broker_that_talks_but_never_answers_has_stalled_too() -> None:
    # Its presence feed runs on while what answers our requests is stuck: frames keep
    # coming, and the request still waits.
    m = _ready()
    m.call({"type": "profile", "profile": {}}, 1000, "w")
    for t in range(1001, 1031):
        m.on_frame(_join(), t)
    assert m.tick(1030) == []
    assert m.tick(1031) == [Stalled(1, 31)]


def test_the_oldest_request_decides_and_answered_ones_are_forgotten() -> None:
    m = _ready()
    first = m.call({"type": "peers"}, 1000, "a")
    m.call({"type": "peers"}, 1020, "b")
    [answered] = m.on_frame(orjson.dumps({"type": "peers", "id": first.frame["id"],
                                          "peers": []}), 1025)
    assert isinstance(answered, Answered) and answered.waiter == "a"
    assert m.tick(1045) == []                       # b has waited 25 s
    assert m.tick(1050.5) == [Stalled(1, 30.5)]


def test_no_stall_while_the_broker_waits_for_our_full_queue() -> None:
    m = _ready()
    m.call({"type": "peers"}, 1000, "w")
    m.hold()
    assert m.tick(1100) == []
    m.release(1100)
    assert m.tick(1130) == []
    assert m.tick(1131) == [Stalled(1, 31)]


# -- answers read ----------------------------------------------------------------------------

def _resume_ack(result: str, **kw: int) -> dict[str, Any]:
    return {"type": "resume_ack", "id": "r1", "result": result, "epoch": 2,
            "broker_last_seq": 9, "compacted_seq": 5, **kw}


def test_resume_answers() -> None:
    ok = resume_outcome(_resume_ack("OK", last_seq=7), (2, 7))
    assert ok.ok and ok.position == (2, 7)
    assert resume_outcome(_resume_ack("OK"), (2, 3)).position == (2, 3)
    stale = resume_outcome(_resume_ack("STALE_SEQUENCE"), (1, 3))
    assert (stale.ok, stale.position, stale.broker_last_seq) == (False, (2, 5), 9)
    invalid = resume_outcome(_resume_ack("INVALID_SEQUENCE"), (2, 12))
    assert (invalid.ok, invalid.position) == (False, (2, 9))
    with pytest.raises(LinkError, match="refused the resume: busy"):
        resume_outcome({"type": "error", "id": "r1", "error": {"code": "busy",
                                                              "message": "later"}}, (2, 3))


def test_the_presence_snapshot_feeds_the_peer_set_and_an_update_is_no_event() -> None:
    m = _ready()
    assert m.peerset is not None and not m.peerset.synced
    me = m.hello_ack["pubkey"]
    entry = {"pubkey": PUBKEY, "connections": 1, "connected_at": 1, "display_name": None,
             "profile": {}}
    assert m.on_frame(encode({"type": "presence_snapshot", "mesh_id": MESH, "seq": 3,
                              "peers": [entry]}), 101) == []
    update = {"type": "peer_update", "mesh_id": MESH, "pubkey": PUBKEY, "at": 2,
              "profile": {"status": "dnd"}}
    join = {"type": "peer_join", "mesh_id": MESH, "pubkey": me, "at": 2, "connections": 1}
    assert m.on_frame(encode({"type": "presence_batch", "mesh_id": MESH, "seq": 4,
                              "events": [update, join]}), 102) == []
    assert {p["pubkey"]: p["profile"] for p in m.peerset.peers()} == {
        PUBKEY: {"status": "dnd"}, me: {}}
    # Without the feature on either side: no set, and peers asks the broker.
    older = tuple(f for f in features.OPTIONAL if f != features.PRESENCE_SNAPSHOT)
    assert _ready(optional=older).peerset is None
