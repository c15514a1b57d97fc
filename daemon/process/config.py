"""Every daemon setting, declared once (name, type, default, help)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemesh.core import tracing
from tidemesh.core.environment import AUTO, KINDS
from tidemesh.core.paths import NAME_RULE, is_name
from tidemesh.core.settings import ConfigError, Resolved, Setting, build

# The longest grace a rotated-out key may have: past a month a leaked key's DMs must stop.
MAX_GRACE_DAYS = 30

SETTINGS: tuple[Setting, ...] = (
    Setting("daemon.mesh", str, "default", "Mesh this daemon serves; one per (user, mesh)."),
    Setting("environment.kind", str, "auto", "host, container or ci: sets the defaults of "
            "ipc.tcp_enabled, hooks.enabled and identity.persistent (docs/threat-model.md, "
            "Environments). auto: ci when a CI variable is set, container when a container "
            "marker is found (KUBERNETES_SERVICE_HOST, /.dockerenv, /run/.containerenv, PID 1's "
            "cgroup), else host. `daemon up --container` or `--environment` set it."),
    Setting("environment.markers_root", str, "/", "The folder the container markers are read "
            "under (a chroot's root, or a test's)."),
    Setting("identity.persistent", bool, None, "Keep the member keypair in the data folder "
            "across runs. Unset: yes, except in CI, where the daemon is ephemeral (its key is "
            "in the runtime folder, the member leaves the mesh and the key is removed when it "
            "stops). True in CI logs persistent_keypair_in_ci_environment. `daemon up "
            "--persistent` or `--ephemeral` set it.", optional=True),
    Setting("ipc.tcp_enabled", bool, None, "Also listen on 127.0.0.1 (bearer token required). "
            "Unset: yes on a host, no in a container or CI.", optional=True),
    Setting("ipc.http_port", int, 0, "Loopback TCP port; 0 picks a free one (see http.port).",
            bounds=(0, 65535)),
    Setting("ipc.max_body_bytes", int, 1048576, "Largest request body; bigger ones get 413.",
            bounds=(1024, 1073741824)),
    Setting("ipc.max_inflight", int, 256, "Concurrent IPC requests before 429 daemon_busy.",
            reloadable=True, bounds=(1, 1000000)),
    Setting("ipc.public_health_check", bool, False, "Serve /v1/health on TCP without a token.",
            reloadable=True),
    Setting("ipc.max_streams", int, 32, "Concurrent /v1/events streams before 429.",
            reloadable=True, bounds=(1, 100000)),
    Setting("ipc.sse_buffer", int, 1000, "Events buffered per stream; a stream that falls "
            "further behind is dropped and must reconnect with Last-Event-ID.",
            bounds=(1, 10000000)),
    Setting("ipc.sse_keepalive_s", float, 15.0, "Seconds between SSE keepalive comments.",
            reloadable=True, bounds=(0.01, 86400)),
    Setting("ipc.sse_write_timeout_s", float, 10.0, "A stream whose writes stall this long "
            "is closed.", reloadable=True, bounds=(0.01, 86400)),
    Setting("ipc.header_timeout_s", float, 10.0, "Seconds a connection has to send a complete "
            "request head, counted from its start (on the Unix socket, a later request's from "
            "its first byte); then it is closed.", bounds=(0.01, 86400)),
    Setting("ipc.idle_timeout_s", float, 60.0, "A connection with no request for this long is "
            "closed (and a send lane body not complete this long after its request began).",
            bounds=(0.01, 86400)),
    Setting("ipc.max_unauthenticated", int, 64, "TCP connections that have not sent a request "
            "head yet; one more closes the one waiting longest. After its head a connection "
            "without the token is closed with its answer.", bounds=(1, 1000000)),
    Setting("ipc.rate_per_s", float, 100.0, "Requests a second each token may make, sustained "
            "(the Unix socket is one token, the local token on TCP another, each hook reply "
            "token its own); beyond it 429 rate_limited with Retry-After. 0: no limit.",
            reloadable=True, bounds=(0, 1000000000.0)),
    Setting("ipc.rate_burst", int, 1000, "Requests a token may make at once above "
            "ipc.rate_per_s (its bucket's size).", reloadable=True, bounds=(1, 1000000000)),
    Setting("ipc.token_grace_s", float, 60.0, "After `daemon rotate-token`, how long the "
            "previous local token is still accepted on TCP.", bounds=(0, 86400)),
    Setting("outbox.max_age_hours", int, 168, "Max age of an unsent row (permanent dedupe mode).",
            bounds=(1, 87600)),
    Setting("outbox.max_age_hours_override", int, None,
            "Shorter max age; refused above the broker's dedupe window.", optional=True,
            bounds=(1, 87600)),
    Setting("outbox.group_commit_max", int, 512, "Most writes grouped into one transaction.",
            bounds=(1, 100000)),
    Setting("outbox.retention_margin_hours", int, 24, "Done and aborted rows are deleted this "
            "long after the outbox max age (counted from their accept).", bounds=(0, 87600)),
    Setting("outbox.dead_retention_days", int, 30, "Dead rows not requeued or aborted by an "
            "operator are deleted this long after they died.", bounds=(0, 36500)),
    Setting("inbox.retention_days", int, 30, "Inbox entries older than this are deleted.",
            bounds=(0, 36500)),
    Setting("inbox.fts_enabled", bool, True, "Keep a full-text index of text bodies for "
            "GET /v1/inbox?q= (SQLite FTS5, in inbox.db). Turned on, the next start fills it "
            "from the inbox; turned off, it is emptied and q is refused."),
    Setting("inbox.consumer_hold_days", int, 90, "A named consumer that has not acked an entry "
            "keeps it up to this age; then it goes and the consumer's next read reports it.",
            bounds=(0, 36500)),
    Setting("events.retention_days", int, 30, "Events (GET /v1/events) older than this are "
            "deleted; at most inbox.retention_days.", bounds=(0, 36500)),
    Setting("retention.sweep_interval_s", float, 300.0, "Seconds between retention sweeps.",
            bounds=(0.01, 604800)),
    Setting("retention.batch_rows", int, 500, "Rows deleted per transaction by a sweep.",
            bounds=(1, 1000000)),
    Setting("disk.reserved_bytes", int, 134217728, "Free-space floor of the data directory's "
            "file system: under it new sends get 507 (receiving goes on); 0 disables it.",
            bounds=(0, 1125899906842624)),
    Setting("files.chunk_bytes", int, 262144, "Plaintext bytes per chunk of a shared file "
            "(`tidemesh file share`), 4096-1048576; a resumed share keeps the chunk size its "
            "upload began with only if this is unchanged.", bounds=(4096, 1048576)),
    Setting("files.window", int, 8, "Chunks of a file in flight to or from the broker at once "
            "(each holds chunk_bytes in memory).", bounds=(1, 1024)),
    Setting("reconnect.initial_backoff_ms", int, 500, "First retry delay to the broker.",
            bounds=(1, 3600000)),
    Setting("reconnect.max_backoff_ms", int, 30000, "Longest retry delay to the broker.",
            bounds=(1, 3600000)),
    Setting("reconnect.jitter_pct", int, 25, "Random spread of each retry delay, in percent.",
            bounds=(0, 100)),
    Setting("reconnect.handshake_timeout_s", float, 10.0, "A broker that does not finish the "
            "opening handshake (challenge, hello, features) within this is retried.",
            bounds=(0.01, 3600)),
    Setting("reconnect.stall_timeout_s", float, 30.0, "A broker link with a request of ours "
            "unanswered this long is cut and reconnected, whatever else the broker sends.",
            bounds=(0.01, 3600)),
    Setting("presence.feed", bool, True, "Keep who is present from the broker's presence "
            "feed (a snapshot, then every change), for GET /v1/peers and presence events. "
            "false: the broker sends none, /v1/peers asks it each time, and no presence events "
            "come (for a member of a large mesh that never shows who is there)."),
    Setting("crypto.key_grace_period_days", int, 7, "After `daemon rotate-keypair`, how many "
            "days the old key's X25519 half stays in keypair-archive.json so that DMs sealed "
            "to it still open (0 to 30).", bounds=(0, MAX_GRACE_DAYS)),
    Setting("hooks.enabled", bool, None, "Run the executables of the hooks/ folder that "
            "hooks.toml enables (docs/daemon.md, Hooks). Unset: yes, except in CI.",
            optional=True),
    Setting("hooks.concurrency", int, 8, "Most hook processes running at once.", bounds=(1, 1024)),
    *tracing.SETTINGS,
    Setting("log.level", str, "info", "debug, info, warning or error.", reloadable=True),
    Setting("log.format", str, "auto", "json, console, or auto (console on a TTY)."),
    Setting("log.file", str, None, "Append JSON lines to this file, rotated by size; unset: "
            "stderr (the journal under systemd). `daemon up` without --foreground sets it.",
            optional=True),
    Setting("log.file_max_bytes", int, 104857600, "Size at which log.file is rotated.",
            bounds=(1024, 1099511627776)),
    Setting("log.file_backups", int, 5, "Rotated log files kept (daemon.log.1 … .N).",
            bounds=(0, 1000)),
    Setting("watchdog.stall_s", float, 5.0, "An event loop that does not turn for this long is "
            "a stall: every thread's stack is logged once, and /v1/health says stalled.",
            bounds=(0.01, 3600)),
    Setting("watchdog.exit_after_s", float, 60.0, "A stall this long ends the daemon with exit "
            "code 16, for its service manager to restart it; 0 never does.", bounds=(0, 86400)),
    Setting("shutdown.grace_s", float, 10.0, "Longest drain on SIGTERM or `daemon down`; "
            "work still running then is cut off and the exit code is 1.", reloadable=True,
            bounds=(0, 3600)),
)


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    daemon_mesh: str
    environment_kind: str
    environment_markers_root: str
    identity_persistent: bool | None
    ipc_tcp_enabled: bool | None
    ipc_http_port: int
    ipc_max_body_bytes: int
    ipc_max_inflight: int
    ipc_public_health_check: bool
    ipc_max_streams: int
    ipc_sse_buffer: int
    ipc_sse_keepalive_s: float
    ipc_sse_write_timeout_s: float
    ipc_header_timeout_s: float
    ipc_idle_timeout_s: float
    ipc_max_unauthenticated: int
    ipc_rate_per_s: float
    ipc_rate_burst: int
    ipc_token_grace_s: float
    outbox_max_age_hours: int
    outbox_max_age_hours_override: int | None
    outbox_group_commit_max: int
    outbox_retention_margin_hours: int
    outbox_dead_retention_days: int
    inbox_retention_days: int
    inbox_fts_enabled: bool
    inbox_consumer_hold_days: int
    events_retention_days: int
    retention_sweep_interval_s: float
    retention_batch_rows: int
    disk_reserved_bytes: int
    files_chunk_bytes: int
    files_window: int
    reconnect_initial_backoff_ms: int
    reconnect_max_backoff_ms: int
    reconnect_jitter_pct: int
    reconnect_handshake_timeout_s: float
    reconnect_stall_timeout_s: float
    presence_feed: bool
    crypto_key_grace_period_days: int
    hooks_enabled: bool | None
    hooks_concurrency: int
    metrics_otel_endpoint: str
    metrics_otel_export_delay_ms: int
    log_level: str
    log_format: str
    log_file: str | None
    log_file_max_bytes: int
    log_file_backups: int
    watchdog_stall_s: float
    watchdog_exit_after_s: float
    shutdown_grace_s: float


def read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def load(
    file_data: Mapping[str, Any], environ: Mapping[str, str], flags: Mapping[str, Any]
) -> tuple[DaemonSettings, dict[str, Resolved]]:
    settings, resolved = build(DaemonSettings, SETTINGS, file_data, environ, flags)
    if settings.environment_kind not in (AUTO, *KINDS):
        raise ConfigError(f"environment.kind must be {AUTO}, {', '.join(KINDS)}, not "
                          f"{settings.environment_kind!r}", field="environment.kind")
    if not is_name(settings.daemon_mesh):   # a folder name: never one out of the home
        raise ConfigError(f"daemon.mesh {settings.daemon_mesh!r} is not a valid mesh name: "
                          f"{NAME_RULE}", field="daemon.mesh")
    tracing.check_settings(settings.metrics_otel_endpoint, settings.metrics_otel_export_delay_ms)
    return settings, resolved
