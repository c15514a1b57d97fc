"""Who may connect: the hello / join handshake against the store, and closing the
connections of members revoked since they connected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from tidemesh.broker.service.connections import Connections, now_ms
from tidemesh.broker.service.metrics import Metrics
from tidemesh.broker.session import ROTATED_OUT
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import NotFound
from tidemesh.core.invite import token_hash
from tidemesh.core.paths import is_name

log = structlog.get_logger(__name__)
# A revocation is looked for this far before the last look: the revoking process's clock may
# lag this broker's, and a member revoked while it was being admitted is caught too.
RECHECK_MARGIN_MS = 60_000
# How many other holders of a joiner's display name hello_ack names.
NAME_TAKEN_SHOWN = 10


@dataclass(frozen=True, slots=True)
class AuthOutcome:
    mesh_id: str
    mesh_name: str
    pubkey: str
    problem: str | None
    joined: bool = False
    display_name: str | None = None
    # Other current members that go by the display name the joiner asked for: told to the
    # joiner, since recipients cannot tell the two apart by the name alone.
    name_taken_by: tuple[str, ...] = ()


class Auth:
    def __init__(self, store: Store, metrics: Metrics, connections: Connections) -> None:
        self.store = store
        self.metrics = metrics
        self.connections = connections
        self._checked_at = now_ms()

    async def authenticate(self, frame: dict[str, Any]) -> AuthOutcome:
        mesh_id, pubkey = frame["mesh_id"], frame["pubkey"]
        joining = frame["type"] == "join"
        # A hello reads the mesh and the member at once (one round trip per connection).
        mesh, member = ((await self.store.find_mesh(mesh_id), None) if joining
                        else await self.store.mesh_member(mesh_id, pubkey))
        if mesh is None or mesh.id != mesh_id:
            return self._rejected(mesh_id, pubkey, "unknown_mesh")
        if joining:
            if not is_name(mesh.name):   # made before names were checked: a path on the host
                return self._rejected(mesh_id, pubkey, "invalid_mesh_name")
            try:
                await self.store.redeem_invite(mesh_id, token_hash(frame["invite_token"]), pubkey,
                                               frame.get("display_name"), now_ms())
            except NotFound as exc:
                return self._rejected(mesh_id, pubkey, str(exc.details.get("reason", "invite")))
            log.info("broker_member_joined", mesh_id=mesh_id, pubkey=pubkey)
            name = frame.get("display_name")
            taken = tuple(k for k in await self.store.members_named(
                mesh_id, name, NAME_TAKEN_SHOWN + 1) if k != pubkey)[:NAME_TAKEN_SHOWN] \
                if name else ()
            return AuthOutcome(mesh_id, mesh.name, pubkey, None, joined=True,
                               display_name=name, name_taken_by=taken)
        if member is None:
            return self._rejected(mesh_id, pubkey, "unknown_member")
        if member.rotated_to is not None:
            return self._rejected(mesh_id, pubkey, ROTATED_OUT)
        if member.revoked_at is not None:
            return self._rejected(mesh_id, pubkey, "member_revoked")
        return AuthOutcome(mesh_id, mesh.name, pubkey, None, display_name=member.display_name)

    def _rejected(self, mesh_id: str, pubkey: str, reason: str) -> AuthOutcome:
        self.metrics.rejected.labels(reason=reason).inc()
        log.warning("broker_handshake_rejected", mesh_id=mesh_id, pubkey=pubkey, reason=reason)
        return AuthOutcome(mesh_id, "", pubkey, reason)

    def handshake_closed(self, reason: str) -> None:
        self.metrics.rejected.labels(reason=reason).inc()
        log.warning("broker_handshake_rejected", reason=reason)

    async def recheck_members(self) -> None:
        """Close the connections of members revoked since the last look: one statement
        whatever the number connected (with PostgreSQL, NOTIFY closes them at once; this is
        the safety net, and SQLite's only way to hear of a revocation made by the CLI)."""
        now = now_ms()
        since = self._checked_at - RECHECK_MARGIN_MS
        revoked = await self.store.revoked_since(since)
        self._checked_at = now
        for mesh_id, pubkey in revoked:
            rotated = False
            if (mesh_id, pubkey) in self.connections.conns:   # a rotated-out key closes 4014
                member = await self.store.get_member(mesh_id, pubkey)
                rotated = member is not None and member.rotated_to is not None
            await self.connections.close_revoked(mesh_id, pubkey, rotated=rotated)
