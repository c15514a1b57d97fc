"""Typed application state (aiohttp ``AppKey``s); no string lookups elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tidemesh.core.metrics import Counter, Registry
from tidemesh.daemon.service.disk import DiskMonitor
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService
from tidemesh.daemon.service.membership import MembershipService
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.service.presence import PresenceService
from tidemesh.daemon.service.retention import RetentionService


@dataclass(slots=True)
class IpcState:
    """What handlers and middleware need besides the services."""

    token: str
    max_inflight: int
    public_health_check: bool
    info: dict[str, Any]          # mesh, pubkey, version, started_at, pid, paths ...
    registry: Registry
    requests: Counter
    sse_keepalive_s: float = 15.0
    sse_write_timeout_s: float = 10.0
    inflight: int = 0
    healthy: bool = True


OUTBOX = web.AppKey("outbox", OutboxService)
STATE = web.AppKey("state", IpcState)
INBOX = web.AppKey("inbox", InboxService)
BUS = web.AppKey("bus", EventBus)
MEMBERSHIP = web.AppKey("membership", MembershipService)
PRESENCE = web.AppKey("presence", PresenceService)
RETENTION = web.AppKey("retention", RetentionService)
DISK = web.AppKey("disk", DiskMonitor)
