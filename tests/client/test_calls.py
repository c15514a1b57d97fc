"""What each call asks, and how an answer becomes a result or a ``core.errors`` class."""

from __future__ import annotations

import json

import pytest

from tidemesh.client import calls
from tidemesh.core import errors


def _error(status: int, code: str, **details: object) -> bytes:
    return json.dumps({"error": {"code": code, "message": "no", **details}}).encode()


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "invalid_request", errors.InvalidRequest),
    (400, "idempotency_key_mismatch", errors.IdempotencyKeyMismatch),
    (401, "unauthorized", errors.Unauthorized),
    (403, "forbidden", errors.Forbidden),
    (404, "unknown_destination", errors.UnknownDestination),
    (409, "idempotency_key_reused", errors.IdempotencyConflict),
    (413, "payload_too_large", errors.PayloadTooLarge),
    (429, "daemon_busy", errors.Busy),
    (503, "unavailable", errors.Unavailable),
    (507, "insufficient_storage", errors.InsufficientStorage),
])
def test_error_bodies_become_their_error_class(status: int, code: str,
                                               cls: type[errors.TidemeshError]) -> None:
    with pytest.raises(cls) as caught:
        calls.version().answer(status, "application/json", _error(status, code, field="to"))
    assert type(caught.value) is cls and caught.value.details == {"field": "to"}


def test_an_unknown_code_keeps_its_code_and_status() -> None:
    with pytest.raises(errors.TidemeshError) as caught:
        calls.health().answer(418, "application/json", _error(418, "teapot"))
    assert caught.value.details == {"code": "teapot", "status": 418}


def test_a_2xx_is_read_as_the_calls_result() -> None:
    body = {"client_message_id": "k", "outbox_id": "o", "status": "queued"}
    call = calls.send({"to": "topic:ops", "body": "x"}, "k")
    assert call.answer(202, "application/json; charset=utf-8", json.dumps(body).encode()) == body
    assert calls.metrics().answer(200, "text/plain", b"cm_x 1\n") == "cm_x 1\n"


def test_send_carries_the_idempotency_key_as_a_header() -> None:
    call = calls.send({"to": "topic:ops", "body": "x"}, "job-7")
    assert (call.method, call.path, call.headers) == (
        "POST", "/v1/send", {"Idempotency-Key": "job-7"})
    assert json.loads(call.payload() or b"") == {"to": "topic:ops", "body": "x"}
    assert calls.send({"body": "x"}, None).headers == {}


def test_queries_name_only_what_was_given_and_are_escaped() -> None:
    assert calls.inbox(None, 100, "a b", "ab" * 32, None).path == (
        f"/v1/inbox?limit=100&topic=a%20b&from={'ab' * 32}")
    assert calls.inbox(None, 10, None, None, "w/1").path == "/v1/inbox?limit=10&consumer=w%2F1"
    assert calls.inbox(4, 10, None, None, None, '"disk full" OR db*').path == (
        "/v1/inbox?after=4&limit=10&q=%22disk%20full%22%20OR%20db%2A")
    assert calls.outbox_inspect("x/../y").path == "/v1/outbox/x%2F..%2Fy"
    assert calls.membership("queue", "consume", "jobs", True).path == "/v1/queues/consume"
    assert calls.membership("queue", "consume", "jobs", True).body == {
        "name": "jobs", "create": True}
