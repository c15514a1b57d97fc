"""A backlog reaches a returning recipient in deliver_batch frames: in order, exactly once,
also when the recipient's daemon is killed with SIGKILL while it drains the backlog. On the
SQLite and the PostgreSQL broker store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.harness import RunningDaemon
from tests.e2e.harness import Mesh, connected, inbox, wait_for
from tests.e2e.test_faults import _exactly_once_in_order, _has, _send_many, _setup

pytestmark = pytest.mark.slow


async def _backlog(mesh: Mesh, root: Path, n: int) -> tuple[list[str], RunningDaemon]:
    """b subscribes, goes away; a sends ``n`` that the broker accepts while b is offline."""
    a, b = await _setup(mesh, root)
    assert b.stop() == 0  # type: ignore[attr-defined]
    ids = await _send_many(a, n, "q")
    await wait_for(lambda: {r["status"] for r in a.outbox_rows()} == {"done"},  # type: ignore[attr-defined]
                   timeout=120)
    return ids, await asyncio.to_thread(mesh.restart, "b")


def _frame_sizes(d: RunningDaemon) -> tuple[float, float, float]:
    """(frames received, deliveries in them, frames holding one delivery) since start."""
    hist = next(f for f in text_string_to_metric_families(d.client.metrics())
                if f.name == "cm_daemon_deliver_batch_size")
    values = {(s.name, s.labels.get("le")): s.value for s in hist.samples}
    return (values[("cm_daemon_deliver_batch_size_count", None)],
            values[("cm_daemon_deliver_batch_size_sum", None)],
            values[("cm_daemon_deliver_batch_size_bucket", "1.0")])


async def test_a_returning_recipient_gets_the_backlog_in_batches_in_order_once(
    any_mesh: Mesh, short_tmp: Path
) -> None:
    ids, b = await _backlog(any_mesh, short_tmp, 600)
    await wait_for(lambda: _has(b, 600), timeout=120)
    _exactly_once_in_order(await inbox(b), ids)
    frames, deliveries, singles = _frame_sizes(b)
    assert deliveries >= 600
    assert frames < deliveries and singles < frames, "the backlog came in batches"
    await wait_for(lambda: connected(b))


async def test_kill_9_while_draining_a_backlog_loses_and_duplicates_nothing(
    any_mesh: Mesh, short_tmp: Path
) -> None:
    ids, b = await _backlog(any_mesh, short_tmp, 1500)
    for _ in range(2):
        # Killed as soon as the first batch is in: mid-stream, whatever the machine's speed.
        await wait_for(lambda d=b: _has(d, 1), timeout=60, interval=0.01)
        b.kill()
        b = await asyncio.to_thread(any_mesh.restart, "b")
    await wait_for(lambda: _has(b, 1500), timeout=120)
    _exactly_once_in_order(await inbox(b), ids)
