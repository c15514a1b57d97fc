"""Inbox, named consumers and the resumable event stream, over the real socket."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.local_app import SENDER, delivery, local_app
from tidemesh.daemon.store.inbox import Page, Void


async def _read_events(resp: aiohttp.ClientResponse, n: int) -> list[tuple[int, str, str]]:
    """Read n events (id, type, data line) from an SSE response."""
    out: list[tuple[int, str, str]] = []
    ev: dict[str, str] = {}
    while len(out) < n:
        line = (await asyncio.wait_for(resp.content.readline(), 10)).decode().rstrip("\n")
        if line == "":
            if "id" in ev:
                out.append((int(ev["id"]), ev["event"], ev["data"]))
            ev = {}
        elif not line.startswith(":") and ":" in line:
            key, _, value = line.partition(": ")
            ev[key] = value
    return out


async def test_redelivery_is_stored_once(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        first = await app.inbox.store(delivery(1, "dup"))
        again = await app.inbox.store(delivery(2, "dup"))
        assert first.inbox_seq == 1 and again.inbox_seq is None and again.event is None
        other_sender = await app.inbox.store(delivery(3, "dup", sender="cd" * 32))
        assert other_sender.inbox_seq == 2, "dedupe is per sender"
        assert await app.inbox.receive_cursor() == (1, 3)


async def test_a_frame_is_stored_whole_with_duplicates_once_and_voids_moving_the_cursor(
    short_tmp: Path
) -> None:
    async with local_app(short_tmp) as app:
        results = await app.inbox.store_frame([
            delivery(1), delivery(2, "dup"), Void(1, 3, 0), delivery(4, "dup"), delivery(5)])
        assert [r.inbox_seq if r else "void" for r in results] == [1, 2, "void", None, 3]
        assert await app.inbox.receive_cursor() == (1, 5)


async def test_a_frame_with_one_bad_delivery_stores_it_dead_and_every_other_whole(
    short_tmp: Path
) -> None:
    # One delivery the database refuses must not cost the frame (nor a frame queued in the same
    # transaction) its other deliveries: the frame is retried item by item and the one that
    # fails alone is kept as a dead entry, so the cursor passes it and nothing after it waits.
    async with local_app(short_tmp) as app:
        bad = dataclasses.replace(delivery(4), body={"not": "bytes"})  # type: ignore[arg-type]
        good, mixed = await asyncio.gather(
            app.inbox.store_frame([delivery(1), delivery(2)]),
            app.inbox.store_frame([delivery(3), bad, delivery(5)]))
        assert [r.inbox_seq for r in good if r] == [1, 2]
        assert [r.inbox_seq for r in mixed if r] == [3, 4, 5]
        assert await app.inbox.receive_cursor() == (1, 5)
        items = (await app.inbox.page(Page(0, 10)))["items"]
        assert [e["client_message_id"] for e in items] == ["m1", "m2", "m3", "m4", "m5"]
        assert "tidemesh_dead" in items[3]["meta"] and items[3]["body"] == ""
        assert all("tidemesh_dead" not in (e["meta"] or {}) for e in items[:3] + items[4:])
        assert app.inbox.write_health.stored_dead == 1


async def test_a_message_event_carries_the_entry_as_the_inbox_serves_it(
    short_tmp: Path
) -> None:
    # The event is built from the values just inserted, not read back: it must still be the
    # entry GET /v1/inbox serves, base64 bodies, meta and reply_to included.
    binary = dataclasses.replace(delivery(2), body=b"\x00\xff", body_encoding="base64",
                                 meta=None, reply_to="01J0000000000000000000REPLY")
    async with local_app(short_tmp) as app:
        results = await app.inbox.store_frame([delivery(1), binary])
        async with app.session() as s, s.get("/v1/inbox") as r:
            served = (await r.json())["items"]
    events = [res.event.data for res in results if res is not None and res.event is not None]
    assert events == served and served[1]["body"] == "AP8="
    assert served[0]["meta"] == {"n": 1} and served[1]["reply_to"].endswith("REPLY")


async def test_inbox_pages_by_after_limit_topic_and_sender(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for i in range(1, 8):
            await app.inbox.store(delivery(i, topic="ops" if i % 2 else "dev",
                                           sender=SENDER if i < 5 else "cd" * 32))
        async with app.session() as s:
            async with s.get("/v1/inbox?after=2&limit=3") as r:
                page = await r.json()
            assert [e["seq"] for e in page["items"]] == [3, 4, 5] and page["next_after"] == 5
            async with s.get("/v1/inbox?topic=dev") as r:
                assert [e["seq"] for e in (await r.json())["items"]] == [2, 4, 6]
            async with s.get(f"/v1/inbox?from={'cd' * 32}") as r:
                assert [e["seq"] for e in (await r.json())["items"]] == [5, 6, 7]
            async with s.get("/v1/inbox?limit=0") as r:
                assert r.status == 400


async def test_named_consumer_gets_entries_again_until_it_acks(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for i in range(1, 6):
            await app.inbox.store(delivery(i))
        async with app.session() as s:
            async def read(limit: int = 3) -> list[int]:
                async with s.get(f"/v1/inbox?consumer=worker&limit={limit}") as r:
                    return [e["seq"] for e in (await r.json())["items"]]

            assert await read() == [1, 2, 3]
            assert await read() == [1, 2, 3], "no ack yet: the crash-before-ack case"
            async with s.post("/v1/inbox/ack", json={"consumer": "worker", "up_to": 2}) as r:
                assert (await r.json()) == {"consumer": "worker", "cursor": 2}
            assert await read() == [3, 4, 5]
            async with s.post("/v1/inbox/ack", json={"consumer": "worker", "up_to": 1}) as r:
                assert (await r.json())["cursor"] == 2, "a cursor never moves backwards"
            async with s.post("/v1/inbox/ack", json={"consumer": "worker", "up_to": 99}) as r:
                assert r.status == 400
            async with s.get("/v1/inbox?consumer=other") as r:
                assert len((await r.json())["items"]) == 5, "consumers are independent"


async def test_consumer_cursor_survives_a_restart(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for i in range(1, 4):
            await app.inbox.store(delivery(i))
        await app.inbox.consumer_ack("worker", 2)
    async with local_app(short_tmp) as app, app.session() as s, \
            s.get("/v1/inbox?consumer=worker") as r:
        assert [e["seq"] for e in (await r.json())["items"]] == [3]


async def test_sse_resumes_with_last_event_id_exactly(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        for i in range(1, 4):
            await app.inbox.store(delivery(i))
        async with app.session() as s:
            async with s.get("/v1/events") as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                got = await _read_events(r, 3)
                assert [(i, t) for i, t, _ in got] == [(1, "message"), (2, "message"),
                                                        (3, "message")]
                await app.inbox.store(delivery(4))
                live = await _read_events(r, 1)
                assert live[0][0] == 4 and '"seq":4' in live[0][2]
            for i in range(5, 8):
                await app.inbox.store(delivery(i))
            async with s.get("/v1/events", headers={"Last-Event-ID": "4"}) as r:
                assert [i for i, _, _ in await _read_events(r, 3)] == [5, 6, 7]
            async with s.get("/v1/events?since=6") as r:
                assert [i for i, _, _ in await _read_events(r, 1)] == [7]
            async with s.get("/v1/events?since=abc") as r:
                assert r.status == 400


async def test_sse_resumes_across_a_restart(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        await app.inbox.store(delivery(1))
        await app.inbox.record_event("outbox_dead", {"outbox_id": "X"}, dedupe_key="dead:X")
        assert await app.inbox.record_event("outbox_dead", {"outbox_id": "X"},
                                            dedupe_key="dead:X") is None
    async with local_app(short_tmp) as app:
        await app.inbox.store(delivery(2))
        async with app.session() as s, s.get("/v1/events", headers={"Last-Event-ID": "1"}) as r:
            assert [(i, t) for i, t, _ in await _read_events(r, 2)] == [
                (2, "outbox_dead"), (3, "message")]


async def test_sse_keepalive_comments_flow_when_idle(short_tmp: Path) -> None:
    async with local_app(short_tmp, sse_keepalive_s=0.2) as app, app.session() as s, \
            s.get("/v1/events") as r:
        seen = b""
        while b": keepalive" not in seen:
            seen += await asyncio.wait_for(r.content.readline(), 5)


async def test_a_stalled_stream_is_dropped_and_others_keep_flowing(short_tmp: Path) -> None:
    async with local_app(short_tmp, sse_buffer=5) as app, app.session() as s:
        stalled = await s.get("/v1/events")
        healthy = await s.get("/v1/events")
        await _read_events(healthy, 0)
        await asyncio.sleep(0.1)
        assert app.bus.subscribers == 2
        # The stalled client never reads; its handler is blocked writing, its buffer fills.
        big = "x" * 200_000
        for i in range(1, 40):
            await app.inbox.store(delivery(i, body=big))
            got = await _read_events(healthy, 1)
            assert got[0][0] == i
        assert app.bus.dropped_total >= 1 and app.bus.subscribers == 1
        stalled.close()
        healthy.close()


async def test_too_many_streams_is_429(short_tmp: Path) -> None:
    async with local_app(short_tmp, max_streams=2) as app, app.session() as s:
        a, b = await s.get("/v1/events"), await s.get("/v1/events")
        await asyncio.sleep(0.1)
        async with s.get("/v1/events") as r:
            assert r.status == 429
            assert (await r.json())["error"]["reason"] == "too_many_streams"
        a.close()
        b.close()


@pytest.mark.parametrize("body", [{"consumer": "w"}, {"consumer": "", "up_to": 1},
                                  {"consumer": "w", "up_to": -1}, {"up_to": 1}])
async def test_bad_acks_are_400(short_tmp: Path, body: dict[str, object]) -> None:
    async with local_app(short_tmp) as app, app.session() as s, \
            s.post("/v1/inbox/ack", json=body) as r:
        assert r.status == 400




async def test_closing_the_bus_ends_open_streams(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app, app.session() as s, s.get("/v1/events") as r:
        await asyncio.sleep(0.1)
        app.bus.close()
        rest = await asyncio.wait_for(r.content.read(), 5)
        assert b": keepalive" not in rest and app.bus.subscribers == 0


async def test_a_page_stops_at_its_byte_budget_and_links_to_the_next(short_tmp: Path) -> None:
    # 1,000 entries of 1 MB were one 400 MB response held whole in the daemon's memory.
    async with local_app(short_tmp) as app:
        for i in range(1, 13):
            await app.inbox.store(delivery(i, body="x" * (1024 * 1024)))
        seen: list[int] = []
        url = "/v1/inbox?limit=1000"
        async with app.session() as s:
            for _ in range(5):
                async with s.get(url) as r:
                    page = await r.json()
                    link = r.headers.get("Link")
                seen += [e["seq"] for e in page["items"]]
                assert len(page["items"]) <= 10
                if not page["more"]:
                    assert link is None
                    break
                assert link is not None and f"after={page['next_after']}" in link
                url = link.split(">")[0].lstrip("<")
            async with s.get("/v1/inbox?consumer=big&limit=1000") as r:
                consumer = await r.json()
    assert seen == list(range(1, 13)), "every entry once, in order, over two pages"
    assert consumer["more"] is True and len(consumer["items"]) < 12

