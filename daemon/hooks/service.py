"""Hooks run effectively once (DESIGN §10): the ledger's due runs are claimed, run with at
most ``concurrency`` processes at a time, and settled: done, due again after a backoff, or
given up as a ``hook_failed`` event. ``pre_send`` is the gate OutboxService calls before
accepting a send.

The ledger rows are written with their events (store/inbox.py); this service only wakes on
the EventBus, which publishes after COMMIT, and polls as a fallback, so a missed wake-up
delays a run and never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from tidemesh.core import hooks as rules
from tidemesh.core.backoff import Backoff
from tidemesh.core.errors import Busy
from tidemesh.core.hooks import HookConfig, HookPlan, NetworkPolicy, ReplyScope
from tidemesh.core.ids import new_ulid
from tidemesh.core.paths import DaemonPaths
from tidemesh.core.send import SendRequest
from tidemesh.daemon.hooks import presend
from tidemesh.daemon.hooks.capability import Capabilities
from tidemesh.daemon.hooks.files import load_plan
from tidemesh.daemon.hooks.launch import run_for_event
from tidemesh.daemon.hooks.runner import RunResult, Sandbox
from tidemesh.daemon.process.config import DaemonSettings
from tidemesh.daemon.records import Event
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.store import hooks as ledger
from tidemesh.daemon.store import inbox
from tidemesh.daemon.store.db import Connection, Database

__all__ = ["HookMetrics", "HookService", "HookSite", "load_plan"]

log = structlog.get_logger(__name__)

# Longest sleep between looks at the ledger when nothing wakes the service.
POLL_S = 2.0


@dataclass(frozen=True, slots=True)
class HookMetrics:
    invocations: Counter
    duration: Histogram
    unenforceable: Counter
    output_cut: Counter
    capability_calls: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry) -> HookMetrics:
        return cls(
            Counter("cm_daemon_hook_invocations_total", "Hook runs by hook and exit (a number, "
                    "timeout or error)", ["hook", "exit"], registry=registry),
            Histogram("cm_daemon_hook_duration_seconds", "Hook run time", ["hook"],
                      registry=registry),
            Counter("cm_daemon_hook_unenforceable_total", "Runs whose policy the host could "
                    "not enforce", ["hook", "reason"], registry=registry),
            Counter("cm_daemon_hook_output_truncated_total", "Runs whose stdout went over "
                    "output_size_limit and was cut", ["hook"], registry=registry),
            Counter("cm_daemon_hook_capability_calls_total", "Sends made with a hook's reply "
                    "token, by hook and scope (dm or topic)", ["hook", "scope"],
                    registry=registry),
        )


@dataclass(frozen=True, slots=True)
class HookSite:
    """Where hooks live and what they are told about the daemon."""

    folder: Path
    mesh: str
    socket: Path


@dataclass(slots=True)
class HookService:
    db: Database
    bus: EventBus
    plan: HookPlan
    site: HookSite
    metrics: HookMetrics
    concurrency: int = 8
    clock: Callable[[], float] = time.time
    capabilities: Capabilities = field(default_factory=Capabilities)
    sandbox: Sandbox | None = None
    max_attempts: int = rules.MAX_ATTEMPTS
    backoff: Backoff = rules.RETRY_BACKOFF
    rng: random.Random = field(default_factory=random.Random)
    _active: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _warned: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, db: Database, bus: EventBus, paths: DaemonPaths, s: DaemonSettings,
              registry: CollectorRegistry, clock: Callable[[], float]) -> HookService:
        """The service of a daemon's hooks/ folder, as hooks.toml and settings say."""
        metrics = HookMetrics.register(registry)
        calls = metrics.capability_calls
        return cls(db, bus, load_plan(paths.hooks_dir, bool(s.hooks_enabled)),
                   HookSite(paths.hooks_dir, s.daemon_mesh, paths.socket), metrics,
                   max(1, s.hooks_concurrency), clock, Capabilities(
                       on_use=lambda hook, kind: calls.labels(hook=hook, scope=kind).inc()))

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def run(self) -> None:
        """Recover what a crash interrupted, run on-startup, then serve the ledger forever."""
        recovered = await self.db.write(ledger.recover)
        if recovered:
            log.info("hook_runs_recovered", runs=recovered)
        if not self.plan.enabled:
            # Runs already recorded wait, pending, for a start with hooks enabled again; a
            # supervised task must not end, so this one just idles.
            log.info("hooks_disabled", setting="hooks.enabled")
            await asyncio.Event().wait()
        async with asyncio.TaskGroup() as tg:
            if any(self.plan.runnable(n) for n in self.plan.hooks):
                tg.create_task(self._listen(), name="hooks-listen")
            startup = self.plan.runnable(rules.ON_STARTUP)
            if startup is not None:
                self._active += 1
                tg.create_task(self._startup(startup), name="hook-on-startup")
            await self._dispatch(tg)

    async def _listen(self) -> None:
        while True:
            try:
                sub = self.bus.subscribe()
            except Busy:
                await asyncio.sleep(POLL_S)
                continue
            try:
                while not sub.dropped.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(POLL_S):
                            await sub.queue.get()
                            self._wake.set()
            finally:
                self.bus.unsubscribe(sub)

    async def _dispatch(self, tg: asyncio.TaskGroup) -> None:
        while True:
            self._wake.clear()
            # Looking is a read; only a due run with a free slot costs a write.
            due = await self.db.read(ledger.next_due)
            now, free = self._now_ms(), self.concurrency - self._active
            if due is not None and due <= now and free > 0:
                claimed = await self.db.write(partial(ledger.claim_due, now=now, limit=free))
                for run in claimed:
                    self._active += 1
                    tg.create_task(self._run(run), name=f"hook-{run.hook}")
                if claimed:
                    continue
            wait = POLL_S
            if due is not None and free > 0:
                wait = min(POLL_S, max(0.05, (due - now) / 1000))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _startup(self, cfg: HookConfig) -> None:
        # Each start is its own occurrence: nothing to remember, so no ledger row.
        try:
            key = f"startup-{new_ulid()}"
            doc = rules.stdin_doc(key, cfg.name, "daemon_started", {"mesh": self.site.mesh},
                                  self._now_ms())
            await self.execute(cfg, key, doc, None)
        finally:
            self._done()

    def _done(self) -> None:
        self._active -= 1
        self._wake.set()

    async def _run(self, run: ledger.Run) -> None:
        try:
            cfg = self.plan.runnable(run.hook)
            if cfg is None or run.event is None:
                reason = ("the hook is no longer enabled" if cfg is None
                          else "retention removed the event first")
                await self.db.write(partial(ledger.finish, run=run, state="failed",
                                            now=self._now_ms(), exit_code=None, error=reason))
                log.warning("hook_run_skipped", hook=run.hook, event_id=run.event_key,
                            reason=reason)
                return
            ev = run.event
            doc = rules.stdin_doc(run.event_key, run.hook, ev.type, ev.data, ev.created_at)
            scope = rules.reply_scope(run.event_key, ev.type, ev.data)
            result = await self.execute(cfg, run.event_key, doc, scope)
            await self._settle(run, result)
        finally:
            self._done()

    async def _settle(self, run: ledger.Run, result: RunResult) -> None:
        now = self._now_ms()
        if result.ok:
            await self.db.write(partial(ledger.finish, run=run, state="done", now=now,
                                        exit_code=0))
            return
        decision = rules.after_failure(run.failures + 1, self.rng, self.max_attempts,
                                       self.backoff)
        if decision.retry:
            await self.db.write(partial(
                ledger.finish, run=run, state="pending", now=now, exit_code=result.exit_code,
                error=result.describe(), due_at=now + int(decision.delay_s * 1000)))
            return
        event = inbox.NewEvent("hook_failed", {
            "hook": run.hook, "event_id": run.event_key, "log_id": run.event_id,
            "attempts": run.failures + 1, "error": result.describe()}, now,
            dedupe_key=f"hook_failed:{run.event_id}:{run.hook}")

        def give_up(conn: Connection) -> Event | None:
            ledger.finish(conn, run, "failed", now, result.exit_code, result.describe())
            return inbox.add_event(conn, event)

        stored = await self.db.write(give_up)
        log.warning("hook_failed", hook=run.hook, event_id=run.event_key,
                    attempts=run.failures + 1, error=result.describe())
        if stored is not None:
            self.bus.publish(stored)

    async def execute(self, cfg: HookConfig, key: str, doc: dict[str, object],
                      scope: ReplyScope | None) -> RunResult:
        """One run of one hook: token, stdin, process, audit line and metrics."""
        if self.sandbox is None:
            self.sandbox = await Sandbox.probe()
        token = (self.capabilities.issue(scope, cfg.name)
                 if cfg.allow_reply and scope is not None else None)
        try:
            result = await run_for_event(self.site.folder, self.site.mesh, self.site.socket,
                                         cfg, key, doc, self.sandbox, token)
        except Exception as exc:   # the runner's own bug must not stop every other hook
            log.exception("hook_run_crashed", hook=cfg.name, event_id=key)
            result = RunResult(None, False, b"", 0, b"", 0.0, False, error=repr(exc))
        self._record(cfg, key, result, self.capabilities.uses(token) if token else 0)
        return result

    def _record(self, cfg: HookConfig, key: str, result: RunResult, replied: int) -> None:
        exit_label = ("timeout" if result.timed_out else "error" if result.exit_code is None
                      else str(result.exit_code))
        self.metrics.invocations.labels(hook=cfg.name, exit=exit_label).inc()
        self.metrics.duration.labels(hook=cfg.name).observe(result.duration_s)
        if result.stdout_cut:
            self.metrics.output_cut.labels(hook=cfg.name).inc()
        if cfg.network_policy is NetworkPolicy.DENY and not result.isolated:
            self.metrics.unenforceable.labels(hook=cfg.name, reason="no_netns").inc()
            if cfg.name not in self._warned:
                self._warned.add(cfg.name)
                log.warning("hook_policy_unenforceable", hook=cfg.name, policy="network_deny",
                            reason="this host allows no new network namespace; it runs anyway")
        log.info("hook_executed", hook=cfg.name, event_id=key, exit=exit_label,
                 duration_ms=round(result.duration_s * 1000, 1),
                 stdout_bytes=result.stdout_bytes, stdout_truncated=result.stdout_cut,
                 stderr_bytes=result.stderr_bytes,
                 replied=replied, isolated=result.isolated)

    async def pre_send(self, req: SendRequest) -> None:
        """The gate of every send: a pre-send hook that does not exit 0 vetoes it (403)."""
        cfg = self.plan.runnable(rules.PRE_SEND)
        if cfg is None:
            return
        key, doc = presend.event(cfg, req, self._now_ms())
        presend.verdict(await self.execute(cfg, key, doc, None))
