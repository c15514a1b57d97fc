"""Retention through the service (spec §17.5-6), its metrics and its route table, on a real
store."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.broker.conftest import LIMITS, accept_input, new_pubkey, now_ms, send_frame
from tidemesh.broker.accept import Limits
from tidemesh.broker.service import BrokerService
from tidemesh.broker.session import READY_TYPES
from tidemesh.broker.store.base import Store
from tidemesh.core.metrics import render

DAY = 86_400_000


async def test_sweep_deletes_expired_keys_and_prunes_old_messages(store: Store) -> None:
    t = now_ms()
    mesh = await store.create_mesh("ret", t)
    alice, bob = new_pubkey(), new_pubkey()
    for pk in (alice, bob):
        await store.add_member(mesh.id, pk, t)
    await store.create_topic(mesh.id, "ops", None, t)
    await store.subscribe(mesh.id, "ops", bob, t)
    short = Limits(LIMITS.inline_bytes, "retention_scoped", 3)
    old = await store.accept(accept_input(mesh.id, alice, "old", limits=short, at=t - 40 * DAY))
    perm = Limits(LIMITS.inline_bytes, "permanent", 0)
    kept = await store.accept(accept_input(mesh.id, alice, "kept", limits=perm, at=t - 40 * DAY))
    fresh = await store.accept(accept_input(mesh.id, alice, "fresh"))
    await store.ack(mesh.id, bob, 1, 2, t)  # "fresh" (seq 3) stays unacked
    assert (old.status, kept.status, fresh.status) == (201, 201, 201)

    service = BrokerService(store, LIMITS, retention_days=30, stall_window_hours=24)
    assert await service.sweep() == (1, 2)
    again = await store.accept(accept_input(mesh.id, alice, "kept", limits=perm,
                                            at=t - 40 * DAY))
    assert (again.status, again.history_available) == (200, False)
    counts = await store.counts()
    assert (counts["client_message_dedupe"], counts["topic_message"]) == (2, 1)
    text = render(service.metrics.registry).decode()
    assert "cm_broker_dedupe_expired_deleted_total 1.0" in text
    assert "cm_broker_history_pruned_total 2.0" in text


async def test_every_frame_legal_when_ready_has_exactly_one_route(store: Store) -> None:
    service = BrokerService(store, LIMITS)

    assert set(service.routes) == READY_TYPES


class _Recorder:
    """A connection's far end that keeps what it is sent."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    async def send_frame(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)

    def tell(self, frame: dict[str, Any]) -> None:
        return None

    async def close(self, code: int, reason: str) -> None:
        return None


async def test_a_topic_messages_subscribers_are_woken_after_its_answer(store: Store) -> None:
    """A topic message wakes every subscriber's pump, but the sender's; who subscribes is
    read after the accept and its answer (at 1,000 subscribers, listing them in the
    accept's transaction had been half of its time; waking their pumps before the answer
    went out had been a third of its median and most of its p99)."""
    t = now_ms()
    mesh = await store.create_mesh("wake", t)
    alice, subscribers = new_pubkey(), [new_pubkey() for _ in range(20)]
    idle = new_pubkey()
    await store.create_topic(mesh.id, "ops", None, t)
    for pk in (alice, idle, *subscribers):
        await store.add_member(mesh.id, pk, t)
    for pk in (alice, *subscribers):
        await store.subscribe(mesh.id, "ops", pk, t)
    service = BrokerService(store, LIMITS)
    sender, _ = service.connections.register(_Recorder(), mesh.id, alice)
    other, _ = service.connections.register(_Recorder(), mesh.id, idle)
    conns = [service.connections.register(_Recorder(), mesh.id, pk)[0] for pk in subscribers]

    answer = await service.sends.send(sender, send_frame("c1"))

    assert answer["status"] == 201
    await asyncio.sleep(0)
    assert not any(c.wake.is_set() for c in conns)
    await service.sends.wake_topics(sender)   # the server: once the answer is queued
    assert all(c.wake.is_set() and c.logged for c in conns)
    assert not sender.wake.is_set() and not other.wake.is_set()
    assert sender.logged_topics == set()


class _Unreadable:
    """A store whose read of a topic's subscribers fails, as during an outage."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def topic_subscribers(self, topics: Any) -> Any:
        raise ConnectionResetError("the database went away")


async def test_when_subscribers_cannot_be_read_every_member_of_the_mesh_here_is_woken(
    store: Store
) -> None:
    t = now_ms()
    mesh, elsewhere = await store.create_mesh("outage", t), await store.create_mesh("else", t)
    alice, bob, carol = new_pubkey(), new_pubkey(), new_pubkey()
    await store.create_topic(mesh.id, "ops", None, t)
    for pk in (alice, bob):
        await store.add_member(mesh.id, pk, t)
    await store.add_member(elsewhere.id, carol, t)
    await store.subscribe(mesh.id, "ops", bob, t)
    service = BrokerService(_Unreadable(store), LIMITS)  # type: ignore[arg-type]
    sender, _ = service.connections.register(_Recorder(), mesh.id, alice)
    bobs, _ = service.connections.register(_Recorder(), mesh.id, bob)
    carols, _ = service.connections.register(_Recorder(), elsewhere.id, carol)

    assert (await service.sends.send(sender, send_frame("c1")))["status"] == 201
    await service.sends.wake_topics(sender)

    assert bobs.wake.is_set() and bobs.logged
    assert not carols.wake.is_set()
    text = render(service.metrics.registry).decode()
    assert 'cm_broker_background_errors_total{kind="transient",task="topic_wake"} 1.0' in text


async def test_the_accept_histograms_time_accepts_and_no_other_write(store: Store) -> None:
    """On SQLite every write shares the accept's writer: an ack or a subscription committed
    there is no accept, and used to be timed as one."""
    service = BrokerService(store, LIMITS)

    def accepts_timed() -> float:
        return service.metrics.registry.get_sample_value(
            "cm_broker_accept_duration_seconds_count") or 0.0

    mesh = await store.create_mesh("team", now_ms())
    alice, bob = new_pubkey(), new_pubkey()
    for p in (alice, bob):
        await store.add_member(mesh.id, p, now_ms())
    await store.create_topic(mesh.id, "ops", None, now_ms())
    await store.subscribe(mesh.id, "ops", bob, now_ms())
    await store.ack(mesh.id, bob, 1, 0, now_ms())
    assert accepts_timed() == 0

    await store.accept(accept_input(mesh.id, alice, "c1"))
    assert accepts_timed() == 1
    frames = service.metrics.registry.get_sample_value("cm_broker_accept_frames_count")
    assert frames == 1
