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


async def test_a_sends_answer_is_ready_before_the_pumps_it_wakes_run(store: Store) -> None:
    """A topic message wakes every subscriber's pump; the sender's answer is queued first, so
    its accept does not wait behind a step of each of them (a wait that grew with the
    subscribers: at 1,000, a third of the accept's median and most of its p99)."""
    t = now_ms()
    mesh = await store.create_mesh("wake", t)
    alice, subscribers = new_pubkey(), [new_pubkey() for _ in range(20)]
    await store.create_topic(mesh.id, "ops", None, t)
    for pk in (alice, *subscribers):
        await store.add_member(mesh.id, pk, t)
    for pk in subscribers:
        await store.subscribe(mesh.id, "ops", pk, t)
    service = BrokerService(store, LIMITS)
    sender, _ = service.connections.register(_Recorder(), mesh.id, alice)
    conns = [service.connections.register(_Recorder(), mesh.id, pk)[0] for pk in subscribers]

    answer = await service.sends.send(sender, send_frame("c1"))

    assert answer["status"] == 201
    # The server queues this answer before it yields; only then are the pumps woken.
    assert not any(c.wake.is_set() for c in conns)
    await asyncio.sleep(0)
    assert all(c.wake.is_set() for c in conns)
