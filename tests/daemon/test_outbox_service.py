"""``OutboxService.submit`` on a real outbox.db: what the accept table made of each send,
as a typed outcome with the row it hit; no HTTP involved (``api/responses`` maps it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tidemesh.core.errors import InsufficientStorage, InvalidRequest, SendVetoed, Unavailable
from tidemesh.core.outcome import Kind, Settlement
from tidemesh.core.send import SendRequest, parse_send_request
from tidemesh.daemon.process.stores import open_outbox
from tidemesh.daemon.records import Claimed, SendKind, SendOutcome
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.store import outbox as outbox_store


@pytest.fixture
async def outbox(tmp_path: Path) -> AsyncIterator[OutboxService]:
    db = await open_outbox(tmp_path / "outbox.db", 64)
    try:
        yield OutboxService(db)
    finally:
        await db.close()


def _req(body: str, cmid: str = "id-1") -> SendRequest:
    return parse_send_request({"to": "topic:ops", "body": body}, cmid)


async def test_submit_of_a_new_id_queues_a_new_pending_row(outbox: OutboxService) -> None:
    out = await outbox.submit(_req("hi"))
    assert (out.kind, out.queue_status, out.row.status) == (SendKind.NEW, "queued", "pending")
    assert out.client_message_id == "id-1" and out.row.fingerprint_prefix == out.fingerprint_prefix
    assert outbox.accepted.is_set(), "a new row wakes the sender"


async def test_submit_of_the_same_request_again_replays_its_row(outbox: OutboxService) -> None:
    first = await outbox.submit(_req("hi"))
    outbox.accepted.clear()
    again = await outbox.submit(_req("hi"))
    assert (again.kind, again.queue_status, again.row.id) == (SendKind.REPLAY, "queued",
                                                              first.row.id)
    assert not outbox.accepted.is_set(), "a replay queues nothing new"


async def test_submit_of_another_request_under_the_id_is_a_conflict(
        outbox: OutboxService) -> None:
    first = await outbox.submit(_req("hi"))
    out = await outbox.submit(_req("something else"))
    assert (out.kind, out.conflict) == (SendKind.CONFLICT, "outbox_pending_fingerprint_mismatch")
    assert out.row.id == first.row.id
    assert out.row.fingerprint_prefix != out.fingerprint_prefix


async def test_submit_without_an_id_makes_one(outbox: OutboxService) -> None:
    out = await outbox.submit(parse_send_request({"to": "topic:ops", "body": "hi"}))
    assert out.kind is SendKind.NEW and out.client_message_id


async def test_submit_many_decides_in_order_and_keeps_refused_items(
        outbox: OutboxService) -> None:
    refused = InvalidRequest("body: must be string", field="body")
    out = await outbox.submit_many([_req("hi"), refused, _req("hi"), _req("other"),
                                    _req("x", "id-2")])
    first, kept, again, conflict, second = out
    assert isinstance(first, SendOutcome) and first.kind is SendKind.NEW
    assert kept is refused
    assert isinstance(again, SendOutcome) and isinstance(conflict, SendOutcome)
    assert (again.kind, again.row.id) == (SendKind.REPLAY, first.row.id)
    assert (conflict.kind, conflict.conflict) == (SendKind.CONFLICT,
                                                  "outbox_pending_fingerprint_mismatch")
    assert isinstance(second, SendOutcome) and second.kind is SendKind.NEW


async def test_submit_many_keeps_a_gate_veto_to_its_item(tmp_path: Path) -> None:
    async def gate(req: SendRequest) -> None:
        if req.body == b"no":
            raise SendVetoed("vetoed", reason="no")

    db = await open_outbox(tmp_path / "outbox.db", 64)
    try:
        out = await OutboxService(db, gate=gate).submit_many([_req("no", "a"), _req("ok", "b")])
        assert isinstance(out[0], SendVetoed)
        assert isinstance(out[1], SendOutcome) and out[1].kind is SendKind.NEW
    finally:
        await db.close()


async def test_submit_many_refuses_the_whole_batch_under_the_disk_floor(
        tmp_path: Path) -> None:
    def admit() -> None:
        raise InsufficientStorage("under the floor")

    db = await open_outbox(tmp_path / "outbox.db", 64)
    try:
        with pytest.raises(InsufficientStorage):
            await OutboxService(db, admit=admit).submit_many([_req("hi")])
    finally:
        await db.close()


async def test_sends_accepted_one_after_another_in_one_millisecond_go_out_in_that_order(
        tmp_path: Path) -> None:
    db = await open_outbox(tmp_path / "o.db", 64)
    try:
        frozen = OutboxService(db, clock=lambda: 1_700_000_000.0)  # every send in one ms
        for i in range(200):
            await frozen.submit(_req(f"m{i}", f"id-{i:03}"))
        claimed, _ = await frozen.claim(500, 86_400_000)
        assert [c.client_message_id for c in claimed] == [f"id-{i:03}" for i in range(200)]
    finally:
        await db.close()


async def test_settling_takes_each_claimed_row_once_and_leaves_the_rest(
    outbox: OutboxService
) -> None:
    for i in range(4):
        await outbox.submit(_req("hi", f"id-{i}"))
    claimed, _ = await outbox.claim(3, 3_600_000)
    a, b, c = (r.id for r in claimed)
    pending = (await outbox.list_rows("pending"))["items"][0]["id"]
    now = 1_700_000_000_000
    settled = await outbox.settle_many([
        Settlement(a, Kind.DONE, now, "bm-a", "h-a"),
        Settlement(pending, Kind.DONE, now, "bm-p", "h-p"),   # never claimed: stays pending
        Settlement(b, Kind.RETRY, now, last_error="TimeoutError", next_attempt_at=now),
        Settlement(a, Kind.DEAD, now, last_error="late"),      # settled above already
        Settlement(c, Kind.DONE, now, "bm-c", "h-c"),
    ])
    assert settled == [True, False, True, False, True]
    rows = {r: await outbox.inspect(r) for r in (a, b, c, pending)}
    assert [(rows[r]["status"], rows[r]["broker_message_id"]) for r in (a, b, c, pending)] == [
        ("done", "bm-a"), ("pending", None), ("done", "bm-c"), ("pending", None)]
    assert rows[a]["last_error"] is None and rows[b]["last_error"] == "TimeoutError"


class Hand:
    """A sender as ``OutboxService.hand`` sees it: offers ``places`` rows, takes them while
    ``live``; what it was given and given back."""

    def __init__(self, places: int = 1, live: bool = True) -> None:
        self.places, self.live = places, live
        self.taken: list[Claimed] = []
        self.released = 0

    def reserve(self) -> bool:
        if self.places <= 0:
            return False
        self.places -= 1
        return True

    def take(self, row: Claimed) -> bool:
        if not self.live:
            self.release()
            return False
        self.taken.append(row)
        return True

    def release(self) -> None:
        self.places += 1
        self.released += 1


async def test_a_lone_send_to_an_idle_sender_is_claimed_by_its_own_accept(
        outbox: OutboxService) -> None:
    outbox.hand = hand = Hand()
    out = await outbox.submit(_req("hi"))
    assert (out.kind, out.queue_status) == (SendKind.NEW, "queued"), "the caller sees a new send"
    [row] = hand.taken
    assert (row.id, row.client_message_id, row.attempts) == (out.row.id, "id-1", 1)
    assert orjson.loads(row.payload)["body"] == "hi"
    stored = await outbox.inspect(out.row.id)
    assert (stored["status"], stored["attempts"]) == ("inflight", 1)
    assert not outbox.accepted.is_set(), "the sender has it: no claim to wake for"
    assert (await outbox.claim(10, 3_600_000))[0] == [], "nor is it claimed a second time"


async def test_a_send_the_sender_has_no_room_for_waits_pending_and_wakes_it(
        outbox: OutboxService) -> None:
    outbox.hand = hand = Hand(places=1)
    await outbox.submit(_req("one", "id-1"))
    second = await outbox.submit(_req("two", "id-2"))
    assert [r.client_message_id for r in hand.taken] == ["id-1"]
    assert (await outbox.inspect(second.row.id))["status"] == "pending"
    assert outbox.accepted.is_set()
    assert [c.client_message_id for c in (await outbox.claim(10, 3_600_000))[0]] == ["id-2"]


async def test_a_replay_gives_its_place_back(outbox: OutboxService) -> None:
    outbox.hand = hand = Hand(places=2)
    first = await outbox.submit(_req("hi"))
    again = await outbox.submit(_req("hi"))
    assert (again.kind, again.row.id) == (SendKind.REPLAY, first.row.id)
    assert (len(hand.taken), hand.released, hand.places) == (1, 1, 1)


async def test_a_claimed_row_no_sender_took_goes_back_to_pending(
        outbox: OutboxService) -> None:
    outbox.hand = Hand(live=False)   # the session ended between the reservation and the commit
    out = await outbox.submit(_req("hi"))
    stored = await outbox.inspect(out.row.id)
    assert (stored["status"], stored["attempts"]) == ("pending", 0)
    assert outbox.accepted.is_set(), "the next sender claims it"
    [row] = (await outbox.claim(10, 3_600_000))[0]
    assert (row.id, row.attempts) == (out.row.id, 1)


async def test_a_row_released_and_claimed_again_is_not_unclaimed_by_a_late_accept(
        outbox: OutboxService) -> None:
    hand = outbox.hand = Hand()
    out = await outbox.submit(_req("hi"))
    assert await outbox.release_inflight() == 1   # the next session starts
    assert [r.id for r in (await outbox.claim(10, 3_600_000))[0]] == [out.row.id]
    assert await outbox.db.write(lambda c: outbox_store.unclaim(c, out.row.id)) is False
    assert (await outbox.inspect(out.row.id))["status"] == "inflight"
    assert hand.taken[0].id == out.row.id


async def test_an_accept_that_fails_gives_its_place_back(tmp_path: Path) -> None:
    db = await open_outbox(tmp_path / "o.db", 64)
    service = OutboxService(db)
    service.hand = hand = Hand()
    await db.close()
    with pytest.raises(Unavailable):
        await service.submit(_req("hi"))
    assert (hand.taken, hand.released, hand.places) == ([], 1, 1)
