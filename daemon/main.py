"""The daemon's composition root: config → logging → lock → identity → stores → IPC → wait.

The only module that reads the environment, constructs stores and servers, and installs
signal handlers. ``run`` returns a process exit code (core.exitcodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from prometheus_client import Counter

import tidemesh
from tidemesh.core import logfilters, tracing
from tidemesh.core.backoff import Backoff
from tidemesh.core.environment import Effective
from tidemesh.core.errors import InvalidName
from tidemesh.core.exitcodes import Exit
from tidemesh.core.metrics import CallbackGauge, CollectorRegistry
from tidemesh.core.ownership import NotPrivate
from tidemesh.core.paths import DaemonPaths, daemon_paths, socket_path_problem
from tidemesh.core.ratelimit import Rate
from tidemesh.core.retention import DAY_MS, HOUR_MS, InboxPolicy
from tidemesh.core.sealing import seal_request
from tidemesh.core.settings import ConfigError
from tidemesh.core.watchdog import LoopWatchdog, StallPolicy, log_tasks
from tidemesh.daemon.api.connections import ConnectionLimits
from tidemesh.daemon.api.keys import (
    BACKUP,
    BUS,
    CAPABILITIES,
    DISK,
    FILES,
    INBOX,
    MEMBERSHIP,
    OUTBOX,
    PRESENCE,
    RETENTION,
    STATE,
    DaemonInfo,
    IpcMetrics,
    IpcState,
)
from tidemesh.daemon.hooks.service import HookService, load_plan
from tidemesh.daemon.link.live_link import not_joined
from tidemesh.daemon.link.relay import Relay, RelayFatal, RelayMetrics, RelaySettings
from tidemesh.daemon.membership import ephemeral, identity, key_rotation, revocation
from tidemesh.daemon.membership.join import MeshConfig
from tidemesh.daemon.membership.keyring import Keyring
from tidemesh.daemon.process import config as config_mod
from tidemesh.daemon.process import environment as environment_mod
from tidemesh.daemon.process import fleet as fleet_mod
from tidemesh.daemon.process import log as log_mod
from tidemesh.daemon.process import storage_gauges
from tidemesh.daemon.process.lifecycle import Drain, Reloader, StopBudget, finish, kept_running
from tidemesh.daemon.process.private import ensure_dirs, ensure_token
from tidemesh.daemon.process.server import IpcServer, build_app
from tidemesh.daemon.process.socket_watch import SocketWatch
from tidemesh.daemon.process.stores import open_inbox, open_outbox
from tidemesh.daemon.service.backup import BackupService
from tidemesh.daemon.service.disk import DiskMonitor
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.files import FileService, FileSettings
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.membership import MembershipService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.service.presence import PresenceService
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings
from tidemesh.daemon.store.db import OUTBOX_MIGRATIONS, Database, SchemaTooNew, StoreDamaged
from tidemesh.storage.lock import AlreadyRunning, InstanceLock
from tidemesh.storage.sqlite import share_gil_with_writers

log = structlog.get_logger("tidemesh.daemon")

# After the drain, event streams still open are cut off this long after their last write.
_STREAMS_CUT_S = 1.0
# The share of shutdown.grace_s kept for closing the broker link after the drain.
_RELAY_SHARE = 0.2
# Past shutdown.grace_s plus this, the watchdog ends the process whatever it waits for.
_STOP_MARGIN_S = 5.0
# How a failed background task (retention, hooks, the socket watch) is started again.
_TASK_BACKOFF = Backoff(1.0, 60.0)


@dataclass(frozen=True, slots=True)
class Startup:
    settings: config_mod.DaemonSettings
    paths: DaemonPaths
    retention: RetentionSettings
    environment: Effective                # host, container or CI, and what it changed
    environ: Mapping[str, str] = field(default_factory=dict)   # kept for SIGHUP reloads
    flags: Mapping[str, Any] = field(default_factory=dict)


def resolve_mesh(flag: str | None, environ: Mapping[str, str]) -> str:
    return flag or environ.get("TIDEMESH_DAEMON_MESH") or "default"


def prepare(mesh: str | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> Startup:
    """Settings and paths, validated before anything starts ("fail early")."""
    name = resolve_mesh(mesh, environ)
    paths = daemon_paths(name, environ)
    flags = {**flags, "daemon.mesh": name}
    settings, _ = config_mod.load(config_mod.read_file(paths.config_file), environ, flags)
    settings, env = environment_mod.settled(settings, environ)
    load_plan(paths.hooks_dir, bool(settings.hooks_enabled))   # a bad hooks.toml stops the start
    return Startup(settings, paths, retention_settings(settings), env, dict(environ), flags)


def retention_settings(s: config_mod.DaemonSettings) -> RetentionSettings:
    """The retention settings, checked against each other before anything starts."""
    numbers = {
        "outbox.retention_margin_hours": s.outbox_retention_margin_hours,
        "outbox.dead_retention_days": s.outbox_dead_retention_days,
        "inbox.retention_days": s.inbox_retention_days,
        "inbox.consumer_hold_days": s.inbox_consumer_hold_days,
        "events.retention_days": s.events_retention_days,
        "retention.batch_rows": s.retention_batch_rows,
    }
    for name, value in numbers.items():
        if value < 1:
            raise ConfigError(f"{name} must be at least 1", field=name)
    if s.retention_sweep_interval_s <= 0 or s.disk_reserved_bytes < 0:
        raise ConfigError("retention.sweep_interval_s must be positive and "
                          "disk.reserved_bytes not negative")
    try:
        inbox = InboxPolicy(s.inbox_retention_days * DAY_MS, s.inbox_consumer_hold_days * DAY_MS,
                            s.events_retention_days * DAY_MS)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return RetentionSettings(s.outbox_retention_margin_hours * HOUR_MS,
                             s.outbox_dead_retention_days * DAY_MS, inbox,
                             s.retention_batch_rows)


def run(mesh: str | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns the exit code."""
    try:
        start = prepare(mesh, environ, flags)
    except (ConfigError, InvalidName) as exc:
        print(f"tidemesh daemon: {exc.message}", file=sys.stderr)
        return Exit.USAGE
    try:
        ensure_dirs(start.paths)
    except NotPrivate as exc:
        print(f"tidemesh daemon: {exc.message}", file=sys.stderr)
        return Exit.USAGE
    s = start.settings
    log_mod.configure(s.log_level, s.log_format, file=s.log_file,
                      max_bytes=s.log_file_max_bytes, backups=s.log_file_backups)
    _say_environment(start.environment)
    problem = socket_path_problem(start.paths.socket)
    if problem:
        log.error("daemon_start_refused", reason=problem)
        return Exit.USAGE
    # A file-size limit must turn into a write error (507), not kill the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # A reload (SIGHUP) sent while still starting must not kill the daemon; the reload
    # handler replaces this once the IPC server runs.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lock = InstanceLock(start.paths.lock_file)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        log.error("daemon_start_refused", reason=str(exc), pid=exc.pid)
        return Exit.ALREADY_RUNNING
    try:
        refused = fleet_mod.refusal(s.daemon_mesh, start.environ)
        if refused is not None:
            log.error("daemon_start_refused", reason="fleet_max_daemons", hint=refused)
            return Exit.USAGE
        return _run_locked(start)
    finally:
        lock.release()


