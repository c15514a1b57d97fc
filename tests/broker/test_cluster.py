"""Brokers on one PostgreSQL telling each other about deliveries (DESIGN §10), in process:
two services on one real database, each with its own LISTEN connection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from tests.broker.conftest import LIMITS, accept_input, new_pubkey, now_ms
from tidemesh.broker.accept import Limits
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_cluster, open_store
from tidemesh.broker.store.base import Mesh, Store
from tidemesh.broker.store.postgres.cluster import wake_payloads

pytestmark = pytest.mark.postgres


class Silent:
    """A connection's far end that takes frames and closes; what it gets is not the point."""

    async def send_frame(self, frame: dict[str, Any]) -> None:
        return None

    def tell(self, frame: dict[str, Any]) -> None:
        return None

    async def close(self, code: int, reason: str) -> None:
        return None


@pytest.fixture
def store_url(pg_database: str) -> str:
    """The conftest's ``store`` on PostgreSQL only: SQLite serves one broker."""
    return pg_database


def broker(store: Store, broker_id: str) -> BrokerService:
    return BrokerService(store, LIMITS, cluster=open_cluster(store, broker_id))


async def until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_wake_reaches_the_other_broker_and_survives_a_dropped_listener(
    store: Store, pg_database: str
) -> None:
    x, y = broker(store, "x"), broker(store, "y")
    conn, _ = y.connections.register(Silent(), "m1", "bob")
    listening = [asyncio.create_task(b.peering.run()) for b in (x, y)]
    try:
        await until(lambda: conn.wake.is_set())  # listening starts by waking every pump
        conn.wake.clear()
        x.connections.wake({("m1", "bob")})  # bob is not on x: told to the others
        await until(lambda: conn.wake.is_set())
        conn.wake.clear()

        admin = await asyncpg.connect(pg_database)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND application_name = 'tidemesh-listen-y'")
        finally:
            await admin.close()
        assert killed == 1
        # Back to listening, it wakes every pump (what was said meanwhile went unheard) ...
        await until(lambda: conn.wake.is_set())
        conn.wake.clear()
        # ... and hears the others again.
        x.connections.wake({("m1", "bob")})
        await until(lambda: conn.wake.is_set())
    finally:
        for task in listening:
            task.cancel()


async def test_a_broker_ignores_its_own_wake_ups(store: Store) -> None:
    x = broker(store, "x")
    conn, _ = x.connections.register(Silent(), "m1", "bob")
    listening = asyncio.create_task(x.peering.run())
    try:
        await until(lambda: conn.wake.is_set())
        conn.wake.clear()
        x.connections.wake({("m1", "carol")})  # published, and heard back by x itself
        await asyncio.sleep(0.3)
        assert not conn.wake.is_set()
    finally:
        listening.cancel()


async def alice_and_bob(store: Store, name: str) -> tuple[Mesh, str, str]:
    """A mesh of two members; bob subscribes to topic ``ops``."""
    t = now_ms()
    mesh = await store.create_mesh(name, t)
    alice, bob = new_pubkey(), new_pubkey()
    for pk in (alice, bob):
        await store.add_member(mesh.id, pk, t)
    await store.create_topic(mesh.id, "ops", None, t)
    await store.subscribe(mesh.id, "ops", bob, t)
    return mesh, alice, bob


async def test_the_safety_poll_wakes_pumps_whose_wake_up_was_lost(store: Store) -> None:
    mesh, alice, bob = await alice_and_bob(store, "poll")
    y = broker(store, "y")
    conn, _ = y.connections.register(Silent(), mesh.id, bob)
    conn.epoch, conn.pumping = 1, True
    assert await y.peering.poll() == 0
    # Accepted with nobody told (as if the accepting broker died before its NOTIFY).
    assert (await store.accept(accept_input(mesh.id, alice, "c1", kind="dm",
                                               ref=bob))).status == 201
    assert await y.peering.poll() == 1
    assert conn.wake.is_set()
    conn.wake.clear()
    conn.sent_seq = 1  # sent, not yet acked: nothing more to wake for
    assert await y.peering.poll() == 0
    assert not conn.wake.is_set()


def test_wake_payloads_stay_under_the_notify_limit() -> None:
    keys = {(f"mesh{i:04}", "k" * 64) for i in range(500)}
    payloads = list(wake_payloads("b", keys))
    assert len(payloads) > 1 and all(len(p) < 8000 for p in payloads)
    assert sum(p.count("mesh") for p in payloads) == 500


async def test_the_sweep_run_by_three_brokers_at_once_is_done_once(
    store: Store, pg_database: str
) -> None:
    mesh, alice, bob = await alice_and_bob(store, "sweep")
    old = now_ms() - 40 * 86_400_000
    short = Limits(LIMITS.inline_bytes, "retention_scoped", 3)
    for i in range(200):  # old, acked long ago: pruned; their dedupe keys expired
        assert (await store.accept(accept_input(mesh.id, alice, f"c{i}", limits=short,
                                                at=old))).status == 201
    await store.ack(mesh.id, bob, 1, 200, old)
    others = [await open_store(pg_database) for _ in range(2)]
    try:
        services = [BrokerService(s, LIMITS, cluster=open_cluster(s, f"b{i}"))
                    for i, s in enumerate([store, *others])]
        results = await asyncio.gather(*(s.sweep() for s in services))
    finally:
        for s in others:
            await s.close()
    # Each broker swept or skipped; together they deleted each row once, and said so once.
    assert (sum(r[0] for r in results), sum(r[1] for r in results)) == (200, 200)
    counts = await store.counts()
    assert (counts["topic_message"], counts["client_message_dedupe"]) == (0, 0)


