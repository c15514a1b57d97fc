"""One contract, both adapters: the accept transaction of spec §4.6.2/§4.7.2 and retention."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import pytest

from tests.broker.conftest import LIMITS, accept_input, new_pubkey, now_ms
from tidemesh.broker.accept import Limits, pick_queue_consumer
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import NotFound
from tidemesh.core.fingerprint import prefix
from tidemesh.core.ids import new_ulid


@dataclass
class World:
    mesh_id: str
    alice: str
    bob: str
    carol: str


async def _world(store: Store) -> World:
    t = now_ms()
    mesh = await store.create_mesh("m-" + new_pubkey()[:8], t)
    w = World(mesh.id, new_pubkey(), new_pubkey(), new_pubkey())
    for pk in (w.alice, w.bob, w.carol):
        await store.add_member(mesh.id, pk, t)
    await store.create_topic(mesh.id, "ops", w.alice, t)
    for pk in (w.alice, w.bob, w.carol):
        await store.subscribe(mesh.id, "ops", pk, t)
    return w


async def _handed(store: Store, w: World, at: int | None = None) -> None:
    """What the pumps do first: each member is handed what its topics logged."""
    for pk in (w.alice, w.bob, w.carol):
        await store.hand_out(w.mesh_id, pk, at or now_ms())


async def _subscribers(store: Store, mesh_id: str, *topics: str) -> dict[str, list[str]]:
    got = await store.topic_subscribers([(mesh_id, t) for t in topics])
    return {t: sorted(members) for (_, t), members in got.items()}


async def test_first_send_is_201_with_every_row(store: Store) -> None:
    w = await _world(store)
    r = await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    assert r.status == 201 and r.broker_message_id and r.history_id
    # Its subscribers are not listed by the accept; they are read after it, to be woken.
    assert r.deliveries == ()
    assert await _subscribers(store, w.mesh_id, "ops", "none") == {
        "ops": sorted([w.alice, w.bob, w.carol]), "none": []}
    counts = await store.counts()
    # A topic message is written once, whatever its subscribers (DESIGN §11).
    assert (counts["client_message_dedupe"], counts["topic_message"],
            counts["message_history"], counts["delivery_queue"],
            counts["topic_delivery"]) == (1, 1, 1, 0, 0)
    await _handed(store, w)
    assert (await store.counts())["topic_delivery"] == 2   # a span each for bob and carol


async def test_a_topic_accept_writes_the_same_rows_for_any_number_of_subscribers(
        store: Store) -> None:
    w = await _world(store)
    before = await store.counts()
    await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    few = await store.counts()
    for _ in range(50):
        pk = new_pubkey()
        await store.add_member(w.mesh_id, pk, now_ms())
        await store.subscribe(w.mesh_id, "ops", pk, now_ms())
    before_many = await store.counts()
    await store.accept(accept_input(w.mesh_id, w.alice, "c2"))
    many = await store.counts()
    written = {t: few[t] - before[t] for t in few}
    assert written == {t: many[t] - before_many[t] for t in many}
    assert sum(written.values()) == 3    # dedupe, message, history


async def test_spans_give_each_member_its_stream_without_its_own_messages(
        store: Store) -> None:
    w = await _world(store)
    senders = [w.alice, w.bob, w.bob, w.alice, w.carol, w.alice]
    for i, pk in enumerate(senders):
        await store.accept(accept_input(w.mesh_id, pk, f"c{i}", body=f"m{i}"))
    await _handed(store, w)
    for pk in (w.alice, w.bob, w.carol):
        rows = await store.deliveries_after(w.mesh_id, pk, 1, 0, 100)
        assert [r.body.decode() for r in rows] == [
            f"m{i}" for i, s in enumerate(senders) if s != pk]
        assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
        # Read from any point, the same seq names the same message.
        for after in range(len(rows)):
            again = await store.deliveries_after(w.mesh_id, pk, 1, after, 2)
            assert [(r.seq, r.body) for r in again] == [(r.seq, r.body)
                                                        for r in rows[after:after + 2]]


async def test_pumps_woken_together_share_hand_outs_reads_and_acks(store: Store) -> None:
    w = await _world(store)
    for i in range(4):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}", body=f"m{i}"))
    await store.accept(accept_input(w.mesh_id, w.bob, "dm", kind="dm", ref=w.carol))
    members = [w.alice, w.bob, w.carol] * 3
    await asyncio.gather(*(store.hand_out(w.mesh_id, pk, now_ms()) for pk in members))
    alone = {pk: await store.deliveries_after(w.mesh_id, pk, 1, 1, 10) for pk in members}
    together = await asyncio.gather(*(store.deliveries_after(w.mesh_id, pk, 1, 1, 10)
                                      for pk in members))
    assert [alone[pk] for pk in members] == together
    assert [len(alone[pk]) for pk in (w.alice, w.bob, w.carol)] == [0, 3, 4]
    moved = await asyncio.gather(*(store.ack(w.mesh_id, pk, 1, seq, now_ms())
                                   for pk, seq in [(w.bob, 2), (w.bob, 4), (w.carol, 5)]))
    assert sum(moved[:2]) == 4 and moved[2] == 5
    assert [(await store.cursor(w.mesh_id, pk)).acked_seq for pk in (w.bob, w.carol)] == [4, 5]


async def test_a_pumps_page_read_with_its_hand_out_is_the_page_read_after_it(
        store: Store) -> None:
    """A wake-up's page comes with its hand-out (on PostgreSQL, a caught-up member's is built
    from the spans it was just given): every field of it is what a later read of the same
    seqs returns, for a member caught up, one behind, one after a DM, and a short page."""
    w = await _world(store)
    dave = new_pubkey()
    await store.add_member(w.mesh_id, dave, now_ms())
    await store.subscribe(w.mesh_id, "ops", dave, now_ms())
    await store.accept(accept_input(w.mesh_id, w.alice, "t0", body="zero"))
    await store.accept(accept_input(w.mesh_id, w.alice, "d0", kind="dm", ref=w.carol))
    for pk in (w.bob, w.carol, dave):
        await store.hand_out(w.mesh_id, pk, now_ms())
    extra = {"meta": {"k": "v"}, "reply_to": "01J0000000000000000000000R",
             "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    await store.accept(accept_input(w.mesh_id, w.alice, "t1", body="one", **extra))
    await store.accept(accept_input(w.mesh_id, w.bob, "t2", body="two"))
    await store.accept(accept_input(w.mesh_id, w.alice, "t3", body="AAEC",
                                    body_encoding="base64"))
    # bob: caught up (sent seq 1); carol: sent nothing yet; dave: caught up, a page of 1.
    asks = [(w.bob, 1, 10), (w.carol, 0, 10), (dave, 1, 1), (w.alice, 0, 10)]
    got = await asyncio.gather(*(store.hand_out_page(w.mesh_id, pk, 1, after, limit, now_ms(),
                                                     logged=True)
                                 for pk, after, limit in asks))
    for (pk, after, limit), (_, rows) in zip(asks, got, strict=True):
        assert rows == await store.deliveries_after(w.mesh_id, pk, 1, after, limit)
    assert [[r.body for r in rows] for _, rows in got] == [
        [b"one", b"\x00\x01\x02"], [b"zero", b"hello", b"one", b"two", b"\x00\x01\x02"],
        [b"one"], [b"two"]]
    bob = got[0][1]
    assert (bob[0].meta, bob[0].reply_to, bob[0].traceparent) == (
        extra["meta"], extra["reply_to"], extra["traceparent"])
    assert [r.seq for r in bob] == [2, 3] and bob[0].history_id


async def test_pages_read_together_are_the_pages_read_alone(store: Store) -> None:
    """Pages of many pumps are read at once, each message's content once (on PostgreSQL:
    the seqs of each page first, then the content): every page, from any point and of any
    length, is what the same read alone returns, across DMs, topic runs and their ends."""
    w = await _world(store)
    plan = [(w.alice, "topic", "ops"), (w.alice, "topic", "ops"), (w.carol, "dm", w.bob),
            (w.alice, "topic", "ops"), (w.bob, "topic", "ops"), (w.alice, "dm", w.bob),
            (w.carol, "topic", "ops"), (w.alice, "topic", "ops")]
    for i, (sender, kind, ref) in enumerate(plan):
        await store.accept(accept_input(w.mesh_id, sender, f"c{i}", kind=kind, ref=ref,
                                        body=f"m{i}", meta={"i": i}))
    await _handed(store, w)
    asks = [(pk, after, limit) for pk in (w.alice, w.bob, w.carol)
            for after in range(0, 8) for limit in (1, 2, 3, 100)]
    alone = [await store.deliveries_after(w.mesh_id, pk, 1, after, limit)
             for pk, after, limit in asks]
    together = await asyncio.gather(*(store.deliveries_after(w.mesh_id, pk, 1, after, limit)
                                      for pk, after, limit in asks))
    assert together == alone
    bob = alone[asks.index((w.bob, 0, 100))]
    assert [(r.body, r.kind, r.meta) for r in bob] == [
        (f"m{i}".encode(), kind, {"i": i}) for i, (sender, kind, ref) in enumerate(plan)
        if sender != w.bob and (kind == "topic" or ref == w.bob)]


async def test_a_dm_after_a_topic_message_keeps_its_senders_order(store: Store) -> None:
    w = await _world(store)
    await store.accept(accept_input(w.mesh_id, w.alice, "t1", body="first"))
    await store.accept(accept_input(w.mesh_id, w.alice, "d1", kind="dm", ref=w.bob,
                                    body="second"))
    await store.accept(accept_input(w.mesh_id, w.alice, "t2", body="third"))
    await _handed(store, w)
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 0, 100)
    assert [(r.seq, r.body) for r in rows] == [(1, b"first"), (2, b"second"), (3, b"third")]


async def test_a_senders_order_holds_across_topics_and_dms_in_one_batch(
        store: Store) -> None:
    w = await _world(store)
    await store.create_topic(w.mesh_id, "alpha", w.alice, now_ms())   # before "ops" by name
    await store.subscribe(w.mesh_id, "alpha", w.bob, now_ms())
    sends = [("ops", "topic"), (w.bob, "dm"), ("alpha", "topic"), ("ops", "topic"),
             (w.bob, "dm"), ("alpha", "topic")]
    results = await store.accept_batch([
        accept_input(w.mesh_id, w.alice, f"c{i}", kind=kind, ref=ref, body=f"m{i}")
        for i, (ref, kind) in enumerate(sends)])
    assert all(r.status == 201 for r in results)
    await store.accept(accept_input(w.mesh_id, w.alice, "d", kind="dm", ref=w.bob, body="m6"))
    await store.hand_out(w.mesh_id, w.bob, now_ms())
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 0, 100)
    assert [(r.seq, r.body.decode()) for r in rows] == [(i + 1, f"m{i}") for i in range(7)]


async def test_a_new_subscriber_gets_what_is_logged_after_it_subscribed(store: Store) -> None:
    w = await _world(store)
    await store.accept(accept_input(w.mesh_id, w.alice, "c1", body="before"))
    dave = new_pubkey()
    await store.add_member(w.mesh_id, dave, now_ms())
    await store.subscribe(w.mesh_id, "ops", dave, now_ms())
    await store.accept(accept_input(w.mesh_id, w.alice, "c2", body="after"))
    await store.hand_out(w.mesh_id, dave, now_ms())
    rows = await store.deliveries_after(w.mesh_id, dave, 1, 0, 100)
    assert [(r.seq, r.body) for r in rows] == [(1, b"after")]


async def test_an_unsubscribe_keeps_what_the_topic_logged_while_subscribed(
        store: Store) -> None:
    """Messages logged before the unsubscribe and not yet handed out (the member's pump had
    not run, or it was offline) are still the member's; those after it are not."""
    w = await _world(store)
    await store.hand_out(w.mesh_id, w.bob, now_ms())
    await store.accept(accept_input(w.mesh_id, w.alice, "c1", body="while subscribed 1"))
    await store.accept(accept_input(w.mesh_id, w.alice, "c2", body="while subscribed 2"))
    await store.unsubscribe(w.mesh_id, "ops", w.bob, now_ms())
    await store.accept(accept_input(w.mesh_id, w.alice, "c3", body="after"))
    await store.hand_out(w.mesh_id, w.bob, now_ms())
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 0, 100)
    assert [(r.seq, r.body) for r in rows] == [(1, b"while subscribed 1"),
                                               (2, b"while subscribed 2")]
    # Carol, still subscribed, has all three.
    await store.hand_out(w.mesh_id, w.carol, now_ms())
    assert len(await store.deliveries_after(w.mesh_id, w.carol, 1, 0, 100)) == 3