def _say_environment(env: Effective) -> None:
    log.info("environment_detected", **env.view())
    for warning in env.warnings:
        # The only warning today: a persistent key asked for in CI (spec §16).
        log.warning(warning, hint="a CI runner keeps this mesh identity after the job; "
                                  "unset identity.persistent (drop --persistent) unless the "
                                  "runner is yours alone")


def _run_locked(start: Startup) -> int:
    paths = start.paths
    problem = identity.host_problem(paths.host_fingerprint,
                                    identity.current_host_fingerprint(start.environ))
    if problem is not None:
        made = ("was made on another host" if problem == "host_fingerprint_mismatch" else
                "is a copy of another data folder on this host (cp -a, rsync)")
        log.error(
            "daemon_start_refused", reason=problem,
            hint=f"this data dir {made}; if it moved here, run "
                 "`tidemesh daemon accept-host`; if it is a copy of a daemon that still runs, "
                 "give it a member key of its own: `tidemesh daemon join INVITE --remint`",
        )
        return Exit.HOST_MISMATCH
    revoked = revocation.load(paths.revoked_file)
    if revoked is not None:
        log.error("daemon_start_refused", reason="member_revoked", hint=revoked.message)
        return Exit.REVOKED
    settled = key_rotation.settle_at_start(paths, start.settings.crypto_key_grace_period_days)
    if settled in (key_rotation.Action.WAIT, key_rotation.Action.LOST):
        log.error("daemon_start_refused", reason="key_rotation_pending", state=str(settled),
                  hint="a key rotation was interrupted and the broker cannot say which key it "
                       "knows; start again once it is reachable, or run `tidemesh daemon "
                       "rotate-keypair` (docs/operations.md, A key leaked: rotate it)")
        return Exit.FAILURE
    if start.settings.identity_persistent:
        keypair, created = identity.load_or_create_keypair(paths.keypair)
        if created:
            log.info("keypair_created", pubkey=keypair.public_hex)
    else:
        keypair = _ephemeral_keypair(paths)
        refused = ephemeral.link_refusal(paths, keypair.public_hex)
        if refused is not None:
            log.error("daemon_start_refused", reason="not_the_member_key", hint=refused)
            return Exit.USAGE
    share_gil_with_writers()
    runner = _loop_runner()
    s = start.settings
    tracing.install(s.metrics_otel_endpoint, "tidemesh-daemon", tidemesh.__version__,
                    s.metrics_otel_export_delay_ms, {"tidemesh.mesh": s.daemon_mesh})
    try:
        return int(runner(Daemon(start, keypair).serve()))
    finally:
        tracing.shutdown()


