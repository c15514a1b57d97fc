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
  The member's key is then quarantined here while two hosts keep presenting it: each hello
  is refused, whichever host it comes from, until only one host has been seen in the last
  ``clone.quarantine_s`` (``Sightings``). Without it the two would take turns: whichever
  retried first while the other was backing off would be let in, and refused at the next
  turn, so neither could say steadily that it is a clone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


def judge(policy: ClonePolicy, new_host: str | None, live_hosts: Iterable[str | None],
          recent_hosts: Iterable[str] = ()) -> CloneVerdict:
    """What to do with a new session marked ``new_host`` beside the member's live ones;
    under ``refuse_both`` the hosts of its quarantine (``recent_hosts``) count as live."""
    hosts = [*live_hosts, *recent_hosts] if policy is ClonePolicy.REFUSE_BOTH else live_hosts
    if new_host is None or not any(h is not None and h != new_host for h in hosts):
        return NOT_SUSPECTED
    if policy is ClonePolicy.REFUSE_NEW:
        return CloneVerdict(True, refuse_new=True)
    if policy is ClonePolicy.REFUSE_BOTH:
        return CloneVerdict(True, refuse_new=True, close_live=True)
    return CloneVerdict(True, mute_live=True)


class Sightings:
    """The hosts each quarantined member's key was seen from, and when (``refuse_both``).

    A member is quarantined once judged a clone; every marked hello of it then counts as a
    sighting of its host. Only hosts seen in the last ``window_ms`` count, and only the host
    actually seen is refreshed: when one copy stops (re-minted, shut down), its sightings age
    out and the other is let in again; a member with one recent host left is forgotten."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._seen: dict[tuple[str, str], dict[str, int]] = {}

    def recent(self, key: tuple[str, str], now: int) -> list[str]:
        hosts = self._seen.get(key)
        if hosts is None:
            return []
        for host, at in list(hosts.items()):
            if now - at > self.window_ms:
                del hosts[host]
        if len(hosts) < 2:
            del self._seen[key]
            return []
        return list(hosts)

    def saw(self, key: tuple[str, str], hosts: Iterable[str | None], now: int) -> None:
        seen = self._seen.setdefault(key, {})
        for host in hosts:
            if host is not None:
                seen[host] = now

    def __len__(self) -> int:
        return len(self._seen)


def is_other_host(new_host: str | None, live_host: str | None) -> bool:
    return new_host is not None and live_host is not None and live_host != new_host


class Clones:
    def __init__(self, policy: ClonePolicy, connections: Connections, metrics: Metrics,
                 peering: Peering, *, quarantine_s: float = 120.0,
                 clock: Callable[[], int] = now_ms) -> None:
        self.policy = policy
        self.sightings = Sightings(int(quarantine_s * 1000))
        self.clock = clock
        peering.clone_seen = self.seen_elsewhere
        self.connections = connections
        self.metrics = metrics
        self.peering = peering

    def seen_elsewhere(self, mesh_id: str, pubkey: str, hosts: list[str]) -> None:
        """Another broker judged these hosts' sessions of the member clones and had this one
        close its own (refuse_both): the key is quarantined here too, or the host closed
        here would be let straight back in."""
        if self.policy is ClonePolicy.REFUSE_BOTH:
            self.sightings.saw((mesh_id, pubkey), hosts, self.clock())

    async def check(self, mesh_id: str, pubkey: str, host: str | None) -> CloneVerdict:
        """Judge a new, authenticated session of this member marked ``host``, and act on the
        member's live connections here; the caller refuses the new one when told to."""
        live = list(self.connections.conns.get((mesh_id, pubkey), ()))
        # With several brokers, the member's session may be held by another one.
        remote = await self.peering.remote_session(mesh_id, pubkey) if host else None
        live_hosts = [*(c.host for c in live), remote.host if remote else None]
        now = self.clock()
        # Only refuse_both fills the sightings, and only it counts them (judge).
        recent = self.sightings.recent((mesh_id, pubkey), now)
        verdict = judge(self.policy, host, live_hosts, recent)
        if not verdict.suspected:
            return verdict
        if self.policy is ClonePolicy.REFUSE_BOTH:
            # Only the hosts seen now are refreshed (see Sightings).
            self.sightings.saw((mesh_id, pubkey), [host, *live_hosts], now)
        others = [c for c in live if is_other_host(host, c.host)]
        self.metrics.clones.labels(policy=self.policy.value).inc()
        log.warning("member_clone_suspected", mesh_id=mesh_id, pubkey=pubkey,
                    policy=self.policy.value, live_sessions=[c.session_id for c in others],
                    quarantined_hosts=len(recent),
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
        if remote is not None and host is not None and is_other_host(host, remote.host):
            # Its sessions are not muted: across brokers both hosts receive the deliveries.
            await self.peering.act_on_clone(remote, host, verdict.close_live, self.policy.value)
        return verdict
