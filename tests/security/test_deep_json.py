"""Deep JSON at every parse (issue 31, items 2 and 5; core/jsonbounds).

A body or frame nested 1,000 deep is 2 KB: it must be refused with the usual 4xx or error
frame at once, never a 500 or a 1011, and must leave the log small and free of tokens (the
tracebacks of old carried every frame's locals, the local token among them).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.daemon.harness import RunningDaemon, start_daemon
from tests.e2e.harness import Broker
from tests.fuzz.conftest import joined  # noqa: F401 - the broker fixture
from tidemesh.broker.service.delivery import deliver_frame
from tidemesh.broker.store.base import DeliveryRow
from tidemesh.core import handshake, hooks, wire
from tidemesh.core.paths import daemon_paths
from tidemesh.daemon.membership.identity import load_or_create_keypair
from tidemesh.daemon.membership.join import MeshConfig

DEEP = 1000
# What one refused request may add to a log: a line or two, never a traceback per level.
LOG_BUDGET = 8 * 1024


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_send(depth: int = DEEP) -> bytes:
    """A send whose meta nests ``depth`` deep, written by hand: json.dumps recurses."""
    return (b'{"to": "topic:ops", "body": "x", "meta": ' + b'{"a": ' * depth + b"1"
            + b"}" * depth + b"}")


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    d = start_daemon(short_tmp)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def _post(s: aiohttp.ClientSession, url: str, body: bytes,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with s.post(url, data=body, headers={"Content-Type": "application/json",
                                               **(headers or {})},
                      timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.json()


async def test_a_1000_deep_meta_is_400_on_both_transports_and_the_log_stays_small(
    daemon: RunningDaemon,
) -> None:
    before = _size(daemon.log)
    async with daemon.session() as s:
        status, body = await _post(s, "/v1/send", deep_send())
        assert (status, body["error"]["code"]) == (400, "invalid_request"), body
        status, body = await _post(s, "/v1/send_batch",
                                   b'{"sends": [' + deep_send() + b"]}")
        assert (status, body["error"]["code"]) == (400, "invalid_request"), body
    async with aiohttp.ClientSession() as s:
        status, body = await _post(s, f"http://127.0.0.1:{daemon.port}/v1/send", deep_send(),
                                   {"Authorization": f"Bearer {daemon.token}"})
        assert (status, body["error"]["code"]) == (400, "invalid_request"), body
    async with daemon.session() as s, s.get("/v1/health") as r:
        assert r.status == 200  # the daemon is fine
    grown = daemon.log.read_bytes()[before:]
    assert len(grown) <= LOG_BUDGET, grown[:2000]
    assert daemon.token.encode() not in grown
    assert daemon.outbox_rows() == []


async def test_meta_deeper_than_its_limit_is_400_even_in_a_shallow_body(
    daemon: RunningDaemon,
) -> None:
    async with daemon.session() as s:
        status, body = await _post(s, "/v1/send", deep_send(40))
        assert (status, body["error"]["field"]) == (400, "meta"), body
        status, body = await _post(s, "/v1/send", deep_send(32))
        assert status == 202, body


# --- the broker ------------------------------------------------------------------------


def _member(home: Path) -> tuple[str, Any]:
    paths = daemon_paths("t", {"TIDEMESH_HOME": str(home)})
    key, _ = load_or_create_keypair(paths.keypair)
    return MeshConfig.load(paths.mesh_file).mesh_id, key.signing_key


def _deep_frame(kind: str, depth: int = DEEP) -> str:
    tail = "}" * depth
    if kind == "hello":
        return '{"type": "hello", "daemon_version": ' + '{"a": ' * depth + "1" + tail + "}"
    return ('{"type": "send", "id": "deep", "client_message_id": "deep-1", "to": '
            '{"kind": "topic", "ref": "ops"}, "body": "x", "body_encoding": "utf8", '
            '"priority": "next", "meta": ' + '{"a": ' * depth + "1" + tail + "}")


def _hello(ws: ClientConnection, mesh_id: str, key: Any) -> None:
    nonce = json.loads(ws.recv(timeout=10))["nonce"]
    pk, sig = handshake.sign(key, mesh_id, nonce)
    ws.send(json.dumps({"type": "hello", "mesh_id": mesh_id, "pubkey": pk, "nonce": nonce,
                        "signature": sig}))
    assert json.loads(ws.recv(timeout=10))["type"] == "hello_ack"


def _broker_log(broker: Broker) -> Path:
    return broker.home / "broker.out"


def test_a_members_1000_deep_send_frame_gets_an_error_frame_and_a_small_log(
    joined: tuple[Broker, Path],  # noqa: F811
) -> None:
    broker, home = joined
    mesh_id, key = _member(home)
    before = _size(_broker_log(broker))
    with connect(broker.url, max_size=None) as ws:
        _hello(ws, mesh_id, key)
        for _ in range(3):
            ws.send(_deep_frame("send"))
            answer = json.loads(ws.recv(timeout=10))
            assert answer["type"] in ("error", "send_result"), answer
            code = (answer["error"]["code"] if answer["type"] == "error"
                    else answer["status"])
            assert code in ("invalid_frame", 400), answer
        ws.send(json.dumps({"type": "peers", "id": "probe"}))
        assert json.loads(ws.recv(timeout=10))["id"] == "probe"  # the connection lives on
    grown = _broker_log(broker).read_bytes()[before:]
    assert len(grown) <= LOG_BUDGET, grown[:2000]


def test_an_unauthenticated_1000_deep_hello_gets_an_error_frame_and_a_small_log(
    joined: tuple[Broker, Path],  # noqa: F811
) -> None:
    broker, _ = joined
    before = _size(_broker_log(broker))
    for _ in range(3):
        with connect(broker.url, max_size=None) as ws:
            json.loads(ws.recv(timeout=10))  # the challenge
            ws.send(_deep_frame("hello"))
            answer = json.loads(ws.recv(timeout=10))
            assert answer["type"] == "error", answer
            assert answer["error"]["code"] == "invalid_frame", answer
    grown = _broker_log(broker).read_bytes()[before:]
    assert len(grown) <= LOG_BUDGET, grown[:2000]


# --- item 5: a row an older version stored ---------------------------------------------


def _store_old_rows(d: RunningDaemon, metas: list[str]) -> None:
    """Inbox rows written straight into inbox.db, as a version without the meta limit
    could have stored them (it took a 252-deep meta with a 201)."""
    conn = sqlite3.connect(d.paths.inbox_db, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        for n, meta in enumerate(metas, 1):
            conn.execute(
                "INSERT INTO inbox (id, mesh, sender_pubkey, client_message_id,"
                " broker_message_id, dest_kind, dest_ref, body, body_encoding, priority, meta,"
                " broker_epoch, broker_seq, sent_at, received_at)"
                " VALUES (?, 't', ?, ?, ?, 'topic', 'ops', ?, 'utf8', 'next', ?, 1, ?, 1, 1)",
                (f"in-{n}", "a" * 64, f"c-{n}", f"b-{n}", f"body {n}".encode(), meta, n))
    finally:
        conn.close()


async def test_inbox_reads_survive_a_stored_meta_too_deep_to_serve(
    daemon: RunningDaemon,
) -> None:
    deep = '{"a": ' * 252 + "1" + "}" * 252
    _store_old_rows(daemon, ['{"ok": true}', deep, '{"ok": 3}'])
    async with daemon.session() as s:
        for params in ({}, {"after": "0"}, {"consumer": "c"}):
            async with s.get("/v1/inbox", params=params) as r:
                assert r.status == 200, (params, await r.text())
                items = (await r.json())["items"]
            assert [i["body"] for i in items] == ["body 1", "body 2", "body 3"]
            assert items[1]["meta"] is None and "meta_unreadable" in items[1]
            assert items[2]["meta"] == {"ok": 3} and "meta_unreadable" not in items[2]
        async with s.post("/v1/inbox/ack", json={"consumer": "c", "up_to": 2}) as r:
            assert r.status == 200, await r.text()
        async with s.get("/v1/inbox", params={"consumer": "c"}) as r:  # past it for good
            assert [i["body"] for i in (await r.json())["items"]] == ["body 3"]


# --- the same rule on the paths that parse stored or relayed JSON ------------------------


def test_a_stored_broker_meta_too_deep_for_any_frame_is_delivered_as_a_marker() -> None:
    """A row an older broker stored: its deliver_batch must be one the recipient decodes,
    or the recipient refuses the whole batch again on every resume."""
    def row(meta: bytes) -> DeliveryRow:
        return DeliveryRow.of_record((1, 1, "0" * 26, None, "a" * 64, "c", "topic", "ops",
                                      b"x", "utf8", "next", meta, None, 1, 0, None, None))

    assert row(b'{"ok": 1}').meta == {"ok": 1}
    deep = row(("{\"a\": " * 250 + "1" + "}" * 250).encode())
    assert deep.meta is not None and set(deep.meta) == {"tidemesh_meta_unreadable"}
    frame = {"type": "deliver_batch", "deliveries": [deliver_frame(deep)]}
    assert wire.decode(wire.encode(frame))["deliveries"][0]["meta"] == deep.meta


def test_a_hook_never_sees_a_message_body_too_deep_to_redact() -> None:
    for depth in (100, 100_000):
        body = "[" * depth + "]" * depth
        assert hooks.redact({"body": body}, ["$.body.secret"])["body"] == hooks.REDACTED
    assert hooks.redact({"body": '{"secret": 1, "k": 2}'}, ["$.body.secret"])["body"] == \
        '{"secret":"[redacted]","k":2}'
