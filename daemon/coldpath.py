"""The cold path: one send straight to the broker when no daemon answers (DESIGN §5.2).

It signs as the same member as the daemon (same keypair, same mesh config), so it shares
the daemon's idempotency keys at the broker: a send made here and retried later through the
daemon with the same id and content is recognised as the same send. Nothing is queued: if
the broker cannot be reached the caller is told, with the id to retry with. A composition
root of its own, used by the CLI.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidemesh.core.errors import InvalidRequest, NotFound, TidemeshError, Unavailable, from_body
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.ids import new_ulid
from tidemesh.core.paths import DaemonPaths
from tidemesh.core.sealing import seal_request
from tidemesh.core.send import DestinationKind, parse_send_request
from tidemesh.daemon import revocation
from tidemesh.daemon.api.validation import checked
from tidemesh.daemon.dial import dial_first
from tidemesh.daemon.identity import load_or_create_keypair
from tidemesh.daemon.join import MeshConfig
from tidemesh.daemon.link import HandshakeRejected, LinkError


def send(paths: DaemonPaths, request: dict[str, Any], client_message_id: str | None,
         timeout: float = 15.0) -> dict[str, Any]:
    """Send one message directly; returns the broker's answer as the CLI shows it."""
    if not paths.mesh_file.exists() or not paths.keypair.exists():
        raise NotFound("no daemon is running and this host has not joined the mesh; run "
                       "`tidemesh daemon join INVITE` then `tidemesh daemon up`")
    revoked = revocation.load(paths.revoked_file)
    if revoked is not None:
        raise revoked.error()
    req = parse_send_request(checked("send_request.schema.json", request), client_message_id)
    cmid = req.client_message_id or new_ulid()
    keypair, _ = load_or_create_keypair(paths.keypair)
    if req.to.kind is DestinationKind.DM:
        req = seal_request(keypair.signing_key, req, cmid)
    mesh = MeshConfig.load(paths.mesh_file)
    try:
        answer = asyncio.run(_send(mesh, keypair.signing_key, cmid, req.to_payload(), timeout))
    except HandshakeRejected as exc:
        if exc.reason != revocation.REASON:
            raise _unreachable(mesh, exc, cmid) from exc
        raise revocation.record(paths.revoked_file, mesh.mesh).error() from exc
    except (LinkError, TimeoutError) as exc:
        raise _unreachable(mesh, exc, cmid) from exc
    return _result(answer, cmid)


def _unreachable(mesh: MeshConfig, exc: Exception, cmid: str) -> Unavailable:
    where = " or ".join(mesh.broker_urls)
    return Unavailable(f"the broker at {where} could not be reached ({exc}); "
                       f"nothing is queued on the cold path: retry with --id {cmid}",
                       client_message_id=cmid)


async def _send(mesh: MeshConfig, key: Any, cmid: str, payload: dict[str, Any],
                within: float) -> dict[str, Any]:
    async with asyncio.timeout(within):
        link = await dial_first(BrokerRotation.of(mesh.broker_urls), mesh.mesh_id, key)
        async with link:
            return await link.send(cmid, payload)


def _result(answer: dict[str, Any], cmid: str) -> dict[str, Any]:
    status = int(answer["status"])
    if status in (200, 201):
        return {"client_message_id": cmid, "status": "done" if status == 201 else "duplicate",
                "duplicate": status == 200, "broker_message_id": answer.get("broker_message_id"),
                "history_id": answer.get("history_id"), "path": "cold"}
    if status == 409:
        raise from_body(409, {"error": {
            "code": "idempotency_key_reused", "message": f"client_message_id {cmid!r} was used "
            "at the broker for a different request; send again under a new id",
            "conflict": answer.get("conflict"), "client_message_id": cmid,
            "broker_fingerprint_prefix": answer.get("broker_fingerprint_prefix")}})
    err = answer.get("error") or {}
    if 400 <= status < 500:
        raise InvalidRequest(f"the broker refused the send: {err.get('message', status)}",
                             broker_code=err.get("code"), client_message_id=cmid)
    raise TidemeshError(f"the broker failed ({status}): {err.get('message', '')}; retry with "
                        f"--id {cmid}", client_message_id=cmid)
