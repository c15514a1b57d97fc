"""A running daemon's lifecycle past start-up: SIGHUP reload and the shutdown drain deadline.

Owns which settings a running daemon re-applies on SIGHUP (those ``process/config.py`` marks
``reloadable``: log level, IPC limits, SSE timing, the grace period) and how shutdown waits
for in-flight IPC requests before the server cuts them off. ``main`` wires both in; nothing
here reads the environment or touches the broker link, so a reload never drops the WebSocket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog
from aiohttp import web

from tidemesh.core import cancelling
from tidemesh.core.backoff import Backoff
from tidemesh.core.ratelimit import Rate
from tidemesh.core.settings import ConfigError
from tidemesh.daemon.api.keys import IpcState
from tidemesh.daemon.process import config as config_mod
from tidemesh.daemon.process import log as log_mod
from tidemesh.daemon.service.events import EventBus

log = structlog.get_logger("tidemesh.daemon")

# How often the drain looks at the in-flight count. IpcState keeps a counter, not a
# condition, so shutdown polls it; this runs once per process, only while stopping.
_DRAIN_POLL_S = 0.02


def apply(settings: config_mod.DaemonSettings, state: IpcState, bus: EventBus) -> None:
    """Push the reloadable settings into the running objects that read them per request."""
    log_mod.set_level(settings.log_level)
    state.max_inflight = settings.ipc_max_inflight
    state.rate = Rate(settings.ipc_rate_per_s, settings.ipc_rate_burst)
    state.public_health_check = settings.ipc_public_health_check
    state.sse_keepalive_s = settings.ipc_sse_keepalive_s
    state.sse_write_timeout_s = settings.ipc_sse_write_timeout_s
    bus.max_subscribers = settings.ipc_max_streams


class Reloader:
    """Re-reads the configuration; applies what can change live, reports what cannot."""

    def __init__(self, settings: config_mod.DaemonSettings,
                 read: Callable[[], config_mod.DaemonSettings],
                 state: IpcState, bus: EventBus,
                 also: Sequence[Callable[[], None]] = ()) -> None:
        self.also = also   # what else a reload re-reads (the mesh's broker addresses)
        self.settings = settings
        self.read = read
        self.state = state
        self.bus = bus

    def reload(self) -> None:
        for step in self.also:
            step()
        try:
            new = self.read()
        except ConfigError as exc:
            log.error("config_reload_failed", error=exc.message, kept="previous settings")
            return
        old = self.settings
        changed = [s for s in config_mod.SETTINGS
                   if getattr(old, s.attr) != getattr(new, s.attr)]
        # Settings that need a restart keep their running value, so what the daemon reports
        # as its settings stays what it actually uses.
        kept = {s.attr: getattr(old, s.attr) for s in config_mod.SETTINGS if not s.reloadable}
        self.settings = dataclasses.replace(new, **kept)
        apply(self.settings, self.state, self.bus)
        log.info("config_reloaded", applied=[s.name for s in changed if s.reloadable],
                 needs_restart=[s.name for s in changed if not s.reloadable])


class Drain:
    """An ``on_shutdown`` hook: wait for in-flight IPC requests, up to the grace period.

    aiohttp runs it after the listeners stopped accepting and idle connections closed, and
    before it cancels the handlers still running; ``left`` is how many it had to cut off.
    Event streams are not counted: they never finish on their own.
    """

    def __init__(self, state: IpcState, grace_s: Callable[[], float]) -> None:
        self.state = state
        self.grace_s = grace_s
        self.left = 0

    async def __call__(self, _app: web.Application) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s()
        while self.state.inflight and loop.time() < deadline:  # noqa: ASYNC110 - see _DRAIN_POLL_S
            await asyncio.sleep(_DRAIN_POLL_S)
        self.left = self.state.inflight
        if self.left:
            log.error("daemon_drain_deadline_passed", requests_cut_off=self.left,
                      grace_s=self.grace_s())


class StopBudget:
    """One grace period shared by the steps of a stop, in order: each step gets what the
    steps before it left. ``begin`` starts the clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadline: float | None = None

    def begin(self, grace_s: float) -> None:
        self.deadline = self.clock() + grace_s

    def left(self, keep: float = 0.0) -> float:
        """Seconds left, less ``keep`` held back for the steps after this one."""
        if self.deadline is None:
            return 0.0
        return max(0.0, self.deadline - self.clock() - keep)


async def finish(tasks: Mapping[asyncio.Task[Any], str], within: float) -> list[str]:
    """Cancel ``tasks`` and wait for them at most ``within`` seconds; returns the names of
    those still running then, each logged with where it stands. A task that ignores its
    cancel (or waits in a thread) is left behind: the process exits without it, and every
    commit it may have made is atomic."""
    for task in tasks:
        cancelling.stop(task)
    if not tasks:
        return []
    done, pending = await asyncio.wait(tasks, timeout=max(within, 0.01))
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("background_task_failed_on_stop", task=tasks[task],
                        error=repr(task.exception()))
    for task in pending:
        log.error("shutdown_step_cut_off", task=tasks[task], within_s=round(within, 3),
                  stack=_stack_of(task))
    return [tasks[t] for t in pending]


def _stack_of(task: asyncio.Task[Any]) -> str:
    buf = io.StringIO()
    task.print_stack(limit=20, file=buf)
    return buf.getvalue()


async def kept_running(name: str, fn: Callable[[], Awaitable[Any]], backoff: Backoff,
                       restarts: Callable[[str], None] | None = None,
                       rng: random.Random | None = None) -> None:
    """Run a background task for the life of the process: one that fails (a store busy or
    restarting, a socket that cannot be bound yet, a defect) is logged, counted and started
    again after the backoff, never a reason to exit. One that returns is done."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
    attempt = 0
    while True:
        started = time.monotonic()
        try:
            await fn()
            return
        except Exception as exc:  # transient by decision (DESIGN: transient or fatal)
            if cancelling.asked_to_stop():   # the stop's cancel came back as this error
                raise asyncio.CancelledError from exc
            if time.monotonic() - started > backoff.maximum_s:
                attempt = 0   # it ran a good while: a fresh failure, not the same one
            attempt += 1
            delay = backoff.delay(attempt, rng)
            log.error("background_task_failed", task=name, error=f"{type(exc).__name__}: {exc}",
                      retry_in_s=round(delay, 2), exc_info=True)
            if restarts is not None:
                restarts(name)
        await asyncio.sleep(delay)
