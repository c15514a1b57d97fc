"""Frames against their schemas, the hello signature, and invite strings."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from importlib import resources

import pytest
from nacl.signing import SigningKey

from tidemesh.core import handshake
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.invite import Invite, decode, parse_duration_ms
from tidemesh.core.numbers import MAX_ID
from tidemesh.core.wire import FrameType, InvalidFrame, check
from tidemesh.core.wire import decode as decode_frame


def test_every_frame_type_has_a_schema_and_back() -> None:
    files = {p.name.removesuffix(".schema.json")
             for p in (resources.files("tidemesh.schemas") / "ws").iterdir()}
    assert files == {t.value for t in FrameType}


def test_bad_frames_name_the_field() -> None:
    with pytest.raises(InvalidFrame) as info:
        check({"type": "ack", "epoch": 0, "seq": 1})
    assert info.value.details["field"] == "epoch"
    with pytest.raises(InvalidFrame):
        decode_frame(b"\xff")
    with pytest.raises(InvalidFrame):
        check({"type": "nope"})


def test_every_integer_of_every_frame_fits_a_database_integer() -> None:
    """An ack of seq 2**63 once reached the broker's store, which could not bind it, and the
    broker stopped: each frame's integers are bounded where the frame is checked."""
    check({"type": "ack", "epoch": 1, "seq": MAX_ID})
    for field in ("epoch", "seq"):
        with pytest.raises(InvalidFrame) as info:
            check({"type": "ack", "epoch": 1, "seq": 1, field: 2**63})
        assert info.value.details["field"] == field
    for name in (p.name for p in (resources.files("tidemesh.schemas") / "ws").iterdir()):
        text = (resources.files("tidemesh.schemas") / "ws" / name).read_text()
        for spec in _integers(json.loads(text)):
            assert spec.get("maximum", 2**63) <= MAX_ID, (name, spec)


def _integers(node: object) -> list[dict[str, object]]:
    if isinstance(node, list):
        return [s for v in node for s in _integers(v)]
    if not isinstance(node, dict):
        return []
    own = [node] if node.get("type") == "integer" else []
    return own + [s for v in node.values() for s in _integers(v)]


def _send(**extra: object) -> dict[str, object]:
    return {"type": "send", "id": "f1", "client_message_id": "c1",
            "to": {"kind": "topic", "ref": "ops"}, "body": "hi", "body_encoding": "utf8",
            "priority": "next", **extra}


def _deliver(**extra: object) -> dict[str, object]:
    return {"type": "deliver", "epoch": 1, "seq": 1, "broker_message_id": "01J" + "0" * 23,
            "sender_pubkey": "ab" * 32, "to": {"kind": "topic", "ref": "ops"}, "body": "hi",
            "body_encoding": "utf8", "priority": "next", "created_at": 1, **extra}


@pytest.mark.parametrize("make", [_send, _deliver])
def test_reply_to_is_a_message_id_or_null_on_send_and_deliver(
        make: Callable[..., dict[str, object]]) -> None:
    for ok in (None, "01J0000000000000000000000Z"):
        check(make(reply_to=ok))
    check(make())
    for bad, says in (("not-an-id", "must match pattern"), (5, "must be null or string")):
        with pytest.raises(InvalidFrame) as info:
            check(make(reply_to=bad))
        assert info.value.details["field"] == "reply_to"
        assert says in info.value.message


def test_signature_binds_mesh_key_and_nonce() -> None:
    key = SigningKey.generate()
    nonce = handshake.new_nonce()
    pk, sig = handshake.sign(key, "MESH", nonce)
    assert handshake.verify("MESH", pk, nonce, sig)
    assert not handshake.verify("OTHER", pk, nonce, sig)
    assert not handshake.verify("MESH", pk, handshake.new_nonce(), sig)
    assert not handshake.verify("MESH", pk, nonce, "00" * 64)


def test_invite_round_trip_and_damage() -> None:
    inv = Invite("ws://h:1", "01J0000000000000000000000A", "team", "secret-token")
    assert decode(inv.encode()) == inv
    for bad in ("nope", "tm1.!!!", Invite("http://h", "m", "t", "x").encode()):
        with pytest.raises(InvalidRequest):
            decode(bad)


def test_durations() -> None:
    assert parse_duration_ms("90m") == 90 * 60_000
    assert parse_duration_ms("7d") == 7 * 86_400_000
    for bad in ("", "7", "0d", "-1h", "1y"):
        with pytest.raises(InvalidRequest):
            parse_duration_ms(bad)


def test_invite_with_several_brokers_round_trips_and_one_broker_stays_as_it_was() -> None:
    several = Invite("ws://a:1", "M", "team", "tok", ("ws://b:1", "wss://c:443"))
    assert decode(several.encode()) == several
    assert several.urls == ("ws://a:1", "ws://b:1", "wss://c:443")
    # An invite with one broker has no fallbacks key: hosts that predate it still read it.
    one = Invite("ws://a:1", "M", "team", "tok").encode()
    assert "fallbacks" not in base64.urlsafe_b64decode(one[4:] + "=" * (-len(one[4:]) % 4)
                                                       ).decode()
    with pytest.raises(InvalidRequest):
        decode(Invite("ws://a:1", "M", "team", "tok", ("http://b",)).encode())


def test_a_presence_batch_holds_joins_and_leaves_and_nothing_else() -> None:
    mesh, key = "01M8BQRTS5FD5WAAKSENZYEQ2J", "ab" * 32
    join = {"type": "peer_join", "mesh_id": mesh, "pubkey": key, "at": 1,
            "display_name": None, "profile": {"status": "idle"}}
    leave = {"type": "peer_leave", "mesh_id": mesh, "pubkey": key, "at": 2}
    check({"type": "presence_batch", "mesh_id": mesh, "events": [join, leave]})
    with pytest.raises(InvalidFrame):
        check({"type": "presence_batch", "mesh_id": mesh, "events": []})
    with pytest.raises(InvalidFrame):
        check({"type": "presence_batch", "mesh_id": mesh,
               "events": [{**leave, "type": "deliver"}]})