async def test_hundred_concurrent_same_id_sends_give_one_message(store_url: str) -> None:
    # Several store instances stand for several broker connections/processes on one database.
    stores = [await open_store(store_url) for _ in range(3)]
    try:
        w = await _world(stores[0])
        results = await asyncio.gather(*(
            stores[i % 3].accept(accept_input(w.mesh_id, w.alice, "same-id")) for i in range(100)
        ))
        assert sorted(r.status for r in results).count(201) == 1
        assert {r.status for r in results} == {200, 201}
        assert len({r.broker_message_id for r in results}) == 1
        assert len({r.history_id for r in results}) == 1
        assert all(r.history_available for r in results)
        counts = await stores[0].counts()
        assert counts["client_message_dedupe"] == 1
        assert counts["topic_message"] == 1
        assert counts["message_history"] == 1
        assert counts["delivery_queue"] == 0
    finally:
        for s in stores:
            await s.close()


async def test_hand_outs_racing_accepts_on_several_stores_skip_and_repeat_nothing(
        store_url: str) -> None:
    # Several brokers on one database: accepts of two senders commit while every store hands
    # bob his topic entries; each entry takes exactly one seq, in one gapless stream.
    stores = [await open_store(store_url) for _ in range(3)]
    try:
        w = await _world(stores[0])

        async def sends(sender: str) -> None:
            for i in range(30):
                await stores[i % 3].accept(accept_input(w.mesh_id, sender, f"{sender[:4]}{i}"))

        async def hand_outs() -> None:
            for i in range(40):
                await stores[i % 3].hand_out(w.mesh_id, w.bob, now_ms())
                await asyncio.sleep(0)

        await asyncio.gather(sends(w.alice), sends(w.carol), hand_outs(), hand_outs())
        await stores[1].hand_out(w.mesh_id, w.bob, now_ms())
        views = [await s.deliveries_after(w.mesh_id, w.bob, 1, 0, 1000) for s in stores]
        assert views[0] == views[1] == views[2]
        assert [r.seq for r in views[0]] == list(range(1, 61))
        assert len({r.broker_message_id for r in views[0]}) == 60
        for sender in (w.alice, w.carol):   # each sender's order holds
            mine = [r.client_message_id for r in views[0] if r.sender_pubkey == sender]
            assert mine == [f"{sender[:4]}{i}" for i in range(30)]
    finally:
        for s in stores:
            await s.close()