class Recording(Silent):
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None

    async def send_frame(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)

    def tell(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def rows(url: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(url)
    try:
        return [(r[0], r[1]) for r in await conn.fetch(
            "SELECT pubkey, broker_id FROM mesh.member_session ORDER BY pubkey")]
    finally:
        await conn.close()


async def test_sessions_claimed_taken_over_released_and_expired(
    store: Store, pg_database: str
) -> None:
    x, y = broker(store, "x"), broker(store, "y")
    for b in (x, y):
        await b.peering.heartbeat()
    carol = Recording()
    watcher, _ = x.connections.register(carol, "m1", "carol")
    assert await x.peering.connected(watcher, True) is True
    old_peer = Recording()
    old, first = x.connections.register(old_peer, "m1", "bob")
    assert await x.peering.connected(old, first) is True  # a join
    new, first = y.connections.register(Recording(), "m1", "bob")
    assert await y.peering.connected(new, first) is False  # a takeover, not a join
    assert await rows(pg_database) == [("bob", "y"), ("carol", "x")]
    await x.peering.on_taken_over("m1", "bob", old.session_id)  # what x hears by NOTIFY
    assert old_peer.closed == (4011, "session_taken_over")
    # x's old connection ends: the row is y's now, so nobody announces a leave.
    assert await x.peering.disconnected(old, x.connections.unregister(old)) is False
    assert await rows(pg_database) == [("bob", "y"), ("carol", "x")]

    # Releasing failed (database unreachable): the next heartbeat does it, and announces.
    x.peering.release_later(watcher)
    x.connections.unregister(watcher)
    await x.peering.heartbeat()
    assert await rows(pg_database) == [("bob", "y")]

    # y dies (no more heartbeats): x expires bob's session and tells its members.
    dave = Recording()
    x.connections.register(dave, "m1", "dave")[0].negotiated = True   # its daemon listens
    x.peering.expiry_ms = 0
    await asyncio.sleep(0.01)
    await x.peering.heartbeat()
    assert ("bob", "y") not in await rows(pg_database)
    x.connections.flush()   # presence goes out in batches
    assert {"type": "peer_leave", "pubkey": "bob"}.items() <= dave.frames[-1].items()
    # A live broker whose rows were expired (it could not reach the database) puts its
    # members back at its next heartbeat.
    assert ("dave", "x") in await rows(pg_database)


async def waiting_on_a_lock(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"))
    finally:
        await conn.close()


async def test_a_heartbeat_never_brings_back_a_session_that_ended_meanwhile(
    store: Store, pg_database: str
) -> None:
    """The heartbeat read its live sessions, then bob's connection ended and its row was
    deleted before the heartbeat's write landed: the row must not come back (it would
    keep bob "present" for as long as the broker runs)."""
    x, y = broker(store, "x"), broker(store, "y")
    for b in (x, y):
        await b.peering.heartbeat()
    bob, first = x.connections.register(Recording(), "m1", "bob")
    assert await x.peering.connected(bob, first)
    # Hold x's heartbeat at its first statement: another transaction holds x's alive row.
    blocker = await asyncpg.connect(pg_database)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM mesh.broker_alive WHERE broker_id = 'x' FOR UPDATE")
        beat = asyncio.create_task(x.peering.heartbeat())
        async with asyncio.timeout(10):
            while not await waiting_on_a_lock(pg_database):
                await asyncio.sleep(0.02)
        assert await x.peering.disconnected(bob, x.connections.unregister(bob)) is True
        assert await rows(pg_database) == []
        await tx.commit()
        await asyncio.wait_for(beat, 10)
    finally:
        await blocker.close()
    assert await rows(pg_database) == []
    watcher, _ = y.connections.register(Recording(), "m1", "carol")
    assert [p["pubkey"] for p in (await y.connections.peers(watcher, {"id": "p"}))["peers"]] \
        == ["carol"]


def _snapshot_peers(texts: list[str]) -> list[str]:
    return [p["pubkey"] for t in texts for p in json.loads(t)["peers"]]


async def test_a_snapshot_shows_the_other_brokers_members_read_once_a_flush(
    store: Store, pg_database: str
) -> None:
    """A newcomer's presence snapshot lists this broker's members from its registry and the
    other brokers' from their session rows (not its own rows: a storm's snapshots had each
    read every session of the mesh); the snapshots made before the next flush share one
    read, and a flush after the others' change makes the next one read again."""
    x, y = broker(store, "x"), broker(store, "y")
    for b in (x, y):
        await b.peering.heartbeat()
    for name in ("bob", "carol"):
        conn, first = y.connections.register(Silent(), "m1", name)
        assert await y.peering.connected(conn, first)
    ghost, first = x.connections.register(Silent(), "m1", "ghost")
    await x.peering.connected(ghost, first)
    x.connections.unregister(ghost)   # gone here; its row is x's own and not a remote peer
    alice, _ = x.connections.register(Silent(), "m1", "alice")
    reads = 0
    remote_peers = x.peering.remote_peers

    async def counted(mesh_id: str, local: set[str]) -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        return await remote_peers(mesh_id, local)

    x.peering.remote_peers = counted  # type: ignore[method-assign]
    first_ones = await asyncio.gather(*(x.connections.snapshot(alice) for _ in range(5)))
    assert {tuple(_snapshot_peers(t)) for t in first_ones} == {("alice", "bob", "carol")}
    assert reads == 1
    bob = next(iter(y.connections.conns[("m1", "bob")]))
    assert await y.peering.disconnected(bob, y.connections.unregister(bob))
    x.connections.tell_local({"type": "peer_leave", "mesh_id": "m1", "pubkey": "bob"})
    x.connections.flush()   # what x hears of bob's leave, told
    assert _snapshot_peers(await x.connections.snapshot(alice)) == ["alice", "carol"]
    assert reads == 2
