"""Every broker setting, declared once (name, type, default, help), and where files live.

Resolved flag > environment (``TIDEMESH_*``) > TOML file > default by ``core.settings``.
Without ``--store`` the broker keeps an embedded SQLite file: ``$TIDEMESH_HOME/broker/
broker.db`` when ``TIDEMESH_HOME`` is set, else under the XDG data directory.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemesh.core import tracing
from tidemesh.core.features import MIN_RETENTION_DAYS, MODES
from tidemesh.core.settings import ConfigError, Resolved, Setting, build

CLONE_POLICIES = ("warn", "refuse_new", "refuse_both")   # broker/service/clone.py ClonePolicy
SETTINGS: tuple[Setting, ...] = (
    Setting("broker.listen", str, "127.0.0.1:7800", "HOST:PORT of the WebSocket and /metrics."),
    Setting("broker.store", str, None, "sqlite:///PATH or postgresql://…; default embedded SQLite. "
            "A URL with a password belongs here or in the environment, not in --store (the "
            "process list).", optional=True),
    Setting("broker.public_url", str, None, "ws(s):// address printed into invites; default "
            "ws://LISTEN with the port really bound, recorded in the store at start.",
            optional=True),
    Setting("store.pool_size", int, 4, "PostgreSQL pool for everything but accepts."),
    Setting("store.batch_max", int, 512, "Most sends group-committed in one transaction."),
    Setting("store.writers", int, 2, "PostgreSQL accept writers (batches committing at once)."),
    Setting("store.command_timeout_s", float, 60.0, "Longest a PostgreSQL statement may go "
            "unanswered before its connection counts as an outage (503, retried); 0: no limit. "
            "Migrations and retention sweeps have none."),
    Setting("dedupe.mode", str, "retention_scoped", "retention_scoped (keys kept "
            "dedupe.retention_days) or permanent (kept forever); daemons refuse a broker whose "
            "mode they cannot work with."),
    Setting("dedupe.retention_days", int, 14,
            "Dedupe window; >= 3 and longer than every daemon's outbox max age."),
    Setting("retention.message_days", int, 30, "Messages older than this are pruned."),
    Setting("retention.stall_window_hours", int, 24,
            "Unacked deliveries younger than this are never pruned, so a member "
            "that was away this long still gets them."),
    Setting("retention.sweep_interval_s", float, 3600.0, "How often retention sweeps run."),
    Setting("queue.lease_s", float, 300.0, "A queue delivery not acked within this goes to "
            "another consumer of the queue."),
    Setting("queue.lease_check_interval_s", float, 5.0, "How often lapsed queue leases are "
            "looked for."),
    Setting("files.max_bytes", int, 1 << 30, "Largest shared file (`tidemesh file share`); a "
            "larger one is refused 413 file_too_large naming this setting."),
    Setting("files.member_quota_bytes", int, 4 << 30, "Bytes of shared files one member may "
            "hold at the broker at once (persistent ones included); past it a share is "
            "refused 413 file_too_large."),
    Setting("files.retention_days", int, 7, "A shared file not marked persistent is deleted "
            "this long after its upload began (by the retention sweep)."),
    Setting("limits.inline_bytes", int, 1048576, "Largest message body (max_payload)."),
    Setting("limits.max_inflight", int, 256, "Sends in flight per connection before reads pause."),
    Setting("limits.send_queue_frames", int, 1024, "A connection's own frames queued for its "
            "writer; past this its tasks wait (presence is queued apart, coalesced)."),
    Setting("limits.slow_reader_s", float, 30.0, "A connection that takes no frame for this "
            "long is closed 4012 slow_reader."),
    Setting("limits.bad_frames", int, 20, "Bad frames per window before the connection closes."),
    Setting("limits.bad_frames_window_s", float, 10.0, "Window of limits.bad_frames."),
    Setting("limits.member_rate", float, 0.0, "New sends per second per member (token bucket "
            "refill); 0 = no limit. `broker mesh limits` overrides it per mesh."),
    Setting("limits.member_burst", int, 1000, "Token bucket size: new sends a member may make "
            "at once after a quiet spell."),
    Setting("limits.profile_rate", float, 0.5, "Profile changes per second per member that take "
            "effect at once (token bucket refill); faster ones are coalesced, the latest "
            "applied when the bucket allows."),
    Setting("limits.profile_burst", int, 5, "Profile changes a member may make at once after a "
            "quiet spell."),
    Setting("auth.hello_timeout_s", float, 10.0, "A connection must send a good hello within "
            "this, and once admitted be authenticated within it again (the wait for a "
            "handshake slot is not counted)."),
    Setting("server.ping_interval_s", float, 0.0, "WebSocket keepalive pings of the broker's "
            "own, this often (a peer is closed after one more interval without its pong); 0, "
            "the default, sends none: members ping the broker (a daemon every 20 s), and "
            "server.idle_timeout_s closes one gone silent. Each ping is a frame and a timer per "
            "member: at 1,000 members they were most of an idle broker's CPU."),
    Setting("server.idle_timeout_s", float, 60.0, "A connection the broker hears nothing from "
            "(no frame, no ping, no pong) for this long is closed (4015 silent): a member "
            "whose host or network went away, whose pings stopped coming. At least 30: "
            "daemons ping every 20 s."),
    Setting("server.handshake_concurrency", int, 64, "Hellos authenticated at once; the rest "
            "wait for a slot, off the hello clock (a connect storm is admitted, not timed "
            "out)."),
    Setting("auth.recheck_s", float, 5.0, "How often the broker looks for revocations, in one "
            "statement for all members (on PostgreSQL they also arrive at once by NOTIFY)."),
    Setting("cluster.poll_s", float, 5.0, "With several brokers on PostgreSQL: how often each "
            "looks for deliveries whose wake-up from another broker was lost."),
    Setting("cluster.heartbeat_s", float, 2.0, "With several brokers on PostgreSQL: how often "
            "each says it is alive (and removes the sessions of brokers that stopped)."),
    Setting("cluster.session_expiry_s", float, 10.0, "A broker silent this long is taken for "
            "dead: its members' sessions are removed and announced as peer_leave."),
    Setting("clone.policy", str, "warn", "One member key from two hosts (a cloned data dir): "
            "warn (both stay, the newest gets the deliveries), refuse_new (the new hello is "
            "closed 4013 clone_suspected) or refuse_both (the other host's sessions too)."),
    Setting("clone.quarantine_s", float, 120.0, "Under clone.policy refuse_both: a member's "
            "key seen from two hosts is refused from every host until only one host has "
            "presented it this long; longer than the daemons' reconnect.max_backoff_ms."),
    Setting("watchdog.stall_s", float, 5.0, "An event loop that does not turn for this long is "
            "a stall: every thread's stack is logged once, and /healthz answers 503 stalled."),
    Setting("watchdog.exit_after_s", float, 60.0, "A stall this long ends the broker with exit "
            "code 16, for its service manager to restart it; 0 never does."),
    Setting("shutdown.grace_s", float, 10.0, "Longest stop on SIGTERM: connections still "
            "closing then are dropped; past it by 5 s the process exits whatever it waits for."),
    Setting("console.enabled", bool, False, "Serve the read-only operator console at /console "
            "on the broker's port, behind its own token (broker_home/console-token, 0600)."),
    *tracing.SETTINGS,
    Setting("log.level", str, "info", "debug, info, warning or error."),
    Setting("log.format", str, "auto", "json, console, or auto (console on a TTY)."),
)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    broker_listen: str
    broker_store: str | None
    broker_public_url: str | None
    store_pool_size: int
    store_batch_max: int
    store_writers: int
    store_command_timeout_s: float
    dedupe_mode: str
    dedupe_retention_days: int
    retention_message_days: int
    retention_stall_window_hours: int
    retention_sweep_interval_s: float
    queue_lease_s: float
    queue_lease_check_interval_s: float
    files_max_bytes: int
    files_member_quota_bytes: int
    files_retention_days: int
    limits_inline_bytes: int
    limits_max_inflight: int
    limits_send_queue_frames: int
    limits_slow_reader_s: float
    limits_bad_frames: int
    limits_bad_frames_window_s: float
    limits_member_rate: float
    limits_member_burst: int
    limits_profile_rate: float
    limits_profile_burst: int
    auth_hello_timeout_s: float
    server_ping_interval_s: float
    server_idle_timeout_s: float
    server_handshake_concurrency: int
    auth_recheck_s: float
    cluster_poll_s: float
    cluster_heartbeat_s: float
    cluster_session_expiry_s: float
    clone_policy: str
    clone_quarantine_s: float
    watchdog_stall_s: float
    watchdog_exit_after_s: float
    shutdown_grace_s: float
    console_enabled: bool
    metrics_otel_endpoint: str
    metrics_otel_export_delay_ms: int
    log_level: str
    log_format: str

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.broker_listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


def broker_home(environ: Mapping[str, str]) -> Path:
    home = environ.get("TIDEMESH_HOME")
    if home:
        return Path(home).expanduser() / "broker"
    data = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "~")) / ".local/share")
    return Path(data).expanduser() / "tidemesh" / "broker"


def config_file(environ: Mapping[str, str]) -> Path:
    return Path(environ["TIDEMESH_BROKER_CONFIG"]) if environ.get(
        "TIDEMESH_BROKER_CONFIG") else broker_home(environ) / "broker.toml"


def embedded_store(environ: Mapping[str, str]) -> Path:
    return broker_home(environ) / "broker.db"


def store_url(settings: BrokerSettings, environ: Mapping[str, str]) -> str:
    return settings.broker_store or f"sqlite:///{embedded_store(environ)}"


def read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def load(
    file_data: Mapping[str, Any], environ: Mapping[str, str], flags: Mapping[str, Any]
) -> tuple[BrokerSettings, dict[str, Resolved]]:
    settings, resolved = build(BrokerSettings, SETTINGS, file_data, environ, flags)
    _validate(settings)
    return settings, resolved


def _validate(s: BrokerSettings) -> None:
    if s.dedupe_mode not in MODES:
        raise ConfigError(f"dedupe.mode must be one of {MODES}", field="dedupe.mode")
    if s.dedupe_mode == "retention_scoped" and s.dedupe_retention_days < MIN_RETENTION_DAYS:
        raise ConfigError(f"dedupe.retention_days must be >= {MIN_RETENTION_DAYS}",
                          field="dedupe.retention_days")
    if s.limits_inline_bytes < 1024:
        raise ConfigError("limits.inline_bytes must be >= 1024", field="limits.inline_bytes")
    if s.files_max_bytes < 0 or s.files_member_quota_bytes < 0 or s.files_retention_days < 1:
        raise ConfigError("files.max_bytes and files.member_quota_bytes must be >= 0 and "
                          "files.retention_days >= 1", field="files")
    if s.limits_send_queue_frames < 1:
        raise ConfigError("limits.send_queue_frames must be >= 1",
                          field="limits.send_queue_frames")
    if s.limits_slow_reader_s <= 0:
        raise ConfigError("limits.slow_reader_s must be > 0", field="limits.slow_reader_s")
    if s.limits_member_rate < 0:
        raise ConfigError("limits.member_rate must be >= 0 (0: no limit)",
                          field="limits.member_rate")
    if s.limits_profile_rate <= 0 or s.limits_profile_burst < 1:
        raise ConfigError("limits.profile_rate must be > 0 and limits.profile_burst >= 1",
                          field="limits.profile_rate")
    _validate_clone(s)
    _validate_server(s)
    if s.store_command_timeout_s < 0:
        raise ConfigError("store.command_timeout_s must be >= 0 (0: no limit)",
                          field="store.command_timeout_s")
    if s.limits_member_burst < 1:
        raise ConfigError("limits.member_burst must be >= 1", field="limits.member_burst")
    tracing.check_settings(s.metrics_otel_endpoint, s.metrics_otel_export_delay_ms)
    try:
        s.host_port  # noqa: B018
    except ValueError as exc:
        raise ConfigError("broker.listen must be HOST:PORT", field="broker.listen") from exc


def _validate_clone(s: BrokerSettings) -> None:
    if s.clone_policy not in CLONE_POLICIES:
        raise ConfigError(f"clone.policy must be one of {CLONE_POLICIES}", field="clone.policy")
    if s.clone_quarantine_s <= 0:
        raise ConfigError("clone.quarantine_s must be > 0", field="clone.quarantine_s")


# A daemon pings every 20 s (daemon/link/websocket.KEEPALIVE_S): the idle timeout leaves a
# ping's worth of room.
MIN_IDLE_TIMEOUT_S = 30.0


def _validate_server(s: BrokerSettings) -> None:
    if s.server_ping_interval_s < 0:
        raise ConfigError("server.ping_interval_s must be >= 0 (0: no pings of the broker's own)",
                          field="server.ping_interval_s")
    if s.server_idle_timeout_s < MIN_IDLE_TIMEOUT_S:
        raise ConfigError(f"server.idle_timeout_s must be >= {MIN_IDLE_TIMEOUT_S:.0f}: daemons "
                          "ping every 20 s, and a shorter timeout would close idle ones",
                          field="server.idle_timeout_s")
    if s.server_handshake_concurrency < 1:
        raise ConfigError("server.handshake_concurrency must be >= 1",
                          field="server.handshake_concurrency")
