"""Typed application state (aiohttp ``AppKey``s); no string lookups elsewhere."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from tidemesh.core.ratelimit import Buckets, Rate
from tidemesh.daemon.hooks.capability import Capabilities
from tidemesh.daemon.service.backup import BackupService
from tidemesh.daemon.service.disk import DiskMonitor
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.files import FileService
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.membership import MembershipService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.service.presence import PresenceService
from tidemesh.daemon.service.retention import RetentionService


@dataclass(frozen=True, slots=True)
class IpcMetrics:
    """The request series the middleware keeps (spec §10 names)."""

    requests: Counter
    duration: Histogram
    rate_limited: Counter
    # (endpoint, status, transport) -> the two labelled children. ``labels()`` takes a lock
    # and checks the label names on every call; the set of keys is small (routes x statuses).
    _children: dict[tuple[str, int, str], tuple[Any, Any]] = field(default_factory=dict)

    @classmethod
    def register(cls, registry: CollectorRegistry) -> IpcMetrics:
        return cls(
            Counter("cm_daemon_ipc_request_total", "IPC requests by endpoint, status and transport",
                    ["endpoint", "status", "transport"], registry=registry),
            Histogram("cm_daemon_ipc_duration_seconds",
                      "IPC request duration by route template", ["endpoint"], registry=registry),
            Counter("cm_daemon_ipc_rate_limited_total",
                    "IPC requests refused 429 rate_limited (ipc.rate_per_s, ipc.rate_burst)",
                    ["transport"], registry=registry),
        )

    def record(self, endpoint: str, status: int, transport: str, seconds: float) -> None:
        """One answered request, in both series."""
        key = (endpoint, status, transport)
        pair = self._children.get(key)
        if pair is None:
            pair = self._children[key] = (
                self.requests.labels(endpoint=endpoint, status=str(status), transport=transport),
                self.duration.labels(endpoint=endpoint))
        pair[0].inc()
        pair[1].observe(seconds)


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """What a daemon is, fixed at start-up."""

    mesh: str
    version: str = ""
    member_pubkey: str = ""
    schema_version: int = 0
    started_monotonic: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)   # core.environment's view


@dataclass(slots=True)
class LinkState:
    """The broker link as last reported by the relay."""

    connected: bool = False
    broker_state: str | None = None
    clone_suspected: bool = False     # another host uses this member's key (the broker says)
    broker_features: dict[str, Any] = field(default_factory=dict)
    broker_features_negotiated: list[str] = field(default_factory=list)
    broker_version: str | None = None
    broker_url: str | None = None     # the broker of the current (else last) session


@dataclass(slots=True)
class OutboxGauges:
    """The outbox figures the gauges show, read from the outbox before each scrape (a
    gauge callback cannot wait for the database)."""

    counts: dict[str, int] = field(default_factory=dict)
    lag_ms: int = 0


@dataclass(slots=True)
class IpcState:
    """What handlers and middleware need besides the services."""

    token: str
    max_inflight: int
    public_health_check: bool
    info: DaemonInfo
    registry: CollectorRegistry
    metrics: IpcMetrics
    sse_keepalive_s: float = 15.0
    # Per-token request budgets (ipc.rate_per_s, ipc.rate_burst; middleware.charge).
    rate: Rate = field(default_factory=lambda: Rate(100.0, 1000))
    buckets: Buckets = field(default_factory=Buckets)
    buckets_pruned_ms: int = 0
    sse_write_timeout_s: float = 10.0
    inflight: int = 0
    healthy: bool = True
    link: LinkState = field(default_factory=LinkState)
    outbox: OutboxGauges = field(default_factory=OutboxGauges)
    # After `rotate-token`: the token before it, honoured until ``previous_until``
    # (monotonic) so programs holding it can re-read the file (daemon/membership/token_rotation.py).
    token_file: Path | None = None
    token_grace_s: float = 60.0
    previous_token: str | None = None
    previous_until: float = 0.0
    rotations: Any = field(default_factory=lambda: _NoCounter())
    # The loop watchdog's view (core/watchdog.py): state, stalls, last_stall_s.
    loop: Callable[[], dict[str, Any]] = lambda: {"state": "ok", "stalls": 0,
                                                  "last_stall_s": 0.0}


    def accepts(self, presented: str, now: float) -> bool:
        """Whether ``presented`` is the token, or the previous one within its grace; both
        compared in constant time."""
        ok = hmac.compare_digest(presented.encode(), self.token.encode())
        if self.previous_token is not None:
            old = hmac.compare_digest(presented.encode(), self.previous_token.encode())
            ok = ok or (old and now < self.previous_until)
        return ok


class _NoCounter:
    def inc(self) -> None:
        pass


OUTBOX = web.AppKey("outbox", OutboxService)
STATE = web.AppKey("state", IpcState)
INBOX = web.AppKey("inbox", InboxService)
BUS = web.AppKey("bus", EventBus)
MEMBERSHIP = web.AppKey("membership", MembershipService)
PRESENCE = web.AppKey("presence", PresenceService)
RETENTION = web.AppKey("retention", RetentionService)
DISK = web.AppKey("disk", DiskMonitor)
MAX_BODY = web.AppKey("max_body", int)
CAPABILITIES = web.AppKey("capabilities", Capabilities)
# The hook reply token a request was allowed by (the middleware sets it): such a caller
# sees only the outbox rows its own token made.
REPLY_TOKEN = web.RequestKey("reply_token", str)
BACKUP = web.AppKey("backup", BackupService)
FILES = web.AppKey("files", FileService)
