"""Reply tokens given to hooks that opt in (``allow_reply``): random, held only in memory,
valid for five minutes and for one target (core.hooks.ReplyScope). The IPC middleware asks
``scope_of``; what a scope allows is decided in core.hooks.capability_allows."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemesh.core.hooks import REPLY_TTL_S, ReplyScope

# A token is kept this long after it expired, so that using it late is refused (403) and
# never mistaken for a request without a token.
_FORGET_AFTER_S = 3600.0


@dataclass(slots=True)
class _Grant:
    scope: ReplyScope
    hook: str
    expires_at: float
    uses: int = 0
    rows: set[str] = field(default_factory=set)  # outbox ids its sends made


class Capabilities:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = REPLY_TTL_S,
                 on_use: Callable[[str, str], None] | None = None) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self.on_use = on_use   # (hook, scope kind): for cm_daemon_hook_capability_calls_total
        self._grants: dict[str, _Grant] = {}

    def issue(self, scope: ReplyScope, hook: str) -> str:
        now = self.clock()
        self._grants = {t: g for t, g in self._grants.items()
                        if g.expires_at + _FORGET_AFTER_S > now}
        token = "tmcap_" + secrets.token_urlsafe(32)
        self._grants[token] = _Grant(scope, hook, now + self.ttl_s)
        return token

    def is_capability(self, token: str) -> bool:
        return token in self._grants

    def scope_of(self, token: str) -> ReplyScope | None:
        """The scope of a live token; None when it expired (or was never given)."""
        grant = self._grants.get(token)
        if grant is None or grant.expires_at <= self.clock():
            return None
        return grant.scope

    def used(self, token: str) -> None:
        grant = self._grants.get(token)
        if grant is not None:
            grant.uses += 1
            if self.on_use is not None:
                self.on_use(grant.hook, grant.scope.kind)

    def made(self, token: str, outbox_id: str) -> None:
        """Record that a send with ``token`` made outbox row ``outbox_id``."""
        grant = self._grants.get(token)
        if grant is not None:
            grant.rows.add(outbox_id)

    def owns(self, token: str, outbox_id: str) -> bool:
        grant = self._grants.get(token)
        return grant is not None and outbox_id in grant.rows

    def uses(self, token: str) -> int:
        grant = self._grants.get(token)
        return 0 if grant is None else grant.uses