@pytest.mark.parametrize("change", [
    {"body": "other"}, {"priority": "now"}, {"meta": {"a": 1}}, {"ref": "other"},
    {"kind": "dm", "ref": "0" * 64}, {"reply_to": "01J0000000000000000000000A"},
])
async def test_same_id_other_request_is_409_and_writes_nothing(
    store: Store, change: dict[str, object]
) -> None:
    w = await _world(store)
    first = await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    before = await store.counts()
    second = accept_input(w.mesh_id, w.alice, "c1", **change)
    r = await store.accept(second)
    assert r.status == 409
    frame = r.to_frame("q")
    assert frame["error"]["code"] == "idempotency_key_reused"
    assert frame["conflict"] == "request_fingerprint_mismatch"
    assert frame["broker_fingerprint_prefix"] == prefix(
        accept_input(w.mesh_id, w.alice, "c1").fingerprint)
    assert first.status == 201
    assert await store.counts() == before


async def test_duplicate_answer_carries_first_seen_and_history(store: Store) -> None:
    w = await _world(store)
    first = await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    again = await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    frame = again.to_frame("q")
    assert frame["status"] == 200 and frame["duplicate"] is True
    assert frame["broker_message_id"] == first.broker_message_id
    assert frame["history_id"] == first.history_id
    assert frame["history_available"] is True
    assert frame["first_seen_at"] == first.first_seen_at


