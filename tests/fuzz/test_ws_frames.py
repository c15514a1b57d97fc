"""A fuzzer of WebSocket frames against a real broker process (hypothesis).

An authenticated member sends generated frames: junk, frames of every known type with random
fields, and send frames with one field mutated. The broker must answer or close politely (an
error frame, or 1008 after a flood), never close with 1011 or die, and a frame it refused must
leave no row: the dedupe rows always equal the 201 answers the member got.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.e2e.harness import Broker
from tidemesh.core import features, handshake
from tidemesh.core.paths import daemon_paths
from tidemesh.core.wire import FrameType
from tidemesh.daemon.link.websocket import BrokerLink
from tidemesh.daemon.membership.identity import load_or_create_keypair
from tidemesh.daemon.membership.join import MeshConfig


@dataclass
class Target:
    broker: Broker
    db: Path
    mesh_id: str
    key: SigningKey
    created: int = 0  # 201 answers seen so far
    # Sends the broker had taken when it closed the connection: each may commit later, with
    # no answer to count. Kept as a running bound, because a loaded writer can commit one
    # long after the close.
    unanswered: int = 0


async def _make_topic(url: str, mesh_id: str, key: SigningKey) -> None:
    async with await BrokerLink.connect(url, mesh_id, key) as link:
        await link.request("topic_create", "ops")
        await link.request("topic_subscribe", "ops")


@pytest.fixture(scope="module")
def target(joined: tuple[Broker, Path]) -> Iterator[Target]:
    broker, home = joined
    paths = daemon_paths("t", {"TIDEMESH_HOME": str(home)})
    key, _ = load_or_create_keypair(paths.keypair)
    mesh_id = MeshConfig.load(paths.mesh_file).mesh_id
    asyncio.run(_make_topic(broker.url, mesh_id, key.signing_key))
    t = Target(broker, broker.home / "broker.db", mesh_id, key.signing_key)
    yield t
    print(f"ws fuzz: {t.created} generated sends accepted, {t.unanswered} sends left "
          "unanswered by a close")


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4)
                          | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


# A generated send's frame id until `_numbered` gives it the send's place in the batch.
UNNUMBERED = "#"


def _valid_send(i: int) -> dict[str, Any]:
    return {"type": "send", "id": UNNUMBERED, "client_message_id": f"fz-{i}",
            "to": {"kind": "topic", "ref": "ops"}, "body": "hello", "body_encoding": "utf8",
            "priority": "next"}


@st.composite
def mutated_send(draw: st.DrawFn) -> dict[str, Any]:
    frame = _valid_send(draw(st.integers(0, 10**9)))
    field = draw(st.sampled_from([*frame, "meta", "reply_to", "extra"]))
    if draw(st.booleans()) and field in frame:
        del frame[field]
    else:
        frame[field] = draw(json_value)
    return frame


typed_junk = st.builds(lambda t, rest: {"type": t, **rest},
                       st.sampled_from([t.value for t in FrameType] + ["nope", ""]),
                       st.dictionaries(st.sampled_from(["id", "to", "body", "sends", "epoch",
                                                        "seq", "op", "name", "nonce"]),
                                       json_value, max_size=5))
# Valid sends over a small key space, with the body sometimes changed: 201, 200 duplicate and
# 409 all happen, and only the 201s may add a row.
valid_send = st.builds(lambda i, body: {**_valid_send(i), "body": body},
                       st.integers(0, 40), st.sampled_from(["hello", "changed"]))


def _numbered(batch: list[Any]) -> list[Any]:
    """Each generated send gets its place in the batch as its frame id. A mutated frame that
    is no send any more is still answered under its id (an error), and if a send still on its
    way had the same id, that answer would stand for the send's: the drain would stop before
    the send committed, and its row would land uncounted in a later example."""
    return [{**f, "id": f"s{p}"} if isinstance(f, dict) and f.get("id") == UNNUMBERED else f
            for p, f in enumerate(batch)]


# Deep nesting and numeric edges, as frame text written by hand (json.dumps recurses, and
# cannot write 1e400). None of them may be a send the broker accepts: a send's meta is
# nested past its limit (core/jsonbounds.META_DEPTH), so each is refused.
NUMBER_LITERALS = ["0", "-0", "-1", "1.5", "1e400", "-1e400", "9" * 20, "9" * 5000,
                   "18446744073709551616", "-9223372036854775809", str(2**63)]


def deep_text(depth: int, kind: str) -> str:
    if kind == "[":
        return "[" * depth + "1" + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


_SEND = ('"client_message_id": "deep", "to": {"kind": "topic", "ref": "ops"}, "body": "x", '
         '"body_encoding": "utf8", "priority": "next", "meta": ')
EDGE_TEMPLATES = [
    '{"type": "send", "id": "deep", ' + _SEND + "@}",
    '{"type": "send_batch", "id": "deepb", "sends": [{' + _SEND + "@}]}",
    '{"type": "ack", "epoch": #, "seq": #}',
    '{"type": "resume", "id": "r", "epoch": #, "last_seq": #}',
    '{"type": "peers", "id": "p", "x": #}',
    '{"type": "request", "id": "q", "op": "topic_list", "name": #}',
]
edge_value = st.one_of(st.builds(deep_text, st.integers(1, 1100), st.sampled_from(["[", "{"])),
                       st.sampled_from(NUMBER_LITERALS))
edge_frame = st.builds(
    lambda t, meta, v: t.replace("@", meta).replace("#", v),
    st.sampled_from(EDGE_TEMPLATES),
    st.builds(deep_text, st.integers(33, 1100), st.sampled_from(["[", "{"])).map(
        lambda m: '{"m": ' + m + "}"),
    edge_value)

frames = st.lists(st.one_of(valid_send, mutated_send(), typed_junk, json_value.map(json.dumps),
                            st.binary(max_size=64), st.text(max_size=64), edge_frame),
                  min_size=1, max_size=12).map(_numbered)


def _hello(ws: ClientConnection, t: Target) -> None:
    nonce = json.loads(ws.recv(timeout=10))["nonce"]
    pk, sig = handshake.sign(t.key, t.mesh_id, nonce)
    ws.send(json.dumps({"type": "hello", "mesh_id": t.mesh_id, "pubkey": pk, "nonce": nonce,
                        "signature": sig}))
    assert json.loads(ws.recv(timeout=10))["type"] == "hello_ack"
    ws.send(json.dumps({"type": "feature_negotiation_request", "id": "f",
                        "require": list(features.REQUIRED), "optional": []}))
    assert json.loads(ws.recv(timeout=10))["type"] == "feature_negotiation_response"


def _created(frame: dict[str, Any]) -> int:
    if frame.get("type") == "send_result":
        return int(frame.get("status") == 201)
    if frame.get("type") == "send_results":
        return sum(r.get("status") == 201 for r in frame.get("results", []))
    return 0


def _strict_json(frame: dict[str, Any]) -> bool:
    """json.dumps writes an infinite float as `Infinity`, which is not JSON: the broker cannot
    read such a frame, so it cannot echo its id either (it answers an error without one)."""
    try:
        json.dumps(frame, allow_nan=False)
    except ValueError:
        return False
    return True


def _awaited(batch: list[Any]) -> Counter[str]:
    """The ids of the send frames the broker will answer (one answer per id)."""
    ids: Counter[str] = Counter()
    for frame in batch:
        if (isinstance(frame, dict) and frame.get("type") in ("send", "send_batch")
                and isinstance(frame.get("id"), str) and 0 < len(frame["id"]) <= 64
                and _strict_json(frame)):
            ids[frame["id"]] += 1
    return ids


# What a send frame is answered with; other frames' answers never stand for a send's.
_SEND_ANSWERS = ("send_result", "send_results", "error")


def _drain(ws: ClientConnection, pending: Counter[str]) -> tuple[int, int | None, int]:
    """Read until every send was answered and the probe came back (or the broker closed);
    returns (201s seen, close code, send frames left unanswered). Sends are answered when
    committed, in any order."""
    created = 0
    pending["probe"] += 1
    with contextlib.suppress(ConnectionClosed):
        ws.send(json.dumps({"type": "peers", "id": "probe"}))
        while +pending:
            frame = json.loads(ws.recv(timeout=30))
            created += _created(frame)
            answer = frame.get("type") in _SEND_ANSWERS or frame.get("id") == "probe"
            if answer and isinstance(frame.get("id"), str) and pending[frame["id"]] > 0:
                pending[frame["id"]] -= 1
        return created, None, 0
    pending["probe"] = 0
    return created, ws.close_code, sum(pending.values())


def _dedupe_rows(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM client_message_dedupe").fetchone()[0])
    finally:
        conn.close()


# `make fuzz` raises this for the long run (scripts/fuzz.py); the suite keeps it short.
EXAMPLES = int(os.environ.get("TIDEMESH_FUZZ_EXAMPLES", "120"))


@given(batch=frames)
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_the_broker_survives_any_frame_and_stores_only_what_it_accepted(
    target: Target, batch: list[Any],
) -> None:
    before = _dedupe_rows(target.db)
    with connect(target.broker.url, max_size=None) as ws:
        _hello(ws, target)
        with contextlib.suppress(ConnectionClosed):
            for frame in batch:
                ws.send(json.dumps(frame) if isinstance(frame, dict) else frame)
        created, close_code, unanswered = _drain(ws, _awaited(batch))
    assert close_code in (None, 1000, 1008), f"the broker closed with {close_code}"
    target.created += created
    target.unanswered += unanswered
    # Counted per example, so that a failure shrinks to the batch that caused it. A send
    # already accepted when the broker closed a connection (too many bad frames) still
    # commits, maybe only during a later example; its answer has nowhere to go (a daemon's
    # retry gets 200 duplicate). Such rows are bounded by every send a close left
    # unanswered so far, never by refused frames.
    added = _dedupe_rows(target.db) - before
    assert created <= added <= created + target.unanswered, "a refused frame left a row"


# Before the handshake: a hello or join with a deep or odd field, or any edge frame.
_HELLO = ('{"type": "hello", "mesh_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "pubkey": "' + "a" * 64
          + '", "nonce": "' + "b" * 64 + '", "signature": "' + "c" * 128 + '", ')
unauthenticated = st.one_of(
    st.builds(lambda v: _HELLO + '"daemon_version": ' + v + "}", edge_value),
    st.builds(lambda v: '{"type": "join", "invite_token": ' + v + "}", edge_value),
    edge_frame, st.text(max_size=64))


@given(first=unauthenticated)
@settings(max_examples=max(EXAMPLES // 4, 20), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_an_unauthenticated_frame_is_refused_politely(target: Target, first: str) -> None:
    with connect(target.broker.url, max_size=None) as ws:
        ws.recv(timeout=10)  # the challenge
        try:
            ws.send(first)
            answer = json.loads(ws.recv(timeout=10))
        except ConnectionClosed:
            assert ws.close_code in (1008, 1009), f"the broker closed with {ws.close_code}"
            return
        assert answer["type"] == "error", answer
