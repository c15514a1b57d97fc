"""W3C trace context end to end (a real broker, two real daemons): the traceparent a send
carries (or the one its daemon makes) reaches the recipient's inbox item, its SSE
``message`` event and its hook's ``TRACEPARENT``; a retry with another is the same send."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon
from tests.e2e.harness import Mesh, connected, inbox, wait_for
from tests.e2e.test_hooks import add_with_hooks
from tidemesh.core.trace import traceparent_problem

pytestmark = pytest.mark.slow

T1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
T2 = "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-00"
T3 = "00-cccccccccccccccccccccccccccccccc-dddddddddddddddd-01"
T4 = "00-eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee-ffffffffffffffff-01"


async def _send(d: RunningDaemon, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with d.session() as s, s.post("/v1/send", json=body, headers=headers or {}) as r:
        return r.status, await r.json()


async def _send_tcp(d: RunningDaemon, body: dict[str, Any],
                    headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """Over loopback TCP with the token: the aiohttp route, not the Unix socket's lane."""
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{d.port}/v1/send", json=body,
            headers={"Authorization": f"Bearer {d.token}", **headers}) as r:
        return r.status, await r.json()


async def _events(d: RunningDaemon, want: int) -> list[dict[str, Any]]:
    """The first ``want`` message events of the recipient's SSE stream."""
    out: list[dict[str, Any]] = []
    async with d.session() as s, s.get("/v1/events", params={"since": "0"}) as r:
        kind = ""
        while len(out) < want:
            line = (await asyncio.wait_for(r.content.readline(), 30)).decode().strip()
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "message":
                out.append(json.loads(line.split(":", 1)[1]))
    return out


async def test_a_traceparent_travels_from_the_send_to_the_inbox_events_and_hook(
    any_mesh: Mesh, short_tmp: Path
) -> None:
    mesh = any_mesh
    env_log = short_tmp / "env.log"
    hook = f'#!/bin/sh\necho "$TIDEMESH_EVENT_ID ${{TRACEPARENT:-none}}" >> {env_log}\n'
    a = mesh.add("a", short_tmp)
    b = add_with_hooks(mesh, "b", short_tmp, {"on-topic-ops": hook}, "[on-topic-ops]\n")
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "ops", "create": True}) as r:
        assert r.status == 200, await r.text()

    # The header on the Unix socket (the send lane), then a retry with another: a duplicate.
    status, first = await _send(a, {"to": "topic:ops", "body": "one",
                                    "client_message_id": "c1"}, {"traceparent": T1})
    assert status == 202, first
    status, again = await _send(a, {"to": "topic:ops", "body": "one",
                                    "client_message_id": "c1"}, {"traceparent": T2})
    assert status in (200, 202) and again["outbox_id"] == first["outbox_id"], again
    # The body's field, over TCP (the aiohttp route).
    status, _ = await _send_tcp(a, {"to": "topic:ops", "body": "two", "traceparent": T3}, {})
    assert status == 202
    # None given: the daemon makes one.
    assert (await _send(a, {"to": "topic:ops", "body": "three"}))[0] == 202
    # A batch: each item carries its own.
    async with a.session() as s, s.post("/v1/send_batch", json={"sends": [
            {"to": "topic:ops", "body": "four", "traceparent": T4},
            {"to": "topic:ops", "body": "bad", "traceparent": "00-nope"}]}) as r:
        assert r.status == 200
        results = (await r.json())["results"]
    assert results[1]["status"] == 400 and results[1]["body"]["error"]["field"] == "traceparent"

    await wait_for(lambda: _count(b, 4))
    by_body = {m["body"]: m for m in await inbox(b)}
    assert by_body["one"]["traceparent"] == T1, "the retry's traceparent is not kept"
    assert by_body["two"]["traceparent"] == T3
    assert by_body["four"]["traceparent"] == T4
    made = by_body["three"]["traceparent"]
    assert made is not None and traceparent_problem(made) is None and made.endswith("-01")
    assert made not in (T1, T2, T3, T4)

    events = {e["body"]: e["traceparent"] for e in await _events(b, 4)}
    assert events == {body: m["traceparent"] for body, m in by_body.items()}

    await wait_for(lambda: env_log.exists() and len(env_log.read_text().splitlines()) >= 4)
    ran = dict(line.split() for line in env_log.read_text().splitlines())
    assert ran == {m["id"]: m["traceparent"] for m in by_body.values()}


async def _count(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


@pytest.mark.parametrize("bad", ["00-nope", T1.upper(), "01" + T1[2:],
                                 "00-00000000000000000000000000000000-00f067aa0ba902b7-01"])
async def test_a_bad_traceparent_is_a_400_naming_the_field(
    mesh: Mesh, short_tmp: Path, bad: str
) -> None:
    a = mesh.add("a", short_tmp)
    body = {"to": "topic:ops", "body": "x"}
    for status, answer in (await _send(a, body, {"traceparent": bad}),
                           await _send_tcp(a, body, {"traceparent": bad}),
                           await _send(a, {**body, "traceparent": bad})):
        assert status == 400, answer
        assert answer["error"]["code"] == "invalid_request"
        assert answer["error"]["field"] == "traceparent"