async def test_unknown_topic_leaves_no_dedupe_row_then_succeeds(store: Store) -> None:
    w = await _world(store)
    r = await store.accept(accept_input(w.mesh_id, w.alice, "c1", ref="later"))
    assert r.status == 404
    assert r.to_frame("q")["error"]["code"] == "unknown_destination"
    counts = await store.counts()
    assert counts["client_message_dedupe"] == 0 and counts["topic_message"] == 0
    await store.create_topic(w.mesh_id, "later", None, now_ms())
    assert (await store.accept(accept_input(w.mesh_id, w.alice, "c1", ref="later"))).status == 201


async def test_unknown_dm_recipient_and_consumerless_queue_are_b2(store: Store) -> None:
    w = await _world(store)
    dm = await store.accept(accept_input(w.mesh_id, w.alice, "d1", kind="dm", ref="a" * 64))
    q = await store.accept(accept_input(w.mesh_id, w.alice, "q1", kind="queue", ref="jobs"))
    assert (dm.status, q.status) == (404, 404)
    assert (await store.counts())["client_message_dedupe"] == 0
    await store.add_queue_consumer(w.mesh_id, "jobs", w.carol, now_ms())
    ok_dm = await store.accept(accept_input(w.mesh_id, w.alice, "d1", kind="dm", ref=w.bob))
    ok_q = await store.accept(accept_input(w.mesh_id, w.alice, "q1", kind="queue", ref="jobs"))
    assert [d.recipient_pubkey for d in ok_dm.deliveries] == [w.bob]
    assert [d.recipient_pubkey for d in ok_q.deliveries] == [w.carol]
    assert (await store.counts())["message_queue"] == 2


