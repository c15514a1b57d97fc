"""Numbers a caller writes, on every route that reads one (issue 31 item 9; core/numbers).

``str.isdigit`` took ``²`` and other scripts' digits that ``int`` refuses, and ``int``
refuses 5,000 digits: those were 500s. Now each is a 400 with the error shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, start_daemon
from tidemesh.core import numbers

HUGE = "9" * 5000
EDGES = ["²", "١٢", "-1", "+1", " 1", "1e3", "", HUGE, "9" * 20]


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    d = start_daemon(short_tmp)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


def test_decimal_takes_only_1_to_19_ascii_digits() -> None:
    assert [numbers.decimal(t) for t in ("0", "42", "9" * 19, b"7")] == [0, 42, 10**19 - 1, 7]
    assert [numbers.decimal(t) for t in EDGES] == [None] * len(EDGES)


@pytest.mark.parametrize(("path", "name"), [
    ("/v1/inbox", "limit"), ("/v1/inbox", "after"), ("/v1/outbox", "limit"),
    ("/v1/events", "since"),
])
async def test_a_bad_number_in_the_query_is_400(daemon: RunningDaemon, path: str,
                                                name: str) -> None:
    async with daemon.session() as s:
        for raw in [e for e in EDGES if e] + [str(2**63)]:
            async with s.get(path, params={name: raw},
                             timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 400, (name, raw[:20], await r.text())
                assert (await r.json())["error"]["code"] == "invalid_request"


async def test_a_bad_last_event_id_is_400(daemon: RunningDaemon) -> None:
    async with daemon.session() as s:
        for raw in ["²", HUGE, str(2**63)]:
            async with s.get("/v1/events", headers={"Last-Event-ID": raw},
                             timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 400, (raw[:20], await r.text())
                assert (await r.json())["error"]["field"] == "since"


async def test_a_5000_digit_content_length_on_the_socket_is_answered_4xx(
    daemon: RunningDaemon,
) -> None:
    reader, writer = await asyncio.open_unix_connection(str(daemon.paths.socket))
    writer.write(b"POST /v1/send HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + HUGE.encode() + b"\r\n\r\n{}")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status.split()[1].startswith(b"4"), status
    async with daemon.session() as s, s.get("/v1/health") as r:
        assert r.status == 200
