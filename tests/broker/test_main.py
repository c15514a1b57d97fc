"""The broker's composition root supervises its store's accept writers."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from structlog.testing import capture_logs

from tests.broker.conftest import LIMITS
from tidemesh.broker import main
from tidemesh.broker.config import load
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.store import open_store


async def test_the_background_loops_end_on_stop_and_a_dead_writer_is_fatal(
    store_url: str,
) -> None:
    settings, _ = load({}, {}, {})
    store = await open_store(store_url)
    service = BrokerService(store, LIMITS)
    unstarted = BrokerServer(service)   # close_silent finds no connections
    try:
        stop = asyncio.Event()
        serving = asyncio.create_task(main._serve(settings, service, unstarted, store, stop))
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(serving, 5)  # a clean stop raises nothing

        serving = asyncio.create_task(main._serve(settings, service, unstarted, store,
                                                  asyncio.Event()))
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


async def _admin(dsn: str, sql: str, *args: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_a_sweep_rides_out_a_database_that_refuses_connections(
    pg_dsn: str, pg_database: str
) -> None:
    """The retention sweep's database stops taking connections (its backends terminated, new
    ones refused, as while PostgreSQL restarts): the broker's loops keep running, count each
    failure as transient and log it as a warning, back off, and sweep again once the
    database is back."""
    name = pg_database.rsplit("/", 1)[1]
    fast = {"retention.sweep_interval_s": 0.05, "auth.recheck_s": 0.05,
            "queue.lease_check_interval_s": 0.05}
    settings, _ = load({}, {}, fast)
    store = await open_store(pg_database)
    service = BrokerService(store, LIMITS)
    unstarted = BrokerServer(service)   # close_silent finds no connections
    stop = asyncio.Event()

    def transient_failures() -> float:
        return service.metrics.registry.get_sample_value(
            "cm_broker_background_errors_total", {"task": "retention", "kind": "transient"}
        ) or 0.0

    try:
        with capture_logs() as logs:
            serving = asyncio.create_task(main._serve(settings, service, unstarted, store, stop))
            await asyncio.sleep(0.2)
            await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await _admin(pg_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                 " WHERE datname = $1", name)
            async with asyncio.timeout(10):
                while transient_failures() < 3:
                    await asyncio.sleep(0.05)
            assert not serving.done()
            await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            async with asyncio.timeout(10):
                while not any(e["event"] == "broker_background_recovered"
                              and e["task"] == "retention" for e in logs):
                    await asyncio.sleep(0.05)
            assert not serving.done()
        failed = [e for e in logs if e["event"].startswith("broker_background")
                  and e.get("task") == "retention" and e["event"] != "broker_background_recovered"]
        assert failed and {e["log_level"] for e in failed} == {"warning"}
        assert not any("exc_info" in e for e in failed)
        stop.set()
        await asyncio.wait_for(serving, 5)
    finally:
        stop.set()
        await _admin(pg_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await store.close()


@pytest.mark.postgres
async def test_a_sweep_is_not_cut_short_by_the_command_timeout(pg_database: str) -> None:
    """A first sweep over a long backlog may rightly take longer than
    ``store.command_timeout_s``: cut short, it would fail the same way at every retry and
    never get done. Here it waits out a lock held for several timeouts, then sweeps."""
    store = await open_store(pg_database, command_timeout_s=0.2)
    service = BrokerService(store, LIMITS)
    holder = await asyncpg.connect(pg_database)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("LOCK TABLE mesh.client_message_dedupe IN ACCESS EXCLUSIVE MODE")
        sweep = asyncio.create_task(service.sweep())
        await asyncio.sleep(1.0)
        assert not sweep.done(), sweep.exception()
        await held.rollback()
        await asyncio.wait_for(sweep, 10)
    finally:
        await holder.close()
        await store.close()
