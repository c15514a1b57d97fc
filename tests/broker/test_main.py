"""The broker's composition root supervises its store's accept writers."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from tests.broker.conftest import LIMITS
from tidemesh.broker import main
from tidemesh.broker.config import load
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_store


async def test_the_background_loops_end_on_stop_and_a_dead_writer_is_fatal(
    store_url: str,
) -> None:
    settings, _ = load({}, {}, {})
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS)
    try:
        stop = asyncio.Event()
        serving = asyncio.create_task(main._serve(settings, service, store, stop))
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(serving, 5)  # a clean stop raises nothing

        serving = asyncio.create_task(main._serve(settings, service, store, asyncio.Event()))
        await asyncio.sleep(0.05)
        assert not serving.done()
        with capture_logs() as logs:
            store.writer_tasks[-1].cancel()  # a writer ends while the broker runs
            done, _ = await asyncio.wait({serving}, timeout=5)
        assert done, "the broker kept running without one of its writers"
        err = serving.exception()
        assert isinstance(err, ExceptionGroup)
        assert err.subgroup(main.WriterStopped) is not None
        assert [e["log_level"] for e in logs if e["event"] == "broker_store_writer_stopped"] \
            == ["critical"]
    finally:
        await store.close()
