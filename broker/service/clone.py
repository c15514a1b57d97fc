"""Clone detection: one member key presented from two hosts (a VM image or a data dir copied
with the daemon's keypair). ``judge`` decides (pure); ``Clones`` carries it out on the
member's live connections, and the server on the new one.

A hello may carry ``host_fingerprint`` (core/handshake.py ``host_mark``). A new session whose
mark differs from that of a live session of the same member is a suspected clone; one from a
daemon that sent no mark (an older daemon) is never judged. ``clone.policy`` decides:

- ``warn``: both sessions stay; the newest receives the deliveries, the older ones stay
  connected for their sends (two hosts acking one delivery stream would split it between them);
  when the newest ends, the newest remaining one takes the deliveries over.
- ``refuse_new``: the new hello is closed 4013 ``clone_suspected``; the live session stays.
- ``refuse_both``: the new hello and the live sessions of the other host are closed 4013.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import structlog

from tidemesh.broker.service.connections import Connections, now_ms
from tidemesh.core.wire import CloseCode

if TYPE_CHECKING:  # both import this module (cluster.py) or lead to it (metrics → store)
    from tidemesh.broker.service.cluster import Peering
    from tidemesh.broker.service.metrics import Metrics

log = structlog.get_logger(__name__)

REASON = "clone_suspected"


class ClonePolicy(StrEnum):
    WARN = "warn"
    REFUSE_NEW = "refuse_new"
    REFUSE_BOTH = "refuse_both"


@dataclass(frozen=True, slots=True)
class CloneVerdict:
    suspected: bool
    refuse_new: bool = False
    close_live: bool = False     # close the live sessions of the other host(s)
    mute_live: bool = False      # the other host's sessions stop receiving deliveries


NOT_SUSPECTED = CloneVerdict(False)


def judge(policy: ClonePolicy, new_host: str | None,
          live_hosts: Iterable[str | None]) -> CloneVerdict:
    """What to do with a new session marked ``new_host`` beside the member's live ones."""
    if new_host is None or not any(h is not None and h != new_host for h in live_hosts):
        return NOT_SUSPECTED
    if policy is ClonePolicy.REFUSE_NEW:
        return CloneVerdict(True, refuse_new=True)
    if policy is ClonePolicy.REFUSE_BOTH:
        return CloneVerdict(True, refuse_new=True, close_live=True)
    return CloneVerdict(True, mute_live=True)


def is_other_host(new_host: str | None, live_host: str | None) -> bool:
    return new_host is not None and live_host is not None and live_host != new_host


class Clones:
    def __init__(self, policy: ClonePolicy, connections: Connections, metrics: Metrics,
                 peering: Peering) -> None:
        self.policy = policy
        self.connections = connections
        self.metrics = metrics
        self.peering = peering

    async def check(self, mesh_id: str, pubkey: str, host: str | None) -> CloneVerdict:
        """Judge a new, authenticated session of this member marked ``host``, and act on the
        member's live connections here; the caller refuses the new one when told to."""
        live = list(self.connections.conns.get((mesh_id, pubkey), ()))
        # With several brokers, the member's session may be held by another one.
        remote = await self.peering.remote_session(mesh_id, pubkey) if host else None
        verdict = judge(self.policy, host, [*(c.host for c in live),
                                            remote.host if remote else None])
        if not verdict.suspected:
            return verdict
        others = [c for c in live if is_other_host(host, c.host)]
        self.metrics.clones.labels(policy=self.policy.value).inc()
        log.warning("member_clone_suspected", mesh_id=mesh_id, pubkey=pubkey,
                    policy=self.policy.value, live_sessions=[c.session_id for c in others],
                    other_broker=remote.broker_id if remote is not None
                    and is_other_host(host, remote.host) else None,
                    hint="two hosts present this member's key with different host "
                         "fingerprints: a cloned data dir; on the copy, `tidemesh daemon join "
                         "INVITE --remint` gives it a key of its own (docs/operations.md, A "
                         "cloned host)")
        for c in others:
            if verdict.close_live:
                await c.peer.close(CloseCode.CLONE, REASON)
                continue
            c.muted = c.muted or verdict.mute_live
            await c.peer.send_frame({"type": "clone_suspected", "mesh_id": mesh_id,
                                     "pubkey": pubkey, "policy": self.policy.value,
                                     "receives_deliveries": not c.muted, "at": now_ms()})
        if remote is not None and is_other_host(host, remote.host):
            # Its sessions are not muted: across brokers both hosts receive the deliveries.
            await self.peering.act_on_clone(remote, verdict.close_live, self.policy.value)
        return verdict
