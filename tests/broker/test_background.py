"""The broker's background jobs end on the broker's stop, even when its cancel reaches a
job as a store error (asyncpg's, on a dropped connection): taken for an outage and retried,
it held the stop's TaskGroup for good."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.lost_cancel import CancelAsOutage
from tidemesh.broker.background import Jobs
from tidemesh.core import cancelling
from tidemesh.core.backoff import Backoff
from tidemesh.core.errors import Unavailable


def _jobs() -> Jobs:
    errors = Counter("errors", "", ["task", "kind"], registry=CollectorRegistry())
    return Jobs(errors, (Unavailable,), Backoff(0.01, 0.05, 2.0, 0.0))


@pytest.mark.parametrize("kind", ["every", "restarted"])
async def test_a_job_stopped_mid_call_ends_even_if_the_store_says_outage(kind: str) -> None:
    store, jobs = CancelAsOutage(), _jobs()
    job = asyncio.create_task(jobs.every(0.01, "sweep", store.call) if kind == "every"
                              else jobs.restarted("cluster", store.call))
    await store.called()
    cancelling.stop(job)
    done, _ = await asyncio.wait([job], timeout=2)
    assert job in done and job.cancelled()
    assert store.calls == 1   # not retried


async def test_an_outage_that_is_no_stop_is_retried() -> None:
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionResetError("the store restarted")

    job = asyncio.create_task(_jobs().restarted("cluster", flaky))
    await asyncio.wait_for(job, 2)
    assert calls == 3
