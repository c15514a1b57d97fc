"""The broker's composition root: settings → logging → store → service → server → loops.

The only broker module that reads the environment, opens stores and starts servers.
``run`` serves until ``stop`` is set (SIGTERM/SIGINT in ``up``); background loops (retention
sweep, revocation re-check) run in one TaskGroup and ride out their failures
(``broker/background.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import Counter

import tidemesh
from tidemesh.broker import admin, running, store_source
from tidemesh.broker import log as broker_log
from tidemesh.broker.accept import Limits
from tidemesh.broker.background import Jobs
from tidemesh.broker.config import BrokerSettings, broker_home, store_url
from tidemesh.broker.console import Console, ensure_token
from tidemesh.broker.server import BrokerServer
from tidemesh.broker.service import BrokerService
from tidemesh.broker.service.clone import ClonePolicy
from tidemesh.broker.store import open_cluster, open_store, sqlite_file
from tidemesh.broker.store.base import Store
from tidemesh.broker.store.files import FileLimits
from tidemesh.core import cancelling, collector, tracing
from tidemesh.core.errors import InvalidRequest, TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.ids import new_ulid
from tidemesh.core.ratelimit import Rate
from tidemesh.core.watchdog import LoopWatchdog, StallPolicy, log_tasks
from tidemesh.storage.lock import AlreadyRunning, InstanceLock
from tidemesh.storage.sqlite import share_gil_with_writers

log = structlog.get_logger(__name__)


class WriterStopped(Exception):
    """A store's accept writer ended while the broker was running."""


async def _watch_writers(tasks: Sequence[asyncio.Task[None]]) -> None:
    """A writer that ends on its own would leave its senders answered 503 for ever; the
    broker exits instead, so that the service manager restarts it whole."""
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        error = "cancelled" if t.cancelled() else repr(t.exception())
        log.critical("broker_store_writer_stopped", task=t.get_name(), error=error)
    raise WriterStopped(", ".join(sorted(t.get_name() for t in done)))


def single_broker_lock(url: str) -> InstanceLock | None:
    """The embedded SQLite store serves one broker: a second one's members would miss the
    first's sessions, presence and wake-ups. Several brokers share PostgreSQL instead."""
    path = sqlite_file(url)
    if path is None:
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return InstanceLock(path.with_name(path.name + ".broker-lock"),
                        holder=f"a broker on the SQLite store {path}")


# Past shutdown.grace_s plus this, the watchdog ends the process whatever it waits for.
_STOP_MARGIN_S = 5.0
# How often the broker asks whether a burst of deliveries has gone quiet (core/heap.py).
HEAP_TRIM_CHECK_S = 2.0


async def run(settings: BrokerSettings, stop: asyncio.Event,
              ready: Callable[[int], None] | None = None,
              environ: Mapping[str, str] | None = None,
              watchdog: LoopWatchdog | None = None) -> None:
    """Serve until ``stop``. ``watchdog``: the process's loop watchdog (``up`` starts one;
    a broker run inside another program, a test's, has none)."""
    env = os.environ if environ is None else environ
    url = store_url(settings, env)
    lock = single_broker_lock(url)
    if lock is not None:
        lock.acquire()
    try:
        await _run(settings, url, stop, ready, watchdog)
    finally:
        if lock is not None:
            lock.release()


async def _run(settings: BrokerSettings, url: str, stop: asyncio.Event,
               ready: Callable[[int], None] | None, watchdog: LoopWatchdog | None) -> None:
    store = await open_store(url, batch_max=settings.store_batch_max,
                             pool_size=settings.store_pool_size, writers=settings.store_writers,
                             command_timeout_s=settings.store_command_timeout_s or None)
    limits = Limits(settings.limits_inline_bytes, settings.dedupe_mode,
                    settings.dedupe_retention_days)
    service = BrokerService(store, limits, retention_days=settings.retention_message_days,
                            stall_window_hours=settings.retention_stall_window_hours,
                            cluster=open_cluster(store, new_ulid()),
                            session_expiry_s=settings.cluster_session_expiry_s,
                            member_rate=Rate(settings.limits_member_rate,
                                             settings.limits_member_burst),
                            profile_rate=Rate(settings.limits_profile_rate,
                                              settings.limits_profile_burst),
                            clone_policy=ClonePolicy(settings.clone_policy),
                            clone_quarantine_s=settings.clone_quarantine_s,
                            file_limits=FileLimits(settings.files_max_bytes,
                                                   settings.files_member_quota_bytes,
                                                   settings.files_retention_days * 86_400_000))
    server = BrokerServer(service, max_inflight=settings.limits_max_inflight,
                          max_bad=settings.limits_bad_frames,
                          bad_window_s=settings.limits_bad_frames_window_s,
                          max_frame_bytes=settings.limits_inline_bytes * 2 + 65536,
                          hello_timeout_s=settings.auth_hello_timeout_s,
                          send_queue_frames=settings.limits_send_queue_frames,
                          slow_reader_s=settings.limits_slow_reader_s,
                          handshake_concurrency=settings.server_handshake_concurrency,
                          ping_interval_s=settings.server_ping_interval_s,
                          idle_timeout_s=settings.server_idle_timeout_s)
    if watchdog is not None:
        watchdog.counted = Counter(
            "cm_broker_loop_stalls_total", "Times the event loop did not turn for "
            "watchdog.stall_s (each logged with every thread's stack)",
            registry=service.metrics.registry).inc
        server.loop_state = watchdog.view
    if settings.console_enabled:
        server.console = Console(service, ensure_token(broker_home(os.environ)))
    failed: WriterStopped | None = None
    try:
        await service.peering.heartbeat()  # alive before the first member claims a session
        await service.refresh_limits()   # the meshes' own budgets before the first send
        await server.start(*settings.host_port)
        # Invites made from the CLI read this, so they name the port really listened on.
        await admin.record_public_url(store, admin.served_url(settings, server.port))
        if ready is not None:
            ready(server.port)
        try:
            await _serve(settings, service, server, store, stop)
        except* WriterStopped as group:
            failed = WriterStopped(str(group.exceptions[0]))
    finally:
        grace = settings.shutdown_grace_s
        if watchdog is not None:
            # The last word on a stop: gone shortly after the grace, whatever it waits for.
            watchdog.arm_deadline(grace + _STOP_MARGIN_S, Exit.FAILURE,
                                  "shutdown.grace_s passed")
        await server.stop(within=0.8 * grace)
        try:
            async with asyncio.timeout(max(1.0, 0.2 * grace)):
                await store.close()
        except TimeoutError:
            log.error("broker_store_close_cut_off", within_s=max(1.0, 0.2 * grace))
        log.info("broker_stopped")
    if failed is not None:
        raise failed