async def test_a_revoked_member_is_no_subscriber_though_its_subscription_stays(
        store: Store) -> None:
    w = await _world(store)
    assert await store.revoke_member(w.mesh_id, w.bob, now_ms())
    assert await _subscribers(store, w.mesh_id, "ops") == {"ops": sorted([w.alice, w.carol])}


async def test_a_dm_to_a_revoked_member_says_revoked(store: Store) -> None:
    w = await _world(store)
    assert await store.revoke_member(w.mesh_id, w.bob, now_ms())
    dm = await store.accept(accept_input(w.mesh_id, w.alice, "d1", kind="dm", ref=w.bob))
    unknown = await store.accept(accept_input(w.mesh_id, w.alice, "d2", kind="dm",
                                              ref="a" * 64))
    assert (dm.status, unknown.status) == (404, 404)
    assert dm.error is not None and unknown.error is not None
    assert "revoked" in dm.error.message and w.bob[:16] in dm.error.message
    assert "no such member" in unknown.error.message
    assert (await store.counts())["client_message_dedupe"] == 0, "nothing stored"


async def test_b2_failure_in_a_concurrent_batch_spares_the_others(store: Store) -> None:
    w = await _world(store)
    items = [accept_input(w.mesh_id, w.alice, f"c{i}", ref="ops" if i % 5 else "nope")
             for i in range(50)]
    results = await asyncio.gather(*(store.accept(a) for a in items))
    assert [r.status for r in results] == [404 if i % 5 == 0 else 201 for i in range(50)]
    counts = await store.counts()
    assert counts["client_message_dedupe"] == 40 and counts["message_history"] == 40


async def test_keys_belong_to_their_sender(store: Store) -> None:
    w = await _world(store)
    a = await store.accept(accept_input(w.mesh_id, w.alice, "shared", body="from alice"))
    b = await store.accept(accept_input(w.mesh_id, w.bob, "shared", body="from bob"))
    assert (a.status, b.status) == (201, 201)
    assert a.broker_message_id != b.broker_message_id


async def test_per_recipient_sequence_is_gapless_under_concurrency(store: Store) -> None:
    w = await _world(store)
    results = await asyncio.gather(*(
        store.accept(accept_input(w.mesh_id, w.alice, f"c{i}")) for i in range(60)))
    assert all(r.status == 201 for r in results)
    await _handed(store, w)
    for pk in (w.bob, w.carol):
        rows = await store.deliveries_after(w.mesh_id, pk, 1, 0, 1000)
        assert sorted(r.broker_message_id for r in rows) == sorted(
            r.broker_message_id for r in results)
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 0, 1000)
    assert [r.seq for r in rows] == list(range(1, 61))
    assert rows[0].body == b"hello" and rows[0].sender_pubkey == w.alice


