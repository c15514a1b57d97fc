"""Retention on real outbox.db and inbox.db files, driven by a fake clock: rows cross each
boundary and go exactly then; chains and unacked consumer entries stay as documented; the
files stop growing under a steady load once retention applies."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidemesh.core.files import FileMeta
from tidemesh.core.outcome import Kind, Settlement
from tidemesh.core.retention import DAY_MS, HOUR_MS, InboxPolicy
from tidemesh.core.send import parse_send_request
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.records import SendKind
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings
from tidemesh.daemon.store import inbox
from tidemesh.daemon.store.db import INBOX_MIGRATIONS, Database
from tidemesh.storage.sqlite import connect

MAX_AGE = 72 * HOUR_MS
MARGIN = 24 * HOUR_MS
START = 1_700_000_000_000


@dataclass
class Clock:
    ms: int = START

    def __call__(self) -> float:
        return self.ms / 1000

    def advance(self, ms: int) -> None:
        self.ms += ms


@dataclass
class World:
    clock: Clock
    outbox_db: Database
    inbox_db: Database
    outbox: OutboxService
    inbox: InboxService
    retention: RetentionService


SETTINGS = RetentionSettings(MARGIN, 30 * DAY_MS,
                             InboxPolicy(30 * DAY_MS, 90 * DAY_MS, 7 * DAY_MS), batch_rows=7)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    clock = Clock()
    out_db = await open_outbox(tmp_path / "outbox.db", 64)
    in_db = await open_inbox(tmp_path / "inbox.db")
    svc = OutboxService(out_db, clock=clock)
    await svc.record_max_age(MAX_AGE)
    w = World(clock, out_db, in_db, svc, InboxService(in_db, EventBus(), clock),
              RetentionService(out_db, in_db, SETTINGS, clock))
    try:
        yield w
    finally:
        await out_db.close()
        await in_db.close()


async def _send(w: World, cmid: str, body: str = "hi") -> str:
    req = parse_send_request({"to": "topic:ops", "body": body}, cmid)
    out = await w.outbox.submit(req)
    assert out.kind is SendKind.NEW
    return out.row.id


async def _settle(w: World, row_id: str, kind: Kind) -> None:
    await w.outbox_db.write(lambda c: c.execute(
        "UPDATE outbox SET status = 'inflight' WHERE id = ?", (row_id,)))
    st = Settlement(row_id, kind, w.clock.ms, broker_message_id="b-" + row_id,
                    history_id="h-" + row_id, last_error=None if kind is Kind.DONE else "4xx")
    assert await w.outbox.settle_many([st]) == [True]


def _ids(db: Path, sql: str) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [str(r[0]) for r in conn.execute(sql)]
    finally:
        conn.close()


def _outbox_cmids(w: World) -> list[str]:
    return sorted(_ids(w.outbox_db.path, "SELECT client_message_id FROM outbox"))


async def test_done_and_aborted_rows_go_exactly_after_max_age_plus_margin(world: World) -> None:
    w = world
    done = await _send(w, "done-1")
    await _settle(w, done, Kind.DONE)
    dead = await _send(w, "dead-1")
    await _settle(w, dead, Kind.DEAD)
    await _send(w, "pending-1")
    w.clock.advance(MAX_AGE + MARGIN)
    assert (await w.retention.prune_outbox())["deleted"] == 0
    assert _outbox_cmids(w) == ["dead-1", "done-1", "pending-1"]
    w.clock.advance(1)
    preview = await w.retention.prune_outbox(dry_run=True)
    assert preview["deleted"] == 1 and _outbox_cmids(w) == ["dead-1", "done-1", "pending-1"]
    assert (await w.retention.prune_outbox())["deleted"] == 1
    assert _outbox_cmids(w) == ["dead-1", "pending-1"], "pending rows are never pruned"
    # The dead row waits dead_retention (30 days) from when it died.
    w.clock.advance(30 * DAY_MS - (MAX_AGE + MARGIN) - 1)
    assert (await w.retention.prune_outbox())["deleted"] == 0
    w.clock.advance(1)
    assert (await w.retention.prune_outbox())["deleted"] == 1
    assert _outbox_cmids(w) == ["pending-1"]


async def test_a_pruned_id_is_a_fresh_send_again(world: World) -> None:
    w = world
    first = await _send(w, "again")
    await _settle(w, first, Kind.DONE)
    out = await w.outbox.submit(parse_send_request({"to": "topic:ops", "body": "hi"}, "again"))
    assert out.kind is SendKind.DUPLICATE, "before retention, the outbox answers the retry itself"
    w.clock.advance(MAX_AGE + MARGIN + 1)
    await w.retention.prune_outbox()
    assert await _send(w, "again") != first, "after it, the retry is queued for the broker"


async def test_a_requeue_chain_stays_while_any_row_of_it_is_live(world: World) -> None:
    w = world
    old = await _send(w, "chain-1")
    await _settle(w, old, Kind.DEAD)
    w.clock.advance(31 * DAY_MS)
    moved = await w.outbox.requeue(old, "chain-2")
    new = moved["new_row_id"]
    w.clock.advance(HOUR_MS)
    assert (await w.retention.prune_outbox())["deleted"] == 0, "the live successor holds it"
    assert _outbox_cmids(w) == ["chain-1", "chain-2"]
    await _settle(w, new, Kind.DONE)
    w.clock.advance(MAX_AGE + MARGIN - HOUR_MS)
    assert (await w.retention.prune_outbox())["deleted"] == 0
    w.clock.advance(1)
    assert (await w.retention.prune_outbox())["deleted"] == 2, "the chain goes as a whole"
    assert _outbox_cmids(w) == []


async def test_without_a_known_max_age_nothing_settled_is_pruned(tmp_path: Path) -> None:
    db = await open_outbox(tmp_path / "o.db", 8)
    try:
        result = await RetentionService(db, None, SETTINGS).prune_outbox()
        assert result["deleted"] == 0 and "not known" in result["skipped"]
    finally:
        await db.close()


async def _settle_all(w: World, row_ids: list[str]) -> None:
    await w.outbox_db.write(lambda c: c.executemany(
        "UPDATE outbox SET status = 'inflight' WHERE id = ?", [(r,) for r in row_ids]))
    done = [Settlement(r, Kind.DONE, w.clock.ms, "b", "h") for r in row_ids]
    assert all(await w.outbox.settle_many(done))


async def _deliver(w: World, n: int, start: int) -> None:
    await asyncio.gather(*(w.inbox.store(inbox.Delivery(
            id=f"m{i}", mesh="t", sender_pubkey="aa" * 32, sender_name="alice",
            client_message_id=f"c{i}", broker_message_id=f"b{i}", dest_kind="topic",
            dest_ref="ops", body=b"x" * 200, body_encoding="utf8", priority="next", meta=None,
            reply_to=None, epoch=1, seq=i, sent_at=w.clock.ms, received_at=w.clock.ms))
        for i in range(start, start + n)))


def _seqs(w: World) -> list[int]:
    return [int(s) for s in _ids(w.inbox_db.path, "SELECT seq FROM inbox ORDER BY seq")]


async def test_inbox_and_events_go_after_their_retention(world: World) -> None:
    w = world
    await _deliver(w, 20, 1)
    w.clock.advance(7 * DAY_MS)
    assert (await w.retention.prune_inbox())["events_deleted"] == 0
    w.clock.advance(1)
    result = await w.retention.prune_inbox()
    assert (result["deleted"], result["events_deleted"]) == (0, 20)
    assert len(_seqs(w)) == 20
    assert await w.inbox.event_bounds() == (20, 20)
    w.clock.advance(23 * DAY_MS - 1)
    assert (await w.retention.prune_inbox())["deleted"] == 0, "30 days exactly: still kept"
    w.clock.advance(1)
    assert (await w.retention.prune_inbox())["deleted"] == 20
    assert _seqs(w) == []
    await _deliver(w, 1, 21)
    assert _seqs(w) == [21], "local sequences never restart after a prune"


async def test_an_unacked_consumer_holds_entries_then_is_told_what_it_lost(
        world: World) -> None:
    w = world
    await _deliver(w, 10, 1)
    await w.inbox.consumer_ack("fast", 10)
    await w.inbox.consumer_ack("slow", 4)
    w.clock.advance(30 * DAY_MS + 1)
    assert (await w.retention.prune_inbox())["deleted"] == 4, "only what every consumer acked"
    assert _seqs(w) == list(range(5, 11))
    read = await w.inbox.consumer_read("slow", inbox.Page(limit=100))
    assert "lost" not in read and [e["seq"] for e in read["items"]] == list(range(5, 11))
    w.clock.advance(60 * DAY_MS)
    assert (await w.retention.prune_inbox())["deleted"] == 6, "the hold has a cap"
    read = await w.inbox.consumer_read("slow", inbox.Page(limit=100))
    assert read["lost"] == {"count": 6, "through_seq": 10} and read["items"] == []
    assert "lost" not in await w.inbox.consumer_read("fast", inbox.Page(limit=100))
    await _deliver(w, 1, 11)
    read = await w.inbox.consumer_read("slow", inbox.Page(limit=100))
    assert read["lost"]["count"] == 6, "reported until the consumer acks past the loss"
    await w.inbox.consumer_ack("slow", 11)
    assert "lost" not in await w.inbox.consumer_read("slow", inbox.Page(limit=100))


async def test_files_stop_growing_under_steady_load_once_retention_applies(
        world: World) -> None:
    """Every two simulated hours: 50 sends settle done and 50 messages arrive, and
    retention sweeps.
    Once the oldest rows reach their age, each file's size stays put."""
    w = world
    step = 2 * HOUR_MS
    settings = RetentionSettings(MARGIN, 30 * DAY_MS,
                                 InboxPolicy(2 * DAY_MS, 2 * DAY_MS, 2 * DAY_MS), batch_rows=200)
    w.retention = RetentionService(w.outbox_db, w.inbox_db, settings, w.clock)
    sizes: list[tuple[int, int]] = []
    seq = 1
    for h in range(100):
        rows = await asyncio.gather(*(_send(w, f"h{h}-{i}", "y" * 300) for i in range(50)))
        await _settle_all(w, rows)
        await _deliver(w, 50, seq)
        seq += 50
        w.clock.advance(step)
        await w.retention.sweep()
        sizes.append((w.outbox_db.path.stat().st_size, w.inbox_db.path.stat().st_size))
    outbox_rows = len(_outbox_cmids(w))
    assert outbox_rows <= 50 * (MAX_AGE + MARGIN) // step + 50
    settled = sizes[60:]
    assert max(s[0] for s in settled) <= min(s[0] for s in settled) * 1.1, sizes[60::10]
    assert max(s[1] for s in settled) <= min(s[1] for s in settled) * 1.1, sizes[60::10]
    growth_before = sizes[40][0] / sizes[5][0]
    assert growth_before > 2, "the load did grow the files before retention applied"


