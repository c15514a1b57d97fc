"""kill -9 of the daemon while 1,000 sends are in flight loses no accepted send.

After the restart every id that got a 202 is in the outbox exactly once. An id that got no
answer may or may not have a row: a row without an answer is a 202 lost in flight (the commit
happened, the process died before the response left) and the sender's retry with the same
id then returns that row. An id whose request never reached the daemon has no row.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import start_daemon

BODY = {"to": {"kind": "topic", "ref": "ops"}, "body": "crash test payload"}


@pytest.mark.slow
async def test_kill_9_during_1000_sends_loses_no_202(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    accepted: set[str] = set()
    unanswered: set[str] = set()
    started: set[str] = set()
    sem = asyncio.Semaphore(64)
    killed = asyncio.Event()

    async with d.session() as s:
        async def one(i: int) -> None:
            cid = f"crash-{i:04d}"
            async with sem:
                if killed.is_set():
                    return
                started.add(cid)
                try:
                    async with s.post("/v1/send", json=BODY,
                                      headers={"Idempotency-Key": cid}) as r:
                        if r.status == 202:
                            accepted.add(cid)
                        else:
                            unanswered.add(cid)
                except (TimeoutError, aiohttp.ClientError):
                    unanswered.add(cid)
            if len(accepted) >= 400 and not killed.is_set():
                killed.set()
                d.proc.kill()

        await asyncio.gather(*(one(i) for i in range(1000)))
    d.proc.wait(timeout=10)
    assert killed.is_set() and d.proc.returncode == -9

    restarted = start_daemon(short_tmp)
    try:
        rows = restarted.outbox_rows()
        ids = [r["client_message_id"] for r in rows]
        assert len(ids) == len(set(ids))
        assert accepted <= set(ids), f"lost {len(accepted - set(ids))} accepted sends"
        assert set(ids) <= started, "a row exists for a request that was never sent"
        lost_in_flight = set(ids) - accepted
        assert lost_in_flight <= unanswered
        assert {r["status"] for r in rows} == {"pending"}
        # A retry of an id whose 202 was lost returns the same row, not a second one.
        async with restarted.session() as s:
            for cid in sorted(lost_in_flight)[:20]:
                async with s.post("/v1/send", json=BODY, headers={"Idempotency-Key": cid}) as r:
                    assert r.status == 202
        assert len(restarted.outbox_rows()) == len(rows)
        print(f"accepted={len(accepted)} unanswered={len(unanswered)} "
              f"rows={len(rows)} lost_202_in_flight={len(lost_in_flight)}")
    finally:
        assert restarted.stop() == 0