async def test_cumulative_ack_moves_the_cursor(store: Store) -> None:
    w = await _world(store)
    for i in range(5):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}"))
    await _handed(store, w)
    assert await store.ack(w.mesh_id, w.bob, 1, 3, now_ms()) == 3
    cur = await store.cursor(w.mesh_id, w.bob)
    assert (cur.epoch, cur.last_seq, cur.acked_seq) == (1, 5, 3)
    assert await store.ack(w.mesh_id, w.bob, 1, 2, now_ms()) == 0
    assert (await store.cursor(w.mesh_id, w.bob)).acked_seq == 3


async def test_each_delivery_is_acked_once_across_many_acks(store: Store) -> None:
    # The ack reads only the rows above the cursor's acked_seq: a delivery stored after an
    # ack past the end (acked_seq stays at last_seq) must still be acked by the next one.
    w = await _world(store)
    for i in range(5):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}"))
    await _handed(store, w)
    acked = [await store.ack(w.mesh_id, w.bob, 1, seq, now_ms()) for seq in (2, 5, 9)]
    assert acked == [2, 3, 0]
    assert (await store.cursor(w.mesh_id, w.bob)).acked_seq == 5
    for i in range(5, 7):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}"))
    await _handed(store, w)
    assert await store.ack(w.mesh_id, w.bob, 1, 9, now_ms()) == 2
    assert await store.ack(w.mesh_id, w.carol, 1, 7, now_ms()) == 7
    assert (await store.cursor(w.mesh_id, w.bob)).acked_seq == 7


async def test_expired_dedupe_rows_are_deleted(store: Store) -> None:
    w = await _world(store)
    t0 = now_ms()
    short = Limits(LIMITS.inline_bytes, "retention_scoped", 3)
    await store.accept(accept_input(w.mesh_id, w.alice, "old", limits=short, at=t0))
    await store.accept(accept_input(w.mesh_id, w.alice, "new", at=t0))
    assert await store.delete_expired_dedupe(t0 + 4 * 86_400_000) == 1
    assert (await store.counts())["client_message_dedupe"] == 1


async def test_permanent_mode_rows_never_expire(store: Store) -> None:
    w = await _world(store)
    perm = Limits(LIMITS.inline_bytes, "permanent", 0)
    await store.accept(accept_input(w.mesh_id, w.alice, "p", limits=perm))
    assert await store.delete_expired_dedupe(now_ms() + 10_000 * 86_400_000) == 0


async def test_pruning_a_message_flips_history_available(store: Store) -> None:
    w = await _world(store)
    t0 = now_ms()
    first = await store.accept(accept_input(w.mesh_id, w.alice, "c1", at=t0))
    await _handed(store, w, t0)
    assert await store.prune_messages(t0 + 1, t0 - 1) == 0, "not acked yet"
    for pk in (w.bob, w.carol):
        await store.ack(w.mesh_id, pk, 1, 1, t0)
    assert await store.prune_messages(t0 + 1, t0 + 1) == 1
    counts = await store.counts()
    assert (counts["topic_message"], counts["message_history"], counts["delivery_queue"],
            counts["topic_delivery"]) == (0, 0, 0, 0)
    again = await store.accept(accept_input(w.mesh_id, w.alice, "c1"))
    assert (again.status, again.history_available) == (200, False)
    assert again.broker_message_id == first.broker_message_id
    assert (await store.cursor(w.mesh_id, w.bob)).compacted_seq == 1


async def test_pruning_moves_each_recipients_compacted_seq_to_its_last_pruned(
    store: Store
) -> None:
    w = await _world(store)
    t0 = now_ms()
    for i in range(3):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}", at=t0 + i))
    await _handed(store, w, t0)
    for pk in (w.bob, w.carol):
        await store.ack(w.mesh_id, pk, 1, 3, t0)
    assert await store.prune_messages(t0 + 2, t0 + 2) == 2   # the two oldest
    cursors = [await store.cursor(w.mesh_id, pk) for pk in (w.alice, w.bob, w.carol)]
    assert [(c.last_seq, c.compacted_seq) for c in cursors] == [(0, 0), (3, 2), (3, 2)]
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 2, 10)
    assert [r.seq for r in rows] == [3], "the span's kept entry keeps its seq"


