"""Property tests of the accept path against a real daemon process (hypothesis).

For any sequence of sends over a few keys and bodies, the answers follow the idempotency
table: the first use of a key is 202, the same request again is 202/200, another request under
that key is a 409 that changes nothing, and the outbox holds one row per key, with the request
first accepted under it. Bodies and keys that break the rules are 400s that store nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon.harness import RunningDaemon, start_daemon
from tidemesh.client import Client
from tidemesh.core.errors import TidemeshError


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    home = Path(tempfile.mkdtemp(prefix="tm-hp-", dir="/tmp"))
    d = start_daemon(home)
    try:
        yield d
        assert d.stop() == 0
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


def _send(client: Client, key: str, body: str, topic: str) -> int:
    try:
        resp = client.request("POST", "/v1/send", {"to": f"topic:{topic}", "body": body},
                              headers={"Idempotency-Key": key})
    except TidemeshError as exc:
        return exc.http_status
    return resp.status


def _rows(d: RunningDaemon, prefix: str) -> dict[str, bytes]:
    conn = sqlite3.connect(f"file:{d.paths.outbox_db}?mode=ro", uri=True)
    try:
        return {k: p for k, p in conn.execute(
            "SELECT client_message_id, payload FROM outbox WHERE client_message_id LIKE ?",
            (prefix + "%",))}
    finally:
        conn.close()


requests = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "ü€", ""]),
                              st.sampled_from(["ops", "dev"])), min_size=1, max_size=15)


@given(requests)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_answers_follow_the_idempotency_table(daemon: RunningDaemon,
                                              seq: list[tuple[int, str, str]]) -> None:
    client = Client(daemon.paths.socket)
    prefix = uuid.uuid4().hex[:12]
    first: dict[str, tuple[str, str]] = {}
    for k, body, topic in seq:
        key = f"{prefix}-{k}"
        status = _send(client, key, body, topic)
        if key not in first:
            assert status == 202
            first[key] = (body, topic)
        elif first[key] == (body, topic):
            assert status in (200, 202)
        else:
            assert status == 409
    rows = _rows(daemon, prefix)
    assert set(rows) == set(first)
    for key, payload in rows.items():
        stored = json.loads(payload)
        assert (stored["body"], stored["to"]["ref"]) == first[key], "a 409 changed the row"


bad_keys = st.one_of(st.just(""), st.text(min_size=256, max_size=300),
                     st.text(alphabet=st.characters(max_codepoint=31), min_size=1, max_size=5),
                     st.text(alphabet="é\u2028\x7f", min_size=1, max_size=5))


@given(bad_keys)
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_bad_client_message_id_is_400_and_stores_nothing(daemon: RunningDaemon,
                                                           key: str) -> None:
    client = Client(daemon.paths.socket)
    before = len(_rows(daemon, ""))
    with pytest.raises(TidemeshError) as info:
        client.request("POST", "/v1/send", {"to": "topic:ops", "body": "x",
                                            "client_message_id": key})
    assert info.value.http_status == 400
    assert len(_rows(daemon, "")) == before


def _answer(client: Client, item: dict[str, Any]) -> tuple[int, Any]:
    try:
        resp = client.request("POST", "/v1/send", item)
    except TidemeshError as exc:
        return exc.http_status, exc.to_body()
    return resp.status, resp.body


def _named_alike(answers: list[tuple[int, Any]], prefix: str) -> list[tuple[int, Any]]:
    """Each answer with the key space's prefix dropped and row ids numbered by appearance."""
    names: dict[str, str] = {}
    text = json.dumps(answers).replace(prefix, "K")
    return [tuple(a) for a in json.loads(re.sub(
        r"[0-9A-HJKMNP-TV-Z]{26}", lambda m: names.setdefault(m.group(0), f"r{len(names)}"),
        text))]


items = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", ""]),
                           st.sampled_from(["ops", "dev", "bad name"])), min_size=1,
                 max_size=20)


@given(items)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_a_batch_is_answered_as_its_sends_one_at_a_time(
        daemon: RunningDaemon, seq: list[tuple[int, str, str]]) -> None:
    client = Client(daemon.paths.socket)
    one, many = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]

    def item(prefix: str, k: int, body: str, topic: str) -> dict[str, Any]:
        return {"to": f"topic:{topic}", "body": body, "client_message_id": f"{prefix}-{k}"}

    alone = [_answer(client, item(one, *x)) for x in seq]
    results = client.send_many([item(many, *x) for x in seq])
    batched = [(r["status"], r["body"]) for r in results]
    assert _named_alike(batched, many) == _named_alike(alone, one)