async def test_new_databases_give_space_back_incrementally(world: World) -> None:
    for db in (world.outbox_db, world.inbox_db):
        conn = sqlite3.connect(db.path)
        try:
            assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        finally:
            conn.close()


def test_deleting_inbox_rows_looks_up_their_events_by_index(short_tmp: Path) -> None:
    # The sweep unlinks events, then deletes entries (each checked against events.inbox_seq,
    # its foreign key): a scan of the event log per deleted row held the writer for seconds.
    conn = connect(short_tmp / "inbox.db")
    INBOX_MIGRATIONS.apply_sqlite(conn)
    plans = [" ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql))
             for sql in ("UPDATE events SET inbox_seq = NULL WHERE inbox_seq IN (1, 2)",
                         "DELETE FROM inbox WHERE seq IN (1, 2)")]
    conn.close()
    assert all("SCAN events" not in p and "events_inbox_seq" in p for p in plans), plans


async def test_a_received_file_is_recorded_with_its_event_and_forgotten_with_the_inbox(
        world: World) -> None:
    w = world
    fm = FileMeta("a" * 32, "r.pdf", 5, "ab" * 32, 4, None, False)
    await w.inbox.store(inbox.Delivery(
        id="mf", mesh="t", sender_pubkey="aa" * 32, sender_name="alice",
        client_message_id="file-" + fm.id, broker_message_id="bf", dest_kind="topic",
        dest_ref="ops", body=b"the report", body_encoding="utf8", priority="next",
        meta=fm.to_meta(), reply_to=None, epoch=1, seq=1, sent_at=w.clock.ms,
        received_at=w.clock.ms))
    events = await w.inbox.events_after(0)
    assert [e.type for e in events] == ["message", "file_shared"]
    assert events[1].data["id"] == fm.id and events[1].data["message"] == "the report"
    assert _ids(w.inbox_db.path, "SELECT id FROM files") == [fm.id]
    w.clock.advance(30 * DAY_MS)
    assert (await w.retention.prune_inbox())["files_deleted"] == 0
    w.clock.advance(1)
    assert (await w.retention.prune_inbox())["files_deleted"] == 1
    assert _ids(w.inbox_db.path, "SELECT id FROM files") == []
