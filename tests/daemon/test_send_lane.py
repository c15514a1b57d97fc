"""The Unix socket's send lane: which heads it answers itself, and that a connection moves to
aiohttp mid-stream without a request lost, answered twice or out of order."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.local_app import local_app
from tidemesh.core.ratelimit import Rate
from tidemesh.daemon.api.send_lane import Lane, lane_head

BODY = b'{"to":"topic:ops","body":"hi"}'


def _post(path: str, body: bytes = BODY, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: localhost",
             f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _head(raw: bytes) -> bytes:
    return raw[:raw.index(b"\r\n\r\n") + 4]


# ---------------------------------------------------------------- which heads (pure)
def test_a_plain_send_and_batch_are_the_lanes() -> None:
    one = lane_head(_head(_post("/v1/send", BODY, "Idempotency-Key: k-1")), 1 << 20)
    assert one is not None
    assert (one.path, one.length, one.headers.get("idempotency-key"), one.keep_alive,
            one.http10) == ("/v1/send", len(BODY), "k-1", True, False)
    batch = lane_head(_head(_post("/v1/send_batch")), 1 << 20)
    assert batch is not None and batch.path == "/v1/send_batch"
    assert "idempotency-key" not in batch.headers


def test_the_first_idempotency_key_counts_as_in_aiohttp() -> None:
    head = lane_head(_head(_post("/v1/send", BODY, "Idempotency-Key: a",
                                 "idempotency-key: b")), 1 << 20)
    assert head is not None and head.headers["idempotency-key"] == "a"


def test_the_lane_reads_the_traceparent_header_the_first_one_counting() -> None:
    t1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    head = lane_head(_head(_post("/v1/send", BODY, f"TraceParent: {t1}",
                                 "traceparent: other")), 1 << 20)
    assert head is not None and head.headers["traceparent"] == t1
    plain = lane_head(_head(_post("/v1/send", BODY)), 1 << 20)
    assert plain is not None and "traceparent" not in plain.headers


@pytest.mark.parametrize("raw", [
    b"GET /v1/send HTTP/1.1\r\nHost: x\r\n\r\n",
    _post("/v1/send?token=abc"),
    _post("/v1/sendx"),
    _post("/v1/health"),
    _post("/v1/send", BODY, "Authorization: Bearer t"),
    _post("/v1/send", BODY, "Expect: 100-continue"),
    _post("/v1/send", BODY, "Upgrade: websocket"),
    b"POST /v1/send HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /v1/send HTTP/1.1\r\nHost: x\r\n\r\n",   # no Content-Length
    _post("/v1/send", b"x" * 2048),                 # over the body limit below
    b"POST /v1/send HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"POST /v1/send HTTP/9.9\x00\r\n\r\n",
    b"POST /v1/send HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n",
    b"CONNECT localhost:80 HTTP/1.1\r\nHost: localhost\r\n\r\n",
], ids=["get", "query", "other-path", "other-route", "token", "expect", "upgrade", "chunked",
        "no-length", "oversized", "two-lengths", "garbage", "connection-upgrade", "connect"])
def test_anything_else_goes_to_aiohttp(raw: bytes) -> None:
    assert lane_head(_head(raw), 1024) is None


def test_http10_keeps_alive_only_when_asked() -> None:
    closed = lane_head(_head(_post("/v1/send", version="1.0")), 1 << 20)
    kept = lane_head(_head(_post("/v1/send", BODY, "Connection: keep-alive", version="1.0")),
                     1 << 20)
    assert closed is not None and not closed.keep_alive and closed.http10
    assert kept is not None and kept.keep_alive


# ---------------------------------------------------------------- over the real socket
async def _exchange(path: Path, data: bytes, answers: int) -> list[tuple[int, dict[str, str],
                                                                          bytes]]:
    """Send ``data`` in one write, read ``answers`` responses off the connection."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    out = []
    for _ in range(answers):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in
                   (line.split(":", 1) for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        out.append((int(lines[0].split()[1]), headers, body))
    writer.close()
    return out


async def test_pipelined_requests_answer_in_order_across_the_hand_over(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        data = (_post("/v1/send", BODY, "Idempotency-Key: p-1")
                + b"GET /v1/outbox?limit=5 HTTP/1.1\r\nHost: x\r\n\r\n"
                + _post("/v1/send", BODY, "Idempotency-Key: p-2")
                + _post("/v1/send", BODY, "Idempotency-Key: p-1"))
        answers = await _exchange(app.socket, data, 4)
    statuses = [a[0] for a in answers]
    assert statuses == [202, 200, 202, 202]
    # The outbox listing was read after the first send committed, and before the second.
    rows = json.loads(answers[1][2])["items"]
    assert [r["client_message_id"] for r in rows] == ["p-1"]
    first, again = json.loads(answers[0][2]), json.loads(answers[3][2])
    assert again["outbox_id"] == first["outbox_id"]     # the retry changed nothing


async def test_the_lane_answers_with_the_routes_shape_and_headers(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        (ok, bad, batch) = await _exchange(app.socket, _post("/v1/send")
                                           + _post("/v1/send", b"{not json")
                                           + _post("/v1/send_batch", b'{"sends":[' + BODY
                                                   + b"]}", "Idempotency-Key: no"), 3)
    assert ok[0] == 202 and ok[1]["content-type"] == "application/json; charset=utf-8"
    assert "date" in ok[1]
    assert bad[0] == 400 and json.loads(bad[2])["error"]["code"] == "invalid_request"
    assert batch[0] == 400 and json.loads(batch[2])["error"]["field"] == "Idempotency-Key"


async def test_a_half_closed_client_still_gets_its_answer(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        reader, writer = await asyncio.open_unix_connection(str(app.socket))
        writer.write(_post("/v1/send", BODY, "Idempotency-Key: h-1"))
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)   # to EOF: the lane closes after
        writer.close()
    assert answer.startswith(b"HTTP/1.1 202 ")


async def test_connection_close_and_http10_end_the_connection(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for raw, line, closing in ((_post("/v1/send", BODY, "Connection: close"),
                                    b"HTTP/1.1 202 ", True),
                                   (_post("/v1/send", version="1.0"), b"HTTP/1.0 202 ", False)):
            reader, writer = await asyncio.open_unix_connection(str(app.socket))
            writer.write(raw)
            answer = await asyncio.wait_for(reader.read(), 10)   # to EOF: the lane closed it
            writer.close()
            assert answer.startswith(line)
            # As aiohttp answers: "close" said only where it is not the version's default.
            assert (b"Connection: close" in answer) is closing


async def test_a_body_in_pieces_and_a_client_gone_before_the_answer(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        raw = _post("/v1/send", BODY, "Idempotency-Key: slow-1")
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(app.socket))
        for i in range(0, len(raw), 7):   # the head and the body arrive a few bytes at a time
            sock.sendall(raw[i:i + 7])
            await asyncio.sleep(0.001)
        sock.close()                       # gone before any answer
        # The send was accepted all the same: a retry is the same row, not a new one.
        (again,) = await _exchange(app.socket, raw, 1)
        async with app.session() as http, http.get("/v1/outbox") as resp:
            rows = (await resp.json())["items"]
    assert again[0] == 202
    assert [r["client_message_id"] for r in rows] == ["slow-1"]


async def test_lane_requests_are_counted_in_the_metrics(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        await _exchange(app.socket, _post("/v1/send") + _post("/v1/send", b"[]"), 2)
        async with app.session() as http, http.get("/v1/metrics") as resp:
            text = await resp.text()
    assert ('cm_daemon_ipc_request_total{endpoint="/v1/send",status="202",transport="unix"} 1.0'
            in text)
    assert ('cm_daemon_ipc_request_total{endpoint="/v1/send",status="400",transport="unix"} 1.0'
            in text)


async def test_any_split_of_a_pipelined_stream_gets_every_answer_in_order(
        short_tmp: Path) -> None:
    """Requests of every kind, written back to back and cut at random points: each is
    answered once, in order, whichever side (lane or aiohttp) answers it."""
    rng = random.Random(7)
    kinds = {
        "send": lambda i: (_post("/v1/send", BODY, f"Idempotency-Key: r-{i}"), 202),
        "bad": lambda i: (_post("/v1/send", b'{"to":'), 400),
        "batch": lambda i: (_post("/v1/send_batch", b'{"sends":[' + BODY[:-1]
                                  + f',"client_message_id":"b-{i}"}}]}}'.encode()), 200),
        "list": lambda i: (b"GET /v1/outbox?limit=1 HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        "query": lambda i: (_post("/v1/send?x=1", BODY, f"Idempotency-Key: q-{i}"), 202),
    }
    async with local_app(short_tmp) as app:
        for round_ in range(12):
            picked = [rng.choice(list(kinds)) for _ in range(rng.randint(1, 6))]
            made = [kinds[k](round_ * 10 + j) for j, k in enumerate(picked)]
            stream = b"".join(raw for raw, _ in made)
            cuts = sorted(rng.sample(range(1, len(stream)), min(4, len(stream) - 1)))
            reader, writer = await asyncio.open_unix_connection(str(app.socket))
            for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
                writer.write(stream[a:b])
                await writer.drain()
                await asyncio.sleep(rng.choice((0, 0.002)))
            got = []
            for _ in made:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                got.append(int(head.split()[1]))
            writer.close()
            assert got == [status for _, status in made], picked


async def test_an_upgrade_or_connect_request_is_answered_by_aiohttp_not_dropped(
        short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for raw in (b"GET /v1/outbox HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n",
                    b"CONNECT localhost:80 HTTP/1.1\r\nHost: localhost\r\n\r\n"):
            reader, writer = await asyncio.open_unix_connection(str(app.socket))
            writer.write(raw)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.close()
            assert head.startswith(b"HTTP/1.1 "), head


async def test_an_idle_connection_is_closed_after_the_keep_alive_time(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        # The same lane the daemon runs, on a second socket, with a short keep-alive.
        lane = Lane(app.server.app, 1 << 20, _never, keepalive_s=0.3)
        server = await asyncio.get_running_loop().create_unix_server(
            lane.protocol, str(short_tmp / "lane"))
        try:
            reader, writer = await asyncio.open_unix_connection(str(short_tmp / "lane"))
            writer.write(_post("/v1/send", BODY, "Idempotency-Key: idle-1"))
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 202 ")
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(reader.read(), 5)      # EOF: the lane closed it
            assert asyncio.get_running_loop().time() - started >= 0.25
            writer.close()
        finally:
            server.close()


def _never() -> asyncio.Protocol:
    raise AssertionError("nothing here goes to aiohttp")


# ---------------------------------------------------------------- parity with aiohttp
# Every lane route and every hand-over case, sent to two daemons made alike: one through the
# Unix socket (the lane, and aiohttp after a hand-over), one through aiohttp's own protocol
# on a socket of its own. Status line, headers (but Date and Server) and body must match;
# ids minted per daemon (ULIDs) are the one difference allowed.
_ULID = re.compile(rb"[0-9A-HJKMNP-TV-Z]{26}")
CONFLICTING = b'{"to":"topic:ops","body":"other"}'
BATCH = b'{"sends":[' + BODY[:-1] + b',"client_message_id":"b-1"},{"to":"nowhere"}]}'

PARITY = {
    "send": _post("/v1/send", BODY, "Idempotency-Key: s-1"),
    "send-again": _post("/v1/send", BODY, "Idempotency-Key: s-1"),
    "send-conflict": _post("/v1/send", CONFLICTING, "Idempotency-Key: s-1"),
    "send-no-key": _post("/v1/send"),
    "send-traceparent": _post("/v1/send", BODY, "Idempotency-Key: s-2",
                              "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"
                              "00f067aa0ba902b7-01"),
    "send-bad-json": _post("/v1/send", b"{not json"),
    "send-bad-schema": _post("/v1/send", b'{"to":"topic:ops"}'),
    "send-empty": _post("/v1/send", b""),
    "batch": _post("/v1/send_batch", BATCH),
    "batch-key": _post("/v1/send_batch", BATCH, "Idempotency-Key: no"),
    "batch-bad": _post("/v1/send_batch", b'{"sends":[]}'),
    "http10": _post("/v1/send", BODY, "Idempotency-Key: s-3", version="1.0"),
    "http10-keep-alive": _post("/v1/send", BODY, "Idempotency-Key: s-4",
                               "Connection: keep-alive", version="1.0"),
    "connection-close": _post("/v1/send", BODY, "Idempotency-Key: s-5", "Connection: close"),
    # hand-over cases
    "other-route": b"GET /v1/version HTTP/1.1\r\nHost: x\r\n\r\n",
    "no-route": _post("/v1/sendx"),
    "wrong-method": b"GET /v1/send HTTP/1.1\r\nHost: x\r\n\r\n",
    "query": _post("/v1/send?x=1", BODY, "Idempotency-Key: s-6"),
    "token-in-query": _post("/v1/send?token=abc"),
    "authorization": _post("/v1/send", BODY, "Idempotency-Key: s-7", "Authorization: Bearer t"),
    "chunked": (b"POST /v1/send HTTP/1.1\r\nHost: x\r\nIdempotency-Key: s-8\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(BODY):x}".encode() + b"\r\n" + BODY + b"\r\n0\r\n\r\n"),
    "expect": _post("/v1/send", BODY, "Idempotency-Key: s-9", "Expect: 100-continue"),
    "upgrade": _post("/v1/send", BODY, "Connection: Upgrade", "Upgrade: websocket"),
    "no-length": b"POST /v1/send HTTP/1.1\r\nHost: x\r\n\r\n",
    "two-lengths": b"POST /v1/send HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    "over-limit": _post("/v1/send", b" " * ((1 << 20) + 1)),
    "bad-head": b"POST /v1/send HTTP/9.9\x00\r\n\r\n",
    # pipelined mixes: lane, hand-over, and lane-able requests after it
    "pipelined": (_post("/v1/send", BODY, "Idempotency-Key: p-1")
                  + _post("/v1/send_batch", BATCH)
                  + b"GET /v1/version HTTP/1.1\r\nHost: x\r\n\r\n"
                  + _post("/v1/send", BODY, "Idempotency-Key: p-1")
                  + _post("/v1/send", b"[]")),
    "pipelined-errors": (_post("/v1/send", b"{") + _post("/v1/send_batch", BATCH, "Idempotency-"
                                                         "Key: k") + _post("/v1/send?q=1")),
}


Answered = tuple[bytes, list[tuple[str, str]], bytes]


def _normal(body: bytes) -> bytes:
    body = _ULID.sub(b"<ulid>", body)
    return _WAIT.sub(rb"\1<ms>", body)


_WAIT = re.compile(rb'(retry after |"retry_after_ms":)\d+')


async def _answers(path: Path, data: bytes) -> list[Answered]:
    """The answers on one connection after writing ``data``: one per request in it (a
    ``100 Continue`` besides), fewer when the server closes the connection first."""
    requests = data.count(b" HTTP/")
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    got: list[Answered] = []
    try:
        while sum(not line.startswith(b"HTTP/1.1 1") for line, _, _ in got) < requests:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            line, *fields = head[:-4].split(b"\r\n")
            headers = sorted((k.strip().lower(), v.strip()) for k, v in
                             (f.decode().split(":", 1) for f in fields))
            length = int(dict(headers).get("content-length", "0"))
            body = _normal(await reader.readexactly(length))
            # The length as of the normalised body: a wait of 1000000 ms on one side and
            # 999999 on the other is the same answer.
            got.append((line, [(k, str(len(body)) if k == "content-length" else v)
                               for k, v in headers if k not in ("date", "server")], body))
    finally:
        writer.close()
    return got


async def _aiohttp_socket(app: Any, path: Path) -> asyncio.AbstractServer:
    """aiohttp's own protocol for ``app`` on a socket of its own: the stack without the lane."""
    return await asyncio.get_running_loop().create_unix_server(app.server.runner.server,
                                                               str(path))


async def _parity(short_tmp: Path, cases: dict[str, bytes], **state: Any) -> None:
    (short_tmp / "a").mkdir()
    (short_tmp / "b").mkdir()
    async with local_app(short_tmp / "a", **state) as lane, \
            local_app(short_tmp / "b", **state) as plain:
        server = await _aiohttp_socket(plain, short_tmp / "h")
        try:
            for name, raw in cases.items():
                via_lane = await _answers(lane.socket, raw)
                via_aiohttp = await _answers(short_tmp / "h", raw)
                assert via_lane, name
                assert via_lane == via_aiohttp, name
        finally:
            server.close()


async def test_every_lane_route_and_hand_over_answers_as_aiohttp(short_tmp: Path) -> None:
    await _parity(short_tmp, PARITY)


async def test_a_request_over_its_budget_answers_as_aiohttp(short_tmp: Path) -> None:
    sends = b"".join(_post("/v1/send", BODY, f"Idempotency-Key: r-{i}") for i in range(3))
    await _parity(short_tmp, {"over-budget": sends}, rate=Rate(0.001, 2))
