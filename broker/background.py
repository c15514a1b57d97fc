"""How the broker's background jobs run (DESIGN §11, "transient or fatal, decided once").

A job runs on a timer (``every``) or for good (``restarted``). What the network or a store
throws (the store's outage errors: asyncpg's, ``store_unavailable``; ``OSError``, which
covers resets and ``TimeoutError``) is transient: logged as a warning without a traceback,
counted in ``cm_broker_background_errors_total{task, kind="transient"}``, retried after a
backoff (capped at the job's interval, so a frequent job keeps its pace). Anything else is a
bug: logged as an error with its traceback, counted as ``kind="bug"``, retried the same
way. No job ends the process; what is fatal (a store writer that stopped) is watched apart.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from prometheus_client import Counter

from tidemesh.core import cancelling
from tidemesh.core.backoff import Backoff

log = structlog.get_logger(__name__)


class Jobs:
    def __init__(self, errors: Counter, outage_errors: tuple[type[Exception], ...],
                 backoff: Backoff | None = None) -> None:
        self.errors = errors
        self.transient = (*outage_errors, OSError)
        self.backoff = backoff or Backoff()
        self.rng = random.Random()  # noqa: S311 - jitter, not secrets

    async def every(self, interval_s: float, name: str,
                    fn: Callable[[], Awaitable[Any]]) -> None:
        """Run ``fn`` every ``interval_s``; after a failure, again after a backoff."""
        failures = 0
        delay = interval_s
        while True:
            await asyncio.sleep(delay)
            try:
                await fn()
            except Exception as exc:
                _stop_if_asked(exc)
                failures += 1
                delay = min(interval_s, self._failed(name, exc, failures))
                continue
            if failures:
                log.info("broker_background_recovered", task=name, failures=failures)
            failures, delay = 0, interval_s

    async def restarted(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        """Run ``fn`` until it returns; when it fails, start it again after a backoff."""
        failures = 0
        while True:
            try:
                await fn()
                return
            except Exception as exc:
                _stop_if_asked(exc)
                failures += 1
                await asyncio.sleep(self._failed(name, exc, failures))

    def _failed(self, name: str, exc: Exception, failures: int) -> float:
        """Log and count a failure; returns the backoff before the next attempt."""
        delay = self.backoff.delay(failures, self.rng)
        if isinstance(exc, self.transient):
            self.errors.labels(task=name, kind="transient").inc()
            log.warning("broker_background_retrying", task=name, error=repr(exc),
                        failures=failures, retry_in_s=round(delay, 2))
        else:  # a bug: the broker serves on, and the traceback says where
            self.errors.labels(task=name, kind="bug").inc()
            log.error("broker_background_failed", task=name, error=repr(exc),
                      failures=failures, exc_info=True)
        return delay


def _stop_if_asked(exc: Exception) -> None:
    """A job the broker's stop cancelled ends, even when the cancel came back as a store
    error (asyncpg on a dropped connection): retried, it would hold the stop for good."""
    if cancelling.asked_to_stop():
        raise asyncio.CancelledError from exc