def _ephemeral_keypair(paths: DaemonPaths) -> identity.Keypair:
    """The key of an ephemeral daemon; one a killed daemon left is retired first."""
    leftover, keypair = ephemeral.take(paths)
    if leftover is not None:
        asyncio.run(ephemeral.retire(paths, leftover.keypair, "left_by_killed_daemon"))
    if paths.keypair.exists():
        log.warning("persistent_keypair_ignored", path=str(paths.keypair),
                    hint="this daemon is ephemeral (environment.kind); set "
                         "identity.persistent = true (--persistent) to run with that key")
    log.info("ephemeral_keypair_used", pubkey=keypair.public_hex)
    return keypair


def _loop_runner() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.run
    return uvloop.run


class Daemon:
    def __init__(self, start: Startup, keypair: identity.Keypair) -> None:
        self.start = start
        self.keypair = keypair
        self.stop = asyncio.Event()
        self.cut_off: list[str] = []   # tasks a bounded stop left running
        # The one clock of the process: every service and the relay take it from here.
        self.clock: Callable[[], float] = time.time

    async def serve(self) -> int:
        s, paths = self.start.settings, self.start.paths
        try:
            outbox_db = await open_outbox(paths.outbox_db, s.outbox_group_commit_max)
        except (StoreDamaged, SchemaTooNew) as exc:
            log.error("daemon_start_refused", reason="outbox_unusable", error=str(exc),
                      hint="the outbox is authoritative and is never rebuilt silently; restore "
                           "it from a backup or move it aside to start with an empty outbox")
            return Exit.UNHEALTHY
        inbox_db = await open_inbox(paths.inbox_db, s.inbox_fts_enabled)
        try:
            code = await self._serve_with(outbox_db, inbox_db)
        finally:
            await outbox_db.close()
            await inbox_db.close()
            if not self.start.settings.identity_persistent:
                await ephemeral.retire(paths, self.keypair, "daemon_stopped")
        if self.cut_off:
            # The loop's teardown would wait for the tasks that did not end (cancelling them
            # again, without limit): the stores are closed, so leave now. The kernel releases
            # the instance lock.
            log.warning("daemon_exited_without_waiting", tasks=self.cut_off, exit_code=code)
            os._exit(code)
        return code

    def _state(self) -> IpcState:
        s = self.start.settings
        registry = CollectorRegistry()
        state = IpcState(
            token=ensure_token(self.start.paths.token_file),
            max_inflight=s.ipc_max_inflight,
            rate=Rate(s.ipc_rate_per_s, s.ipc_rate_burst),
            public_health_check=s.ipc_public_health_check,
            sse_keepalive_s=s.ipc_sse_keepalive_s,
            sse_write_timeout_s=s.ipc_sse_write_timeout_s,
            info=DaemonInfo(s.daemon_mesh, tidemesh.__version__, self.keypair.public_hex,
                            len(OUTBOX_MIGRATIONS.load()), time.monotonic(),
                            self.start.environment.view()),
            registry=registry,
            metrics=IpcMetrics.register(registry),
            token_file=self.start.paths.token_file,
            token_grace_s=s.ipc_token_grace_s,
            rotations=Counter("cm_daemon_local_token_rotations_total",
                              "Local bearer token rotations (daemon rotate-token)",
                              registry=registry),
        )
        logfilters.redact.add_secret(state.token)  # never written to a log, whatever holds it
        mesh = s.daemon_mesh
        CallbackGauge(
            "cm_daemon_connected", "1 while the broker WebSocket is open", ["mesh"],
            lambda: [({"mesh": mesh}, float(state.link.connected))], registry)
        CallbackGauge(
            "cm_daemon_lag_ms", "How long the oldest unsent outbox row has waited", ["mesh"],
            lambda: [({"mesh": mesh}, float(state.outbox.lag_ms))], registry)
        CallbackGauge(
            "cm_daemon_outbox_age_seconds", "Age of the oldest unsent outbox row", ["mesh"],
            lambda: [({"mesh": mesh}, state.outbox.lag_ms / 1000)], registry)
        CallbackGauge(
            "cm_daemon_outbox_depth", "Outbox rows by status", ["mesh", "status"],
            lambda: [({"mesh": mesh, "status": k}, float(v))
                     for k, v in state.outbox.counts.items()], registry)
        return state

    async def _serve_with(self, outbox_db: Database, inbox_db: Database) -> int:
        s, paths = self.start.settings, self.start.paths
        bus = EventBus(s.ipc_max_streams, s.ipc_sse_buffer)
        app = build_app(s.ipc_max_body_bytes)
        key = self.keypair.signing_key
        fleet_settings, _ = fleet_mod.settings(self.start.environ)
        fleet_disk = fleet_mod.FleetDisk(self.start.environ,
                                         fleet_settings.fleet_total_disk_budget)
        disk = DiskMonitor(paths.data_dir, {"outbox": outbox_db.path, "inbox": inbox_db.path},
                           s.disk_reserved_bytes,
                           budget=fleet_disk if fleet_disk.budget is not None else None)
        app[DISK] = disk
        app[STATE] = self._state()
        hooks = HookService.build(inbox_db, bus, paths, s, app[STATE].registry, self.clock)
        app[CAPABILITIES] = hooks.capabilities
        app[BACKUP] = BackupService(paths, s.daemon_mesh)
        app[OUTBOX] = OutboxService(
            outbox_db, clock=self.clock, admit=disk.check_send, gate=hooks.pre_send,
            sealer=lambda req, cmid: seal_request(key, req, cmid))
        app[RETENTION] = RetentionService(outbox_db, inbox_db, self.start.retention, self.clock,
                                          deleted=Counter(
                                              "cm_daemon_retention_deleted_total",
                                              "Rows retention deleted, by kind", ["kind"],
                                              registry=app[STATE].registry))
        storage_gauges.disk_gauges(app[STATE].registry, disk, s.daemon_mesh)
        storage_gauges.db_batches(app[STATE].registry, {"outbox": outbox_db, "inbox": inbox_db})
        app[INBOX] = InboxService(inbox_db, bus, self.clock, hooks.plan,
                                  search_enabled=s.inbox_fts_enabled)
        app[BUS] = bus
        keyring = Keyring.load(key, paths.keypair_archive, self.clock, app[STATE].registry)
        relay = self._relay(app[OUTBOX], app[INBOX], app[STATE], keyring)
        live = relay.live.if_open if relay is not None else not_joined
        app[MEMBERSHIP] = MembershipService(inbox_db, live)
        app[PRESENCE] = PresenceService(inbox_db, live, self.keypair.public_hex)
        file_bytes = Counter("cm_daemon_file_bytes_total", "Plaintext bytes of shared files "
                             "sent to and received from the broker", ["direction"],
                             registry=app[STATE].registry)
        app[FILES] = FileService(inbox_db, live, app[OUTBOX], disk, bytes(key),
                                 self.keypair.public_hex, paths.data_dir / "files",
                                 FileSettings(s.files_chunk_bytes, s.files_window), self.clock,
                                 lambda d, n: file_bytes.labels(direction=d).inc(n))
        app[FILES].clear_spool()
        readdress = [partial(relay.reload_addresses, paths.mesh_file)] if relay else []
        reloader = Reloader(s, self._read_settings, app[STATE], bus, also=readdress)
        budget = StopBudget()
        drain = Drain(app[STATE], lambda: budget.left(
            keep=_RELAY_SHARE * reloader.settings.shutdown_grace_s))
        app.on_shutdown.append(drain)
        # The drain hook waits for requests; this is only for event streams left after it.
        server = IpcServer(app, paths.socket, s.ipc_http_port if s.ipc_tcp_enabled else None,
                           _STREAMS_CUT_S, ConnectionLimits(s.ipc_header_timeout_s,
                                                            s.ipc_idle_timeout_s,
                                                            s.ipc_max_unauthenticated))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, reloader.reload)
        loop.add_signal_handler(signal.SIGUSR1, log_tasks)
        watchdog = self._watchdog(app[STATE])
        await server.start()
        if server.bound_port is not None:
            paths.port_file.write_text(f"{server.bound_port}\n", encoding="ascii")
        log.info("daemon_started", pid=os.getpid(), mesh=s.daemon_mesh, socket=str(paths.socket),
                 tcp_port=server.bound_port, data_dir=str(paths.data_dir),
                 pubkey=self.keypair.public_hex)
        relay_task = asyncio.create_task(relay.run(), name="relay") if relay else None
        restarts = Counter("cm_daemon_background_restarts_total", "Background tasks started "
                           "again after a failure (logged as background_task_failed)", ["task"],
                           registry=app[STATE].registry)
        urgent = ((lambda: fleet_disk.over) if fleet_disk.budget is not None
                  else (lambda: False))
        jobs: dict[str, Callable[[], Awaitable[Any]]] = {
            "retention": lambda: app[RETENTION].run(s.retention_sweep_interval_s, urgent=urgent),
            "hooks": hooks.run,
            "ipc-socket": SocketWatch(server).run,
            "key-archive": keyring.run,   # the daily expiry of rotated-out keys
        }
        others = {asyncio.create_task(kept_running(name, fn, _TASK_BACKOFF,
                                                   lambda n: restarts.labels(task=n).inc()),
                                      name=name): name for name, fn in jobs.items()}
        code = await self._supervise([outbox_db, inbox_db], relay_task, app[STATE], others)
        grace = reloader.settings.shutdown_grace_s
        budget.begin(grace)
        # The last word on a stop: whatever the loop, a task or a thread is stuck in, the
        # process is gone shortly after its grace (SQLite commits are atomic).
        watchdog.arm_deadline(grace + _STOP_MARGIN_S, Exit.FAILURE, "shutdown.grace_s passed")
        started = time.monotonic()
        # A hook cut off here runs again at the next start (the ledger).
        cut = await finish(others, budget.left(keep=0.8 * grace))
        # Stop accepting and finish in-flight requests first (their sends reach the outbox),
        # then close the broker link; the stores commit and close in serve(). Event streams
        # never finish by themselves, so they are ended first. The drain (on_shutdown) has
        # the budget less a share kept for the link.
        bus.close()
        stopping = asyncio.create_task(server.stop(), name="ipc-stop")
        await asyncio.wait({stopping}, timeout=budget.left(keep=_RELAY_SHARE * grace) + 2.0)
        if not stopping.done():
            cut += await finish({stopping: "ipc-server"}, 0.0)
        with contextlib.suppress(FileNotFoundError):
            paths.port_file.unlink()
        if relay_task is not None:
            cut += await finish({relay_task: "relay"}, max(1.0, budget.left()))
        self.cut_off = cut
        if (drain.left or cut) and code == Exit.OK:
            code = Exit.FAILURE
        log.info("daemon_stopped", drain_s=round(time.monotonic() - started, 3),
                 batches=outbox_db.batches, rows=outbox_db.items, exit_code=int(code),
                 cut_off=cut)
        return code

    def _watchdog(self, state: IpcState) -> LoopWatchdog:
        s = self.start.settings
        stalls = Counter("cm_daemon_loop_stalls_total", "Times the event loop did not turn for "
                         "watchdog.stall_s (each logged with every thread's stack)", ["mesh"],
                         registry=state.registry).labels(mesh=s.daemon_mesh)
        watchdog = LoopWatchdog(StallPolicy(s.watchdog_stall_s, s.watchdog_exit_after_s),
                                Exit.STALLED, stalls.inc)
        watchdog.start()
        state.loop = watchdog.view
        return watchdog

    def _relay(self, outbox: OutboxService, inbox: InboxService,
               state: IpcState, keyring: Keyring) -> Relay | None:
        paths, s = self.start.paths, self.start.settings
        if not paths.mesh_file.exists():
            log.info("broker_link_disabled", reason="not joined to a mesh; run "
                     "`tidemesh daemon join INVITE`; sends stay queued until then")
            return None
        # An ephemeral daemon whose key is not the member's was refused at start.
        mesh = MeshConfig.load(paths.mesh_file)

        async def on_status(connected: bool, detail: dict[str, Any]) -> None:
            was = state.link.connected
            state.link.connected = connected
            state.link.broker_state = detail.get("state")
            if relay.live.current is not None:
                # After a failover this is the broker now served by, not the invite's first.
                current = relay.live.current
                state.link.broker_features = current.supported
                state.link.broker_features_negotiated = current.negotiated
                state.link.broker_url = current.url
                state.link.broker_version = current.broker_version
            if detail.get("state") == "connected" and not detail.get("clone_suspected"):
                state.link.clone_suspected = False
            elif detail.get("state") == "clone_suspected":
                # One event per spell (a refused daemon retries with backoff); the metric and
                # the log count every time.
                if not state.link.clone_suspected:
                    state.link.clone_suspected = True
                    await inbox.record_event("clone_suspected", {"mesh": mesh.mesh, **detail})
                return
            if detail.get("state") == "revoked":
                log.error("member_revoked", hint=revocation.record(paths.revoked_file,
                                                                   mesh.mesh).message)
            if was != connected or not connected:
                await inbox.record_event("broker_status", {"mesh": mesh.mesh, **detail})

        backoff = Backoff(s.reconnect_initial_backoff_ms / 1000, s.reconnect_max_backoff_ms / 1000,
                          2.0, s.reconnect_jitter_pct / 100)
        relay = Relay(mesh, self.keypair.signing_key, outbox, inbox,
                      RelaySettings(backoff, s.outbox_max_age_hours,
                                    s.outbox_max_age_hours_override,
                                    handshake_timeout_s=s.reconnect_handshake_timeout_s,
                                    stall_timeout_s=s.reconnect_stall_timeout_s,
                                    presence_feed=s.presence_feed), on_status,
                      metrics=RelayMetrics.register(state.registry, s.daemon_mesh),
                      clock=self.clock,
                      host_fingerprint=identity.instance_mark(
                          identity.current_host_fingerprint(self.start.environ), paths.data_dir),
                      keyring=keyring)
        return relay

    async def _supervise(self, dbs: list[Database], relay: asyncio.Task[None] | None,
                         state: IpcState, others: dict[asyncio.Task[None], str]) -> Exit:
        """Wait for a stop signal; a background task that ends on its own is a failure."""
        stop = asyncio.create_task(self.stop.wait(), name="stop-signal")
        watched: dict[asyncio.Task[Any], str] = {db.writer: str(db.path) for db in dbs}
        watched.update(others)
        if relay is not None:
            watched[relay] = "relay"
        done, _ = await asyncio.wait({stop, *watched}, return_when=asyncio.FIRST_COMPLETED)
        if stop in done:
            return Exit.OK
        stop.cancel()
        state.healthy = False
        code = Exit.FAILURE
        for task in done:
            exc = task.exception() if not task.cancelled() else None
            if isinstance(exc, RelayFatal):
                code = exc.code
            log.error("background_task_stopped", task=watched[task], error=repr(exc))
        return code

    def _read_settings(self) -> config_mod.DaemonSettings:
        start = self.start
        settings, _ = config_mod.load(config_mod.read_file(start.paths.config_file),
                                      start.environ, start.flags)
        return environment_mod.settled(settings, start.environ)[0]

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("daemon_stop_requested", signal=sig.name)
        self.stop.set()