async def test_an_entry_pruned_before_it_was_handed_out_is_compacted(store: Store) -> None:
    # A member away past the stall window: its entries were pruned unseen; it is handed
    # their seqs as compacted, so that its daemon hears STALE_SEQUENCE, and then the rest.
    w = await _world(store)
    t0 = now_ms()
    for i in range(3):
        await store.accept(accept_input(w.mesh_id, w.alice, f"c{i}", at=t0 + i, body=f"m{i}"))
    assert await store.prune_messages(t0 + 2, t0 + 2) == 2
    await store.hand_out(w.mesh_id, w.bob, t0)
    cur = await store.cursor(w.mesh_id, w.bob)
    assert (cur.last_seq, cur.compacted_seq) == (3, 2)
    rows = await store.deliveries_after(w.mesh_id, w.bob, 1, 2, 10)
    assert [(r.seq, r.body) for r in rows] == [(3, b"m2")]


async def test_unacked_deliveries_inside_the_stall_window_are_kept(store: Store) -> None:
    w = await _world(store)
    t0 = now_ms()
    await store.accept(accept_input(w.mesh_id, w.alice, "c1", at=t0))
    assert await store.prune_messages(t0 + 1, t0 - 1) == 0
    assert (await store.counts())["topic_message"] == 1


async def test_invites_are_single_use_and_revocation_sticks(store: Store) -> None:
    t = now_ms()
    mesh = await store.create_mesh("inv", t)
    await store.create_invite(mesh.id, b"h" * 32, 1, None, t)
    a, b = new_pubkey(), new_pubkey()
    assert (await store.redeem_invite(mesh.id, b"h" * 32, a, "a", t)).pubkey == a
    assert (await store.redeem_invite(mesh.id, b"h" * 32, a, "a", t)).pubkey == a  # retried
    with pytest.raises(Exception, match="used up"):
        await store.redeem_invite(mesh.id, b"h" * 32, b, None, t)
    assert await store.revoke_member(mesh.id, a, t)
    member = await store.get_member(mesh.id, a)
    assert member is not None and member.revoked_at == t
    assert [m.pubkey for m in await store.list_members(mesh.id)] == [a]



async def test_a_hellos_one_read_finds_the_mesh_and_its_member_as_they_are(
        store: Store) -> None:
    t = now_ms()
    mesh = await store.create_mesh("hello-read", t)
    other = await store.create_mesh("hello-read-other", t)
    a, b = new_pubkey(), new_pubkey()
    await store.add_member(mesh.id, a, t)
    await store.add_member(other.id, b, t)
    assert await store.mesh_member(mesh.id, a) == (mesh, await store.get_member(mesh.id, a))
    assert await store.mesh_member(mesh.id, b) == (mesh, None)       # another mesh's member
    assert await store.mesh_member(mesh.name, a) == (None, None)    # by id only, not by name
    assert await store.mesh_member(new_ulid(t), a) == (None, None)
    await store.revoke_member(mesh.id, a, t + 1)
    found = (await store.mesh_member(mesh.id, a))[1]
    assert found is not None and found.revoked_at == t + 1


async def test_a_member_that_leaves_is_revoked_with_its_memberships_and_deliveries_gone(
        store: Store) -> None:
    w = await _world(store)
    await store.add_queue_consumer(w.mesh_id, "jobs", w.bob, now_ms())
    await store.accept(accept_input(w.mesh_id, w.alice, "c1"))      # topic: bob, carol
    await _handed(store, w)
    removed = await store.leave_member(w.mesh_id, w.bob, now_ms())
    assert removed == {"subscriptions": 1, "queues": 1, "deliveries": 1}
    member = await store.get_member(w.mesh_id, w.bob)
    assert member is not None and member.revoked_at is not None
    assert (await store.accept(accept_input(w.mesh_id, w.alice, "c2"))).status == 201
    assert await _subscribers(store, w.mesh_id, "ops") == {"ops": sorted([w.alice, w.carol])}
    assert await store.leave_member(w.mesh_id, w.bob, now_ms()) is None   # once


