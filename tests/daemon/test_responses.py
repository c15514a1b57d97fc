"""A send's outcome → its HTTP status and JSON body, decided without a server: the wire of
the 11-row accept table (docs/ipc.md), byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tidemesh.core.accept import TABLE, Action
from tidemesh.core.errors import IdempotencyConflict, InvalidRequest
from tidemesh.daemon.api.responses import batch_item, send_response
from tidemesh.daemon.records import BoundRow, SendKind, SendOutcome
from tidemesh.daemon.service.outbox import KINDS

CMID = "id-1"
NEW_ROW = BoundRow("01ROW", "pending", "aaaa")


def outcome(kind: SendKind, row: BoundRow = NEW_ROW, **kw: Any) -> SendOutcome:
    return SendOutcome(kind, CMID, "aaaa", row, **kw)


@pytest.mark.parametrize(("out", "status", "body"), [
    (outcome(SendKind.NEW, queue_status="queued"), 202,
     b'{"client_message_id":"id-1","outbox_id":"01ROW","status":"queued"}'),
    (outcome(SendKind.REPLAY, queue_status="queued"), 202,
     b'{"client_message_id":"id-1","outbox_id":"01ROW","status":"queued"}'),
    (outcome(SendKind.REPLAY, BoundRow("01ROW", "inflight", "aaaa"), queue_status="inflight"),
     202, b'{"client_message_id":"id-1","outbox_id":"01ROW","status":"inflight"}'),
    (outcome(SendKind.DUPLICATE, BoundRow("01ROW", "done", "aaaa", "B1", "H1"),
             queue_status="done"), 200,
     b'{"client_message_id":"id-1","outbox_id":"01ROW","status":"done","duplicate":true,'
     b'"broker_message_id":"B1","history_id":"H1"}'),
], ids=["new", "replay-pending", "replay-inflight", "duplicate"])
def test_send_response_of_an_accepted_send(out: SendOutcome, status: int, body: bytes) -> None:
    got_status, got_body = send_response(out)
    assert (got_status, orjson.dumps(got_body)) == (status, body)


def _conflict_body(out: SendOutcome) -> dict[str, Any]:
    with pytest.raises(IdempotencyConflict) as info:
        send_response(out)
    assert info.value.http_status == 409
    return info.value.to_body()


def test_send_response_of_a_conflict_is_the_409_envelope_naming_both_fingerprints() -> None:
    row = BoundRow("01ROW", "pending", "bbbb")
    body = _conflict_body(outcome(SendKind.CONFLICT, row,
                                  conflict="outbox_pending_fingerprint_mismatch"))
    assert orjson.dumps(body) == (
        b'{"error":{"code":"idempotency_key_reused","message":"client_message_id \'id-1\' is '
        b'already bound to outbox row 01ROW (pending); a 409 is final, send again under a new '
        b'id","conflict":"outbox_pending_fingerprint_mismatch","client_message_id":"id-1",'
        b'"outbox_id":"01ROW","daemon_fingerprint_prefix":"aaaa",'
        b'"stored_fingerprint_prefix":"bbbb"}}')


def test_send_response_of_a_done_mismatch_names_the_broker_message() -> None:
    row = BoundRow("01ROW", "done", "bbbb", "B1", "H1")
    err = _conflict_body(outcome(SendKind.CONFLICT, row, shows_broker_id=True,
                                 conflict="outbox_done_fingerprint_mismatch"))["error"]
    assert err["broker_message_id"] == "B1"
    assert "reason" not in err and "history_id" not in err


def test_send_response_of_a_dead_match_gives_the_reason_it_died() -> None:
    row = BoundRow("01ROW", "dead", "aaaa", last_error="broker_rejected: unknown topic")
    err = _conflict_body(outcome(SendKind.CONFLICT, row, shows_reason=True,
                                 conflict="outbox_dead_fingerprint_match"))["error"]
    assert list(err)[-1:] == ["reason"] and err["reason"] == "broker_rejected: unknown topic"
    assert "broker_message_id" not in err


# Spec §4.5.1: a new or in-progress id is 202, a finished match 200, everything else 409.
SPEC_STATUS = {Action.INSERT: 202, Action.ACCEPTED: 202, Action.DUPLICATE: 200,
               Action.CONFLICT: 409}


@pytest.mark.parametrize("key", list(TABLE), ids=[f"{s}-{m}" for s, m in TABLE])
def test_every_row_of_the_accept_table_gets_the_status_the_spec_gives_it(key: Any) -> None:
    row = TABLE[key]
    out = outcome(KINDS[row.action], queue_status=row.status, conflict=row.conflict,
                  shows_broker_id=row.with_broker_id, shows_reason=row.with_reason)
    try:
        status = send_response(out)[0]
    except IdempotencyConflict as exc:
        status = exc.http_status
    assert status == SPEC_STATUS[row.action]


@pytest.mark.parametrize("key", list(TABLE), ids=[f"{s}-{m}" for s, m in TABLE])
def test_batch_item_is_the_status_and_body_of_v1_send(key: Any) -> None:
    row = TABLE[key]
    out = outcome(KINDS[row.action], BoundRow("01ROW", "done", "bbbb", "B1", "H1", "gone"),
                  queue_status=row.status, conflict=row.conflict,
                  shows_broker_id=row.with_broker_id, shows_reason=row.with_reason)
    try:
        status, body = send_response(out)
    except IdempotencyConflict as exc:
        status, body = exc.http_status, exc.to_body()
    assert batch_item(out) == {"status": status, "body": body}


def test_batch_item_of_a_refused_send_is_its_error_envelope() -> None:
    err = InvalidRequest("to.ref: must be a name", field="to.ref")
    assert batch_item(err) == {"status": 400, "body": {"error": {
        "code": "invalid_request", "message": "to.ref: must be a name", "field": "to.ref"}}}
