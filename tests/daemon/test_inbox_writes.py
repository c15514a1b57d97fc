"""No single delivery stops the inbox writer: a frame that fails is stored item by item, the
one that fails alone as dead in its place, and failures in a row degrade health."""

from __future__ import annotations

from pathlib import Path

from tidemesh.daemon.process.stores import open_inbox
from tidemesh.daemon.records import Delivery
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.inbox_writes import UNHEALTHY_AFTER
from tidemesh.daemon.store import inbox


def _delivery(seq: int, meta: dict[str, object] | None = None) -> Delivery:
    return Delivery(id=f"m{seq}", mesh="t", sender_pubkey="aa" * 32, sender_name="alice",
                    client_message_id=f"c{seq}", broker_message_id=f"b{seq}", dest_kind="topic",
                    dest_ref="ops", body=b"body %d" % seq, body_encoding="utf8",
                    priority="next", meta=meta, reply_to=None, epoch=1, seq=seq, sent_at=1,
                    received_at=1)


async def test_one_unstorable_delivery_is_stored_dead_and_the_rest_arrive(short_tmp: Path) -> None:
    db = await open_inbox(short_tmp / "inbox.db")
    svc = InboxService(db, EventBus())
    try:
        # An integer past 64 bits: the writer cannot store this meta, whoever checked it.
        poison = _delivery(2, {"n": 2 ** 70})
        results = await svc.store_frame([_delivery(1), poison, _delivery(3)])
        assert all(r is not None and r.inbox_seq is not None for r in results)
        page = await svc.page(inbox.Page(after=0, limit=10))
        items = page["items"]
        assert [i["client_message_id"] for i in items] == ["c1", "c2", "c3"]
        assert items[1]["body"] == "" and "tidemesh_dead" in items[1]["meta"]
        assert items[0]["body"] == "body 1" and items[2]["body"] == "body 3"
        assert await db.read(inbox.receive_cursor) == (1, 3)
        health = svc.write_health
        assert health.healthy and health.failing == 0 and health.stored_dead == 1
        # The broker sends it again after a restart: the dead entry holds its place, once.
        again = await svc.store_frame([poison])
        assert again[0] is not None and again[0].inbox_seq is None
    finally:
        await db.close()


async def test_writes_failing_in_a_row_make_the_daemon_unhealthy(short_tmp: Path) -> None:
    db = await open_inbox(short_tmp / "inbox.db")
    svc = InboxService(db, EventBus())
    await db.close()   # every write now fails: the database's fault, not a message's
    for n in range(UNHEALTHY_AFTER):
        try:
            await svc.store_frame([_delivery(n + 1)])
        except Exception:   # noqa: S110 - the error goes up; the link retries later
            pass
        else:
            raise AssertionError("a write on a closed database succeeded")
    assert svc.write_health.failing == UNHEALTHY_AFTER
    assert not svc.write_health.healthy
    assert svc.write_health.stored_dead == 0, "a database fault marks no message dead"
