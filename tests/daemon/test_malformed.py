"""Bad input gets a 4xx in the one error shape, writes no outbox row, and leaves the id free."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.daemon.harness import RunningDaemon
from tidemesh.daemon.api.validation import load_schema

ERROR_SCHEMA = load_schema("error.schema.json")
PUB = "ab" * 32
OK = {"to": {"kind": "topic", "ref": "ops"}, "body": "hello"}

# (name, raw body bytes or JSON value, extra headers, expected status, field expected or None)
CASES: list[tuple[str, Any, dict[str, str], int]] = [
    ("empty body", b"", {}, 400),
    ("not json", b"{to: topic}", {}, 400),
    ("truncated json", b'{"to": {"kind": "topic"', {}, 400),
    ("json array", [OK], {}, 400),
    ("json string", "hello", {}, 400),
    ("json null", None, {}, 400),
    ("missing to", {"body": "x"}, {}, 400),
    ("missing body", {"to": "topic:ops"}, {}, 400),
    ("unknown kind", {"to": {"kind": "broadcast", "ref": "x"}, "body": "x"}, {}, 400),
    ("to is a number", {"to": 5, "body": "x"}, {}, 400),
    ("to missing ref", {"to": {"kind": "topic"}, "body": "x"}, {}, 400),
    ("short form without kind", {"to": "opsroom", "body": "x"}, {}, 400),
    ("dm to a non-key", {"to": {"kind": "dm", "ref": "bob"}, "body": "x"}, {}, 400),
    ("dm to 64 hex that is no curve point", {"to": "dm:" + "0" * 64, "body": "x"}, {}, 400),
    ("short form with a newline", {"to": "topic:ops\n", "body": "x"}, {}, 400),
    ("topic name with spaces", {"to": {"kind": "topic", "ref": "a b"}, "body": "x"}, {}, 400),
    ("body is an object", {"to": "topic:ops", "body": {"text": "x"}}, {}, 400),
    ("body is a number", {"to": "topic:ops", "body": 12}, {}, 400),
    ("bad base64", {"to": "topic:ops", "body": "***", "body_encoding": "base64"}, {}, 400),
    ("unknown encoding", {"to": "topic:ops", "body": "x", "body_encoding": "hex"}, {}, 400),
    ("bad priority", {"to": "topic:ops", "body": "x", "priority": "urgent"}, {}, 400),
    ("meta is a list", {"to": "topic:ops", "body": "x", "meta": [1]}, {}, 400),
    ("meta int beyond 2^53", {"to": "topic:ops", "body": "x", "meta": {"n": 2**60}}, {}, 400),
    ("reply_to not a ulid", {"to": "topic:ops", "body": "x", "reply_to": "msg-1"}, {}, 400),
    ("unknown field", {"to": "topic:ops", "body": "x", "colour": "red"}, {}, 400),
    ("id too long", {**OK, "client_message_id": "x" * 256}, {}, 400),
    ("id empty", {**OK, "client_message_id": ""}, {}, 400),
    ("id with non-ascii", {**OK, "client_message_id": "café"}, {}, 400),
    ("id with a control char", {**OK, "client_message_id": "a\u0001b"}, {}, 400),
    ("id is a number", {**OK, "client_message_id": 7}, {}, 400),
    ("header id and body id differ", {**OK, "client_message_id": "a"},
     {"Idempotency-Key": "b"}, 400),
    ("lone surrogate in body", b'{"to": "topic:ops", "body": "\\ud800"}', {}, 400),
    ("oversized body", {"to": "topic:ops", "body": "x" * (1024 * 1024 + 10)}, {}, 413),
]


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


@pytest.mark.parametrize(("name", "value", "headers", "status"), CASES,
                         ids=[c[0] for c in CASES])
async def test_malformed_request_is_refused_cleanly(
    daemon: RunningDaemon, name: str, value: Any, headers: dict[str, str], status: int
) -> None:
    cid = "free-after-" + name.replace(" ", "-")[:40]
    async with daemon.session() as s:
        async with s.post("/v1/send", data=_raw(value),
                          headers={"Content-Type": "application/json", **headers}) as r:
            assert r.status == status
            body = await r.json()
        jsonschema.validate(body, ERROR_SCHEMA)
        assert daemon.outbox_rows() == []
        # The id was not consumed: the same id with a good body is accepted as new.
        async with s.post("/v1/send", json={**OK, "client_message_id": cid}) as r:
            assert r.status == 202
            assert (await r.json())["status"] == "queued"
    assert [row["client_message_id"] for row in daemon.outbox_rows()] == [cid]


def test_there_are_at_least_25_distinct_cases() -> None:
    assert len({c[0] for c in CASES}) >= 25


async def test_schema_errors_name_the_failing_field(daemon: RunningDaemon) -> None:
    async with daemon.session() as s, s.post(
        "/v1/send", json={"to": {"kind": "mail", "ref": "x"}, "body": "x"}
    ) as r:
        err = (await r.json())["error"]
    assert r.status == 400 and err["code"] == "invalid_request" and err["field"].startswith("to")
    async with daemon.session() as s, s.post("/v1/send", json={"to": "ops", "body": "x"}) as r:
        err = (await r.json())["error"]
    assert (r.status, err["field"]) == (400, "to")
    assert "topic:NAME | dm:MEMBER | queue:NAME" in err["message"], "says what it takes"
    async with daemon.session() as s, s.post(
        "/v1/send", json={"to": "topic:ops", "body": "x", "priority": "urgent"}
    ) as r:
        assert (await r.json())["error"]["field"] == "priority"


async def test_unknown_route_and_wrong_method_use_the_error_shape(daemon: RunningDaemon) -> None:
    async with daemon.session() as s:
        async with s.get("/v1/nope") as r:
            assert r.status == 404
            jsonschema.validate(await r.json(), ERROR_SCHEMA)
        async with s.get("/v1/send") as r:
            assert r.status == 405
            jsonschema.validate(await r.json(), ERROR_SCHEMA)
        # Not a lookup of an outbox row named "requeue": that path only takes POST.
        async with s.get("/v1/outbox/requeue") as r:
            assert (r.status, r.headers["Allow"]) == (405, "POST")
            jsonschema.validate(await r.json(), ERROR_SCHEMA)


@pytest.mark.parametrize("path", ["/v1/outbox/prune", "/v1/inbox/prune"])
async def test_a_prune_body_is_json_or_nothing(daemon: RunningDaemon, path: str) -> None:
    """No body means the defaults; a body that is only whitespace is not JSON (schemathesis
    found it answered 200, and a real prune, where it should have been 400)."""
    async with daemon.session() as s:
        async with s.post(path, data=b"\n\n",
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            jsonschema.validate(await r.json(), ERROR_SCHEMA)
        async with s.post(path, data=b"") as r:
            assert r.status == 200
            assert (await r.json())["dry_run"] is False
