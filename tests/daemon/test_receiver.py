"""A broker ``deliver`` frame as the inbox stores it (``receiver.delivery_of``), decided
without a link: bodies decoded, DMs opened, a DM that does not open kept and marked."""

from __future__ import annotations

import base64
from typing import Any

from nacl.signing import SigningKey

from tidemesh.core.sealing import seal
from tidemesh.daemon.link.receiver import delivery_of

ME, PEER = SigningKey.generate(), SigningKey.generate()
NOW = 1_700_000_000_000


def frame(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "deliver", "broker_message_id": "B1",
        "sender_pubkey": PEER.verify_key.encode().hex(),
        "to": {"kind": "topic", "ref": "ops"}, "body": "hello", "body_encoding": "utf8",
        "priority": "normal", "epoch": 1, "seq": 7, "created_at": NOW - 5,
    }
    return {**base, **kw}


def test_delivery_of_a_topic_frame_keeps_its_text_and_position() -> None:
    d = delivery_of(frame(client_message_id="c1", meta={"k": 1}), ME, "m", NOW)
    assert (d.body, d.body_encoding, d.meta) == (b"hello", "utf8", {"k": 1})
    assert (d.epoch, d.seq, d.sent_at, d.received_at, d.mesh) == (1, 7, NOW - 5, NOW, "m")
    assert (d.client_message_id, d.dest_kind, d.dest_ref) == ("c1", "topic", "ops")


def test_delivery_of_a_frame_without_client_id_uses_the_broker_id() -> None:
    assert delivery_of(frame(), ME, "m", NOW).client_message_id == "B1"


def test_delivery_of_a_base64_frame_decodes_the_bytes() -> None:
    raw = bytes(range(5))
    d = delivery_of(frame(body=base64.b64encode(raw).decode(), body_encoding="base64"),
                    ME, "m", NOW)
    assert (d.body, d.body_encoding) == (raw, "base64")


def test_delivery_of_a_dm_opens_it_for_this_member() -> None:
    me_hex = ME.verify_key.encode().hex()
    sealed = seal(PEER, me_hex, "c1", b"secret", "utf8")
    d = delivery_of(frame(to={"kind": "dm", "ref": me_hex}, body_encoding="base64",
                          body=base64.b64encode(sealed).decode(), priority="next",
                          client_message_id="c1"),
                    ME, "m", NOW)
    assert (d.body, d.body_encoding, d.meta) == (b"secret", "utf8", None)


def test_a_dm_takes_its_meta_and_reply_to_from_inside_the_seal() -> None:
    me_hex = ME.verify_key.encode().hex()
    sealed = seal(PEER, me_hex, "c1", b"secret", "utf8", {"invoice": 7},
                  "01ARZ3NDEKTSV4RRFFQ69G5FAV", "next")
    # What came in the clear (a broker's forgery) is not what the sender said.
    d = delivery_of(frame(to={"kind": "dm", "ref": me_hex}, body_encoding="base64",
                          body=base64.b64encode(sealed).decode(), meta={"invoice": 8},
                          reply_to="01FORGED", priority="next", client_message_id="c1"),
                    ME, "m", NOW)
    assert (d.body, d.meta, d.reply_to) == (b"secret", {"invoice": 7}, "01ARZ3NDEKTSV4RRFFQ69G5FAV")


def test_a_dm_whose_priority_was_changed_on_the_way_is_marked() -> None:
    me_hex = ME.verify_key.encode().hex()
    sealed = seal(PEER, me_hex, "c1", b"secret", "utf8", None, None, "low")
    d = delivery_of(frame(to={"kind": "dm", "ref": me_hex}, body_encoding="base64",
                          body=base64.b64encode(sealed).decode(), priority="now",
                          client_message_id="c1"), ME, "m", NOW)
    assert d.meta is not None and "changed on the way" in d.meta["tidemesh_undecryptable"]


def test_a_dm_reflected_back_to_its_sender_or_under_another_id_is_refused() -> None:
    me_hex, peer_hex = ME.verify_key.encode().hex(), PEER.verify_key.encode().hex()
    mine = base64.b64encode(seal(ME, peer_hex, "c1", b"my words", "utf8")).decode()
    reflected = delivery_of(frame(to={"kind": "dm", "ref": me_hex}, body_encoding="base64",
                                  body=mine, priority="next", client_message_id="c1"),
                            ME, "m", NOW)
    assert reflected.body != b"my words" and reflected.meta is not None
    assert "reflected" in reflected.meta["tidemesh_undecryptable"]
    theirs = base64.b64encode(seal(PEER, me_hex, "c1", b"once", "utf8")).decode()
    replayed = delivery_of(frame(to={"kind": "dm", "ref": me_hex}, body_encoding="base64",
                                 body=theirs, priority="next", client_message_id="c2"),
                           ME, "m", NOW)
    assert replayed.meta is not None and "replayed" in replayed.meta["tidemesh_undecryptable"]


def test_delivery_of_a_dm_that_does_not_open_is_kept_and_marked() -> None:
    d = delivery_of(frame(to={"kind": "dm", "ref": "x"}, body_encoding="base64",
                          body=base64.b64encode(b"not sealed").decode()), ME, "m", NOW)
    assert d.body == b"not sealed"
    assert d.meta is not None and "tidemesh_undecryptable" in d.meta