async def test_invite_refusals_say_whether_unknown_expired_or_used_up(store: Store) -> None:
    t = now_ms()
    mesh = await store.create_mesh("refusals", t)
    await store.create_invite(mesh.id, b"u" * 32, 1, None, t)
    await store.create_invite(mesh.id, b"e" * 32, 5, t - 1, t - 10)
    await store.redeem_invite(mesh.id, b"u" * 32, new_pubkey(), None, t)
    for token, reason, words in [(b"u" * 32, "invite_invalid:used_up", "used up"),
                                 (b"e" * 32, "invite_invalid:expired", "expired"),
                                 (b"x" * 32, "invite_invalid:unknown", "unknown")]:
        with pytest.raises(NotFound, match=words) as info:
            await store.redeem_invite(mesh.id, token, new_pubkey(), None, t)
        assert info.value.details["reason"] == reason

async def test_queue_pick_is_the_same_on_every_store(store: Store) -> None:
    w = await _world(store)
    for pk in (w.alice, w.bob, w.carol):
        await store.add_queue_consumer(w.mesh_id, "jobs", pk, now_ms())
    for i in range(12):
        a = accept_input(w.mesh_id, w.alice, f"q{i}", kind="queue", ref="jobs")
        r = await store.accept(a)
        assert [d.recipient_pubkey for d in r.deliveries] == [
            pick_queue_consumer([w.alice, w.bob, w.carol], a.broker_message_id)]


async def test_lapsed_leases_of_a_lone_consumer_do_not_hold_up_other_queues(
    store: Store
) -> None:
    # A lapsed delivery whose queue has no other live consumer stays with it; older ones of
    # those must not fill the sweep's page and keep a movable delivery from moving.
    w = await _world(store)
    t0 = now_ms() - 60_000
    await store.add_queue_consumer(w.mesh_id, "solo", w.carol, t0)
    for pk in (w.bob, w.carol):
        await store.add_queue_consumer(w.mesh_id, "jobs", pk, t0)
    for i in range(3):
        await store.accept(accept_input(w.mesh_id, w.alice, f"s{i}", kind="queue", ref="solo",
                                        at=t0 + i))
    job = await store.accept(accept_input(w.mesh_id, w.alice, "j", kind="queue", ref="jobs",
                                          at=t0 + 10))
    held_by = job.deliveries[0].recipient_pubkey
    moved = await store.reassign_lapsed(t0 + 1_000, now_ms(), limit=2)
    assert [(m.broker_message_id, m.from_pubkey) for m in moved] == [
        (job.broker_message_id, held_by)]


@pytest.mark.postgres
async def test_postgres_send_the_database_refuses_fails_alone(pg_database: str) -> None:
    # A NUL byte passes no B1 check of ours here (the input is built directly) but PostgreSQL
    # refuses it in text: the batch fails as a whole and is redone one savepoint per send.
    store = await open_store(pg_database)
    try:
        w = await _world(store)
        good = [accept_input(w.mesh_id, w.alice, f"c{i}") for i in range(20)]
        bad = replace(accept_input(w.mesh_id, w.alice, "bad"), ref="o\x00ps")
        results = await asyncio.gather(*(store.accept(a) for a in [*good, bad]))
        assert [r.status for r in results] == [201] * 20 + [503]
        counts = await store.counts()
        assert (counts["client_message_dedupe"], counts["topic_message"]) == (20, 20)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_send_the_database_refuses_fails_alone_in_its_frame(
    pg_database: str,
) -> None:
    # The same refusal inside one frame: the frame is redone one savepoint per send, in
    # order, so a later send of a key is still decided against the earlier one.
    store = await open_store(pg_database)
    try:
        w = await _world(store)
        good = [accept_input(w.mesh_id, w.alice, f"c{i}") for i in range(20)]
        bad = replace(accept_input(w.mesh_id, w.alice, "bad"), ref="o\x00ps")
        again = accept_input(w.mesh_id, w.alice, "c3")
        results = await store.accept_batch([*good[:10], bad, *good[10:], again])
        assert [r.status for r in results] == [201] * 10 + [503] + [201] * 10 + [200]
        assert results[-1].broker_message_id == results[3].broker_message_id
        counts = await store.counts()
        assert (counts["client_message_dedupe"], counts["topic_message"]) == (20, 20)
    finally:
        await store.close()
