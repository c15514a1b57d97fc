"""``Sender.reserve``: when a lone send's accept may claim its row and hand it to the sender
(``OutboxService.hand``), on a real outbox.db. The link is a stand-in that stays open until
closed and takes no frame: these tests never put a row on the wire."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from tidemesh.core.backoff import Backoff
from tidemesh.daemon.link.sender import DeadLetters, Sender, SenderMetrics, SenderSettings
from tidemesh.daemon.link.websocket import BrokerLink
from tidemesh.daemon.process.stores import open_outbox
from tidemesh.daemon.records import Claimed
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.outbox import OutboxService


class OpenLink:
    """As much of ``BrokerLink`` as a waiting sender touches."""

    def __init__(self) -> None:
        self.on_batch: Any = None
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self) -> None:
        self._closed.set()


@pytest.fixture
async def waiting(tmp_path: Path) -> AsyncIterator[tuple[Sender, OutboxService, OpenLink]]:
    """A sender whose claim loop found nothing due and waits; its outbox and link."""
    db = await open_outbox(tmp_path / "outbox.db", 64)
    outbox = OutboxService(db)
    link = OpenLink()
    registry = CollectorRegistry()
    metrics = SenderMetrics.register(registry, "m", Counter(
        "dedupe_total", "dedupe", ["direction", "mesh"], registry=registry))
    # No dead rows to announce: the inbox is never reached.
    sender = Sender(cast(BrokerLink, link), outbox,
                    DeadLetters(outbox, cast(InboxService, None)), SenderSettings(),
                    metrics, 3_600_000, Backoff(), time.time, random.Random(1))
    task = asyncio.create_task(sender.run())
    try:
        async with asyncio.timeout(10):
            while sender._waiting is None:   # the loop's first claim found nothing
                await asyncio.sleep(0.01)
        yield sender, outbox, link
    finally:
        link.close()
        await task
        await db.close()


async def test_a_waiting_sender_is_the_outboxs_hand_while_it_runs(
        waiting: tuple[Sender, OutboxService, OpenLink]) -> None:
    sender, outbox, link = waiting
    assert outbox.hand is sender
    link.close()
    async with asyncio.timeout(10):
        while outbox.hand is not None:
            await asyncio.sleep(0.01)


async def test_one_send_at_a_time_is_handed_over(
        waiting: tuple[Sender, OutboxService, OpenLink]) -> None:
    sender, _, _ = waiting
    assert sender.reserve()
    # A second send while the first is on its way waits for the claim loop, which puts the
    # sends that came together in one frame.
    assert not sender.reserve()
    sender.release()
    assert sender.reserve()


async def test_nothing_is_handed_over_behind_an_unclaimed_send_or_a_hold(
        waiting: tuple[Sender, OutboxService, OpenLink]) -> None:
    sender, outbox, _ = waiting
    outbox.accepted.set()   # accepted and not yet claimed: the new send must go after it
    assert not sender.reserve()
    outbox.accepted.clear()
    sender.hold.until_ms = int(time.time() * 1000) + 60_000   # the broker's 429 wait
    assert not sender.reserve()
    sender.hold.until_ms = 0
    sender.hold.draining = True
    assert not sender.reserve()


async def test_a_closed_link_takes_nothing(
        waiting: tuple[Sender, OutboxService, OpenLink]) -> None:
    sender, _, link = waiting
    assert sender.reserve()
    link.close()   # the session ends between the reservation and the commit
    assert not sender.reserve()
    assert not sender.take(Claimed("row", "id-1", b"{}", 1)), "the outbox unclaims it"
    assert sender.inflight == 0
