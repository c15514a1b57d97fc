"""Every row of the accept table (spec §4.5.1) through real HTTP over the Unix socket.

States the broker would produce (inflight, done, dead) and the operator's aborted are set
up by writing the row's status into outbox.db directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon

BODY = {"to": {"kind": "topic", "ref": "ops"}, "body": "hello"}
OTHER = {"to": {"kind": "topic", "ref": "ops"}, "body": "a different body"}

SET_STATE = {
    "pending": None,
    "inflight": ("UPDATE outbox SET status='inflight' WHERE client_message_id=?",),
    "done": ("UPDATE outbox SET status='done', broker_message_id='B1', history_id='H1', "
             "delivered_at=1 WHERE client_message_id=?",),
    "dead": ("UPDATE outbox SET status='dead', last_error='broker_rejected: unknown topic' "
             "WHERE client_message_id=?",),
    "aborted": ("UPDATE outbox SET status='aborted', aborted_at=1, aborted_by='operator' "
                "WHERE client_message_id=?",),
}

# (state, same body?) -> (http status, body status or conflict code)
EXPECTED = {
    ("none", True): (202, "queued"),
    ("pending", True): (202, "queued"),
    ("pending", False): (409, "outbox_pending_fingerprint_mismatch"),
    ("inflight", True): (202, "inflight"),
    ("inflight", False): (409, "outbox_inflight_fingerprint_mismatch"),
    ("done", True): (200, "done"),
    ("done", False): (409, "outbox_done_fingerprint_mismatch"),
    ("dead", True): (409, "outbox_dead_fingerprint_match"),
    ("dead", False): (409, "outbox_dead_fingerprint_mismatch"),
    ("aborted", True): (409, "outbox_aborted_fingerprint_match"),
    ("aborted", False): (409, "outbox_aborted_fingerprint_mismatch"),
}


async def _post(d: RunningDaemon, body: dict[str, Any], key: str | None = None
                ) -> tuple[int, dict[str, Any]]:
    headers = {"Idempotency-Key": key} if key else {}
    async with d.session() as s, s.post("/v1/send", json=body, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(("state", "same"), list(EXPECTED),
                         ids=[f"{s}-{'match' if m else 'mismatch'}" for s, m in EXPECTED])
async def test_accept_table_row(daemon: RunningDaemon, state: str, same: bool) -> None:
    cid = f"id-{state}-{same}"
    if state != "none":
        status, _ = await _post(daemon, {**BODY, "client_message_id": cid})
        assert status == 202
        stmt = SET_STATE[state]
        if stmt:
            daemon.sql(stmt[0], cid)
    before = daemon.outbox_rows()
    status, body = await _post(daemon, {**(BODY if same else OTHER), "client_message_id": cid})
    want_status, want = EXPECTED[(state, same)]
    assert status == want_status, body
    after = daemon.outbox_rows()
    if status == 409:
        err = body["error"]
        assert err["code"] == "idempotency_key_reused"
        assert err["conflict"] == want
        assert len(err["daemon_fingerprint_prefix"]) == 16
        assert after == before, "a 409 must not change the outbox"
        if state == "done":
            assert err["broker_message_id"] == "B1"
        if state == "dead" and same:
            assert err["reason"] == "broker_rejected: unknown topic"
    else:
        assert body["status"] == want and body["client_message_id"] == cid
        assert len(after) == 1 and after[0]["client_message_id"] == cid
        assert body["outbox_id"] == after[0]["id"]
        if state != "none":
            assert after == before, "a repeat must not mutate the row"
        if state == "done":
            assert body["duplicate"] is True
            assert (body["broker_message_id"], body["history_id"]) == ("B1", "H1")


async def test_header_id_is_used_when_the_body_has_none(daemon: RunningDaemon) -> None:
    status, body = await _post(daemon, BODY, key="from-header")
    assert (status, body["client_message_id"]) == (202, "from-header")


async def test_header_and_body_id_agreeing_is_fine(daemon: RunningDaemon) -> None:
    status, _ = await _post(daemon, {**BODY, "client_message_id": "same"}, key="same")
    assert status == 202
    assert [r["client_message_id"] for r in daemon.outbox_rows()] == ["same"]


async def test_header_and_body_id_differing_is_400_and_stores_nothing(
    daemon: RunningDaemon,
) -> None:
    status, body = await _post(daemon, {**BODY, "client_message_id": "a"}, key="b")
    assert status == 400
    assert body["error"]["code"] == "idempotency_key_mismatch"
    assert daemon.outbox_rows() == []


async def test_no_id_mints_a_ulid_per_send(daemon: RunningDaemon) -> None:
    s1, b1 = await _post(daemon, BODY)
    s2, b2 = await _post(daemon, BODY)
    assert s1 == s2 == 202
    assert b1["client_message_id"] != b2["client_message_id"]
    assert len(b1["client_message_id"]) == 26
    assert len(daemon.outbox_rows()) == 2


async def test_accepted_row_holds_the_frozen_fingerprint_and_payload(
    daemon: RunningDaemon,
) -> None:
    from tidemesh.core.fingerprint import request_fingerprint

    await _post(daemon, {**BODY, "meta": {"b": 1, "a": [1, 2]}, "priority": "now"}, key="k1")
    (row,) = daemon.outbox_rows()
    assert row["request_fingerprint"] == request_fingerprint(
        "topic", "ops", b"hello", "now", {"a": [1, 2], "b": 1}
    )
    assert (row["status"], row["dest_kind"], row["dest_ref"]) == ("pending", "topic", "ops")