async def _serve(settings: BrokerSettings, service: BrokerService, server: BrokerServer,
                 store: Store, stop: asyncio.Event) -> None:
    """The background loops, until ``stop`` is set or a store writer stops."""
    jobs = Jobs(service.metrics.background_errors, store.outage_errors)
    _every, _restarted = jobs.every, jobs.restarted
    async with asyncio.TaskGroup() as tg:
        loops = [tg.create_task(_every(settings.retention_sweep_interval_s, "retention",
                                       service.sweep)),
                 tg.create_task(_every(settings.auth_recheck_s, "recheck",
                                       service.recheck_members)),
                 tg.create_task(_every(settings.auth_recheck_s, "mesh_limits",
                                       service.refresh_limits)),
                 tg.create_task(_every(settings.queue_lease_check_interval_s, "queue_leases",
                                       lambda: service.reassign_lapsed(settings.queue_lease_s))),
                 tg.create_task(_restarted("cluster", service.peering.run)),
                 tg.create_task(_every(settings.cluster_poll_s, "cluster_poll",
                                       service.peering.poll)),
                 tg.create_task(_every(settings.cluster_heartbeat_s, "cluster_heartbeat",
                                       service.peering.heartbeat)),
                 tg.create_task(_every(settings.server_idle_timeout_s / 4, "silent",
                                       server.close_silent)),
                 tg.create_task(_every(HEAP_TRIM_CHECK_S, "heap_trim",
                                       service.deliveries.trim_heap)),
                 tg.create_task(_watch_writers(store.writer_tasks))]
        await stop.wait()
        for t in loops:
            cancelling.stop(t)


def up(settings: BrokerSettings, password_on_command_line: bool = False) -> None:
    """``tidemesh broker up``: serve in the foreground until SIGTERM or SIGINT."""
    broker_log.configure(settings.log_level, settings.log_format)
    if password_on_command_line:   # the CLI printed it too; the log is what operators keep
        log.warning("broker_store_password_exposed", where="command line",
                    hint=store_source.CMDLINE_WARNING)
    tracing.install(settings.metrics_otel_endpoint, "tidemesh-broker", tidemesh.__version__,
                    settings.metrics_otel_export_delay_ms)

    record = running.record_path(os.environ)
    collector.tune_for_server()

    def ready(port: int) -> None:
        host = settings.host_port[0]
        # Operator commands that name no store act on this broker's (broker/running.py).
        try:
            running.write_both(record, running.RunningBroker(
                os.getpid(), store_url(settings, os.environ), f"{host}:{port}",
                admin.served_url(settings, port)))
        except OSError as exc:  # serving matters more; operators can still pass --store
            log.warning("broker_record_not_written", path=str(record), error=str(exc))
        print(json.dumps({"event": "broker_ready", "url": f"ws://{host}:{port}", "port": port}),
              flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP's default would kill the broker; it has nothing to reload (docs/configuration.md).
        loop.add_signal_handler(signal.SIGHUP, lambda: log.warning(
            "broker_reload_ignored", hint="settings are read only at start; restart the broker"))
        loop.add_signal_handler(signal.SIGUSR1, log_tasks)
        watchdog = LoopWatchdog(StallPolicy(settings.watchdog_stall_s,
                                            settings.watchdog_exit_after_s),
                                Exit.STALLED, lambda: None)
        watchdog.start()
        await run(settings, stop, ready, watchdog=watchdog)

    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    share_gil_with_writers()  # the SQLite store's writer thread; nothing on PostgreSQL
    try:
        runner(main())
    except WriterStopped:  # logged as broker_store_writer_stopped; let the manager restart us
        sys.exit(Exit.FAILURE)
    except TidemeshError as exc:
        # The store could not be opened: one line, 2 for a URL to fix (no such database or
        # role), else 1, which the service manager retries (a server starting up).
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        sys.exit(Exit.USAGE if isinstance(exc, InvalidRequest) else Exit.FAILURE)
    except AlreadyRunning as exc:
        print(f"error: {exc}; the SQLite store serves one broker, so run several brokers "
              "on one PostgreSQL store (broker.store = postgresql://…)", file=sys.stderr)
        sys.exit(Exit.ALREADY_RUNNING)
    finally:
        tracing.shutdown()
        running.remove(record, os.getpid())
        sys.stdout.flush()
