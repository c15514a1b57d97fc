"""Session addresses, what a session is shown, channel meta and receipts (core/agents)."""

from __future__ import annotations

import pytest

from tidemesh.core import agents
from tidemesh.core.errors import InvalidRequest

KEY = "ab" * 32


def _dm(meta: dict[str, object] | None, **extra: object) -> dict[str, object]:
    return {"seq": 3, "from": "cd" * 32, "to": {"kind": "dm", "ref": KEY}, "meta": meta,
            "body": "hi", "broker_message_id": "m1", "client_message_id": "c1",
            "priority": "next", **extra}


def test_a_session_address_names_a_member_key_and_a_session() -> None:
    addr = agents.parse_session_address(f"session:{KEY}/beta")
    assert addr == agents.SessionAddress(KEY, "beta") and str(addr) == f"session:{KEY}/beta"
    assert agents.parse_session_address("topic:ops") is None
    for bad in ("session:zz/beta", f"session:{KEY}", f"session:{KEY}/bad name"):
        with pytest.raises(InvalidRequest):
            agents.parse_session_address(bad)


def test_the_default_session_name_is_the_folder_made_valid() -> None:
    assert agents.session_name_for("/home/me/my project!") == "my-project"
    assert agents.session_name_for("/") == "session"


def test_a_session_is_shown_its_own_dms_and_the_members_but_no_receipt() -> None:
    assert agents.for_session(_dm({agents.SESSION_KEY: "beta"}), "beta")
    assert not agents.for_session(_dm({agents.SESSION_KEY: "other"}), "beta")
    assert agents.for_session(_dm(None), "beta")
    receipt = _dm({agents.RECEIPT_KEY: {"of": "m0", "state": "read"}})
    assert not agents.for_session(receipt, "beta")
    assert agents.receipt_of(receipt) == {"of": "m0", "state": "read"}


def test_channel_meta_holds_strings_only() -> None:
    meta = agents.channel_meta(_dm({agents.FROM_SESSION_KEY: "alpha", "n": 5}), "team")
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["from_session"] == f"session:{'cd' * 32}/alpha" and meta["seq"] == "3"


def test_a_receipt_has_one_key_per_message_state_and_session() -> None:
    msg, key = agents.receipt_send(_dm(None), "read", "beta")
    assert key == "receipt-read-m1-beta" and msg["to"] == f"dm:{'cd' * 32}"
    assert agents.wants_receipt(_dm(None), KEY)
    assert not agents.wants_receipt(_dm({agents.RECEIPT_KEY: {"of": "x", "state": "read"}}),
                                    KEY)


def test_a_receipt_view_takes_the_furthest_state_per_recipient() -> None:
    row = {"id": "o1", "status": "done", "broker_message_id": "m1"}
    assert agents.receipt_view(row, [])["state"] == "at_broker"
    view = agents.receipt_view(row, [{"from": "k", "session": "b", "state": "read"},
                                     {"from": "k", "session": "b", "state": "delivered"}])
    assert view["state"] == "read" and view["recipients"] == {"k/b": "read"}


def test_a_new_session_is_spared_its_members_history_but_not_its_own_mail() -> None:
    old_topic = {"to": {"kind": "topic", "ref": "ops"}, "meta": None, "received_at": 5}
    new_topic = {**old_topic, "received_at": 20}
    waited = _dm({agents.SESSION_KEY: "beta"}, received_at=5)
    assert not agents.for_session(old_topic, "beta", since_ms=10)
    assert agents.for_session(new_topic, "beta", since_ms=10)
    assert agents.for_session(waited, "beta", since_ms=10)
