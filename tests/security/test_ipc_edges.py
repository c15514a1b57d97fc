"""IPC gates that tests/daemon/test_auth.py and test_malformed.py leave open (DESIGN §3).

A body that hides its size (chunked, no Content-Length) is cut at the limit like any other;
a Referer is refused like an Origin; a token in any spelling of the query is refused; a
scheme other than Bearer is 401; a header flood is refused before a handler runs. None of
them leaves an outbox row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, start_daemon

LIMIT = 1 << 20


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    d = start_daemon(short_tmp)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


async def _chunks(total: int) -> AsyncIterator[bytes]:
    yield b'{"to": "topic:ops", "body": "'
    sent = 0
    while sent < total:
        yield b"x" * 65536
        sent += 65536
    yield b'"}'


async def test_a_chunked_body_over_the_limit_is_413_on_both_transports(
    daemon: RunningDaemon,
) -> None:
    async with daemon.session() as s, s.post(
            "/v1/send", data=_chunks(LIMIT + 65536),
            headers={"Content-Type": "application/json"}) as r:
        assert r.status == 413
        error = (await r.json())["error"]
        # It says the limit, and the setting that raises it.
        assert str(LIMIT) in error["message"] and "ipc.max_body_bytes" in error["message"]
    auth = {"Authorization": f"Bearer {daemon.token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{daemon.port}/v1/send", data=_chunks(LIMIT + 65536),
            headers=auth) as r:
        assert r.status == 413
    assert daemon.outbox_rows() == []


async def _tcp_status(d: RunningDaemon, path: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{d.port}{path}", json={"to": "topic:ops", "body": "x"},
            headers=headers) as r:
        return r.status


async def test_referer_is_refused_like_origin(daemon: RunningDaemon) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    assert await _tcp_status(daemon, "/v1/send", {**auth, "Referer": "http://localhost/"}) == 403
    assert daemon.outbox_rows() == []


@pytest.mark.parametrize("param", ["token", "TOKEN", "access_token", "local_token"])
async def test_any_spelling_of_a_token_in_the_query_is_400(daemon: RunningDaemon,
                                                           param: str) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    assert await _tcp_status(daemon, f"/v1/send?{param}={daemon.token}", auth) == 400
    assert daemon.outbox_rows() == []


@pytest.mark.parametrize("value", ["Basic {t}", "bearer{t}", "Bearer  {t}x", "{t}", "Bearer "])
async def test_anything_but_the_bearer_token_is_401(daemon: RunningDaemon, value: str) -> None:
    header = {"Authorization": value.format(t=daemon.token)}
    assert await _tcp_status(daemon, "/v1/send", header) == 401
    assert daemon.outbox_rows() == []


async def test_a_header_flood_is_refused_and_the_daemon_lives_on(daemon: RunningDaemon) -> None:
    huge = {"Authorization": f"Bearer {daemon.token}", "X-Pad": "p" * 20000}
    assert await _tcp_status(daemon, "/v1/send", huge) in (400, 431)
    many = {"Authorization": f"Bearer {daemon.token}",
            **{f"X-H{i}": "v" for i in range(200)}}
    assert await _tcp_status(daemon, "/v1/send", many) in (202, 400, 431)
    async with daemon.session() as s, s.get("/v1/health") as r:
        assert r.status == 200
