"""The cold path: one send straight to the broker when no daemon answers (DESIGN §5.2).

It signs as the same member as the daemon (same keypair, same mesh config), so it shares
the daemon's idempotency keys at the broker: a send made here and retried later through the
daemon with the same id and content is recognised as the same send. Nothing is queued: if
the broker cannot be reached the caller is told, with the id to retry with. A composition
root of its own, used by the CLI.

What the daemon enforces holds here too (DESIGN §11): the mesh's pre-send hook runs as the
daemon runs it, or the send is refused. And it runs only while it holds the daemon's
instance lock itself: a daemon that holds it, however slow, keeps its broker session, and
no daemon can start halfway through a cold send.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from tidemesh.core.errors import InvalidRequest, NotFound, TidemeshError, Unavailable, from_body
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.ids import new_ulid
from tidemesh.core.names import is_key
from tidemesh.core.paths import DaemonPaths, daemon_paths
from tidemesh.core.sealing import seal_request
from tidemesh.core.send import DestinationKind, parse_send_request
from tidemesh.daemon.api.validation import checked
from tidemesh.daemon.hooks.presend import gate_without_daemon
from tidemesh.daemon.link.dial import dial_first
from tidemesh.daemon.link.websocket import HandshakeRejected, LinkError
from tidemesh.daemon.membership import revocation
from tidemesh.daemon.membership.identity import load_or_create_keypair
from tidemesh.daemon.membership.join import MeshConfig
from tidemesh.daemon.process import config, environment
from tidemesh.storage.lock import InstanceLock

HOLDER = "a daemon (or a cold-path send) for this mesh"


def send(mesh: str, request: dict[str, Any], client_message_id: str | None,
         environ: Mapping[str, str], timeout: float = 15.0) -> dict[str, Any]:
    """Send one message directly; returns the broker's answer as the CLI shows it. Raises
    ``storage.lock.AlreadyRunning`` when a daemon holds the mesh's instance lock."""
    paths = daemon_paths(mesh, environ)
    if not paths.mesh_file.exists() or not paths.keypair.exists():
        raise NotFound("no daemon is running and this host has not joined the mesh; run "
                       "`tidemesh daemon join INVITE` then `tidemesh daemon up`")
    # The runtime folder may be gone since the daemon last ran (a reboot empties it).
    paths.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = InstanceLock(paths.lock_file, HOLDER)
    lock.acquire()
    try:
        return _send_locked(mesh, paths, request, client_message_id, environ, timeout)
    finally:
        lock.release()


def _send_locked(name: str, paths: DaemonPaths, request: dict[str, Any],
                 client_message_id: str | None, environ: Mapping[str, str],
                 timeout: float) -> dict[str, Any]:
    revoked = revocation.load(paths.revoked_file)
    if revoked is not None:
        raise revoked.error()
    req = parse_send_request(checked("send_request.schema.json", request), client_message_id)
    if req.to.kind is DestinationKind.DM and not is_key(req.to.ref):
        raise InvalidRequest("a DM to @name or a key prefix is resolved by the running daemon; "
                             "with no daemon running, give the member's full key", field="to.ref")
    settings, _ = config.load(config.read_file(paths.config_file), environ,
                              {"daemon.mesh": name})
    settings, _ = environment.settled(settings, environ)   # no hooks in CI, as the daemon
    asyncio.run(gate_without_daemon(paths.hooks_dir, bool(settings.hooks_enabled),
                                    settings.daemon_mesh, paths.socket, req,
                                    int(time.time() * 1000)))
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
