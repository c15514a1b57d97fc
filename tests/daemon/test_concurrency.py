"""Concurrent accepts of one id are serialized: one row, consistent answers."""

from __future__ import annotations

import asyncio

from tests.daemon.harness import RunningDaemon

BODY = {"to": {"kind": "topic", "ref": "ops"}, "body": "same body"}


async def test_64_concurrent_same_id_same_body_make_one_row(daemon: RunningDaemon) -> None:
    async with daemon.session() as s:
        async def one() -> tuple[int, dict[str, str]]:
            async with s.post("/v1/send", json=BODY, headers={"Idempotency-Key": "dup"}) as r:
                return r.status, await r.json()

        results = await asyncio.gather(*(one() for _ in range(64)))
    rows = daemon.outbox_rows()
    assert len(rows) == 1
    assert {status for status, _ in results} == {202}
    assert {b["client_message_id"] for _, b in results} == {"dup"}
    assert {b["outbox_id"] for _, b in results} == {rows[0]["id"]}


async def test_64_concurrent_same_id_different_bodies_one_wins(daemon: RunningDaemon) -> None:
    async with daemon.session() as s:
        async def one(i: int) -> tuple[int, dict[str, object]]:
            body = {**BODY, "body": f"body {i}"}
            async with s.post("/v1/send", json=body, headers={"Idempotency-Key": "race"}) as r:
                return r.status, await r.json()

        results = await asyncio.gather(*(one(i) for i in range(64)))
    rows = daemon.outbox_rows()
    assert len(rows) == 1
    statuses = [status for status, _ in results]
    assert statuses.count(202) == 1 and statuses.count(409) == 63
    winner = next(i for i, (status, _) in enumerate(results) if status == 202)
    assert rows[0]["payload"].decode().find(f"body {winner}") >= 0
    for status, body in results:
        if status == 409:
            err = body["error"]
            assert isinstance(err, dict)
            assert err["conflict"] == "outbox_pending_fingerprint_mismatch"


async def test_past_the_inflight_cap_sends_get_429_and_lose_nothing(
    daemon: RunningDaemon,
) -> None:
    """300 at once is past the default cap of 256: the excess get 429 daemon_busy, store
    nothing, and succeed when retried; every 202 is a row."""
    async with daemon.session() as s:
        async def one(i: int) -> tuple[int, str]:
            async with s.post("/v1/send", json=BODY, headers={"Idempotency-Key": f"k{i}"}) as r:
                body = await r.json()
                return r.status, body["error"]["code"] if r.status >= 400 else body["status"]

        results = await asyncio.gather(*(one(i) for i in range(300)))
        assert {r for r in results} <= {(202, "queued"), (429, "daemon_busy")}
        accepted = {i for i, (status, _) in enumerate(results) if status == 202}
        assert {r["client_message_id"] for r in daemon.outbox_rows()} == {f"k{i}" for i in accepted}
        retried = await asyncio.gather(*(one(i) for i in range(300) if i not in accepted))
    assert {status for status, _ in retried} <= {202}
    assert len(daemon.outbox_rows()) == 300
