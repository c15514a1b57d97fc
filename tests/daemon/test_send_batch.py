"""POST /v1/send_batch on a real daemon: each send answered exactly as POST /v1/send would
have answered it, in order; the batch's rows in one transaction; kill -9 loses no 202.

The reference answers come from the same daemon, in a fresh key space driven one send at a
time through /v1/send: the batch's answers must equal them once ids are written alike.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.daemon.harness import RunningDaemon, start_daemon
from tests.daemon.test_hooks import PRE_SEND, hooks_folder

TOPIC = {"kind": "topic", "ref": "ops"}
# States the broker or an operator would give a row, set up behind the daemon's back.
SET_STATE = {
    "done": "UPDATE outbox SET status='done', broker_message_id='B1', history_id='H1',"
            " delivered_at=1 WHERE client_message_id=?",
    "dead": "UPDATE outbox SET status='dead', last_error='broker_rejected: x'"
            " WHERE client_message_id=?",
    "aborted": "UPDATE outbox SET status='aborted', aborted_at=1, aborted_by='operator'"
               " WHERE client_message_id=?",
    "inflight": "UPDATE outbox SET status='inflight' WHERE client_message_id=?",
}


def _sequence(k: str) -> list[Any]:
    """Every kind of item, in key space ``k``: new, repeats, conflicts inside the batch and
    against rows in each state, and bodies /v1/send refuses with a 400."""
    def send(cid: str | None, body: str = "hello", **kw: Any) -> dict[str, Any]:
        return {"to": TOPIC, "body": body, **({"client_message_id": f"{k}{cid}"} if cid else {}),
                **kw}
    return [
        send("1"),
        send("1"),                                # the same again: 202 queued, same row
        send("1", "another body"),                # same key, another request: 409
        send(None),                               # no id: a minted one
        send("2", "x", meta={"b": 1, "a": [1, 2]}, priority="now"),
        {"to": TOPIC},                            # no body: 400
        "not an object",                          # 400
        send("3", body="%%%", body_encoding="base64"),  # 400: not base64
        send("4", to="topic:bad name"),           # 400: destination
        send("5" * 255),                          # 400: id over 255 characters
        send("done"), send("done", "changed"),    # rows set to these states beforehand
        send("dead"), send("dead", "changed"),
        send("aborted"), send("aborted", "changed"),
        send("inflight"), send("inflight", "changed"),
        send("2", "x", meta={"a": [1, 2], "b": 1}, priority="now"),  # same meta, other order
        send("1"),
    ]


async def _prepare(s: aiohttp.ClientSession, d: RunningDaemon, k: str) -> None:
    for state, stmt in SET_STATE.items():
        async with s.post("/v1/send", json={"to": TOPIC, "body": "hello",
                                            "client_message_id": f"{k}{state}"}) as r:
            assert r.status == 202
        d.sql(stmt, f"{k}{state}")


def _alike(results: list[dict[str, Any]], k: str) -> str:
    """The answers with the key space's prefix and each ULID (row ids, minted ids) named by
    order of appearance, so two key spaces compare equal when they were answered alike."""
    text = orjson.dumps(results).decode().replace(k, "K:")
    names: dict[str, str] = {}
    return re.sub(r"[0-9A-HJKMNP-TV-Z]{26}",
                  lambda m: names.setdefault(m.group(0), f"<ulid{len(names)}>"), text)


async def test_batch_answers_each_send_as_v1_send_would_in_order(
        daemon: RunningDaemon) -> None:
    async with daemon.session() as s:
        await _prepare(s, daemon, "seq-")
        await _prepare(s, daemon, "bat-")
        expected = []
        for item in _sequence("seq-"):
            async with s.post("/v1/send", data=orjson.dumps(item),
                              headers={"Content-Type": "application/json"}) as r:
                expected.append({"status": r.status, "body": await r.json()})
        async with s.post("/v1/send_batch", json={"sends": _sequence("bat-")}) as r:
            assert r.status == 200
            got = (await r.json())["results"]
    assert [g["status"] for g in got] == [
        202, 202, 409, 202, 202, 400, 400, 400, 400, 400,
        200, 409, 409, 409, 409, 409, 202, 409, 202, 202]
    assert _alike(got, "bat-") == _alike(expected, "seq-")
    rows = {r["client_message_id"]: r for r in daemon.outbox_rows()}
    # The same payload but for the traceparent each send was given by its daemon.
    bat, seq = (orjson.loads(rows[k]["payload"]) for k in ("bat-1", "seq-1"))
    assert bat.pop("traceparent") != seq.pop("traceparent")
    assert bat == seq
    assert got[0]["body"]["outbox_id"] == got[1]["body"]["outbox_id"] == rows["bat-1"]["id"]
    assert sum(cid.startswith("bat-") for cid in rows) == 6, "one row per new id, no more"


async def _outbox_commits(s: aiohttp.ClientSession) -> float:
    async with s.get("/v1/metrics") as r:
        text = await r.text()
    found = re.search(r'^cm_daemon_db_batch_rows_count\{db="outbox"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_batch_of_new_sends_commits_in_one_transaction(daemon: RunningDaemon) -> None:
    sends = [{"to": "topic:ops", "body": f"m{i}", "client_message_id": f"t-{i}"}
             for i in range(1000)]
    async with daemon.session() as s:
        before = await _outbox_commits(s)
        async with s.post("/v1/send_batch", json={"sends": sends}) as r:
            assert r.status == 200
            results = (await r.json())["results"]
        assert await _outbox_commits(s) == before + 1
    assert [x["status"] for x in results] == [202] * 1000
    rows = {r["client_message_id"]: r["id"] for r in daemon.outbox_rows()}
    assert [rows[f"t-{i}"] for i in range(1000)] == [x["body"]["outbox_id"] for x in results]
    assert len(rows) == 1000


@pytest.mark.parametrize(("body", "field"), [
    ({"sends": []}, "sends"),
    ({"sends": [{"to": "topic:ops", "body": "x"}] * 1001}, "sends"),
    ({}, "body"),                   # a missing property is named by its parent
    ({"sends": {"to": "topic:ops", "body": "x"}}, "sends"),
    ([{"to": "topic:ops", "body": "x"}], "body"),
], ids=["empty", "1001", "missing", "not-a-list", "not-an-object"])
async def test_batch_out_of_bounds_is_400_and_stores_nothing(
        daemon: RunningDaemon, body: Any, field: str) -> None:
    async with daemon.session() as s, s.post("/v1/send_batch", json=body) as r:
        assert r.status == 400
        err = (await r.json())["error"]
    assert (err["code"], err["field"]) == ("invalid_request", field)
    assert daemon.outbox_rows() == []


async def test_batch_refuses_an_idempotency_key_header(daemon: RunningDaemon) -> None:
    async with daemon.session() as s, s.post(
            "/v1/send_batch", json={"sends": [{"to": "topic:ops", "body": "x"}]},
            headers={"Idempotency-Key": "k"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == "Idempotency-Key"
    assert daemon.outbox_rows() == []


async def test_pre_send_hook_vetoes_each_send_of_a_batch_on_its_own(short_tmp: Path) -> None:
    hooks_folder(short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    d = start_daemon(short_tmp)
    try:
        sends = [{"to": "topic:ops", "body": b, "client_message_id": f"h-{i}"}
                 for i, b in enumerate(["fine", "forbidden fruit", "also fine"])]
        async with d.session() as s, s.post("/v1/send_batch", json={"sends": sends}) as r:
            results = (await r.json())["results"]
        assert [x["status"] for x in results] == [202, 403, 202]
        err = results[1]["body"]["error"]
        assert (err["code"], err["reason"]) == ("send_vetoed", "no forbidden words, please")
        assert [r["client_message_id"] for r in d.outbox_rows()] == ["h-0", "h-2"]
    finally:
        assert d.stop() == 0


async def test_pre_send_hook_vetoes_a_requeue_whose_patch_it_would_refuse(
    short_tmp: Path
) -> None:
    hooks_folder(short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    d = start_daemon(short_tmp)
    try:
        async with d.session() as s:
            async with s.post("/v1/send", json={"to": "topic:ops", "body": "fine",
                                                "client_message_id": "r-0"}) as r:
                assert r.status == 202
            row = d.outbox_rows()[0]["id"]
            patch = {"to": "topic:ops", "body": "forbidden fruit"}
            async with s.post("/v1/outbox/requeue",
                              json={"id": row, "patch_payload": patch}) as r:
                assert r.status == 403
                assert (await r.json())["error"]["code"] == "send_vetoed"
            async with s.post("/v1/outbox/requeue", json={
                    "id": row, "patch_payload": {**patch, "body": "still fine"}}) as r:
                assert r.status == 200
        rows = d.outbox_rows()
        assert (rows[0]["client_message_id"], rows[0]["status"]) == ("r-0", "aborted")
        assert len(rows) == 2 and b"forbidden" not in b"".join(x["payload"] for x in rows)
    finally:
        assert d.stop() == 0


@pytest.mark.slow
async def test_kill_9_during_a_stream_of_batches_loses_no_202(short_tmp: Path) -> None:
    """Writers post batches of 50 until the daemon is killed; after the restart every send
    answered 202 has exactly one row, and a batch that got no answer is all or nothing."""
    d = start_daemon(short_tmp)
    accepted: set[str] = set()
    unanswered: list[set[str]] = []
    started: set[str] = set()
    killed = asyncio.Event()

    async with d.session() as s:
        async def writer(w: int) -> None:
            for b in range(1000):
                if killed.is_set():
                    return
                ids = [f"k{w}-{b}-{i}" for i in range(50)]
                started.update(ids)
                sends = [{"to": "topic:ops", "body": "crash", "client_message_id": c}
                         for c in ids]
                try:
                    async with s.post("/v1/send_batch", json={"sends": sends}) as r:
                        results = (await r.json())["results"]
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    unanswered.append(set(ids))
                    return
                accepted.update(c for c, x in zip(ids, results, strict=True)
                                if x["status"] == 202)
                if len(accepted) >= 3000 and not killed.is_set():
                    killed.set()
                    d.proc.kill()

        await asyncio.gather(*(writer(w) for w in range(8)))
    d.proc.wait(timeout=10)
    assert killed.is_set() and d.proc.returncode == -9

    restarted = start_daemon(short_tmp)
    try:
        ids = [r["client_message_id"] for r in restarted.outbox_rows()]
        assert len(ids) == len(set(ids)), "a send has two rows"
        assert accepted <= set(ids), f"lost {len(accepted - set(ids))} sends answered 202"
        assert set(ids) <= started
        for batch in unanswered:
            assert batch <= set(ids) or not batch & set(ids), "a batch was half stored"
        assert set(ids) - accepted <= set().union(*unanswered)
        print(f"accepted={len(accepted)} rows={len(ids)} unanswered_batches={len(unanswered)}")
    finally:
        assert restarted.stop() == 0
