"""``daemon leave`` and ``daemon reset``: a member leaves its mesh, or a host forgets it.

``leave`` asks the broker, over a session opened with the member's own signed hello, to
remove the member (``member_leave``: revoked as an operator's revoke does, its subscriptions,
queue memberships and undelivered deliveries dropped), then removes the local folders.
``reset`` touches nothing at the broker: the data files are moved aside (never deleted) so
that the local name can be joined again. Both run with the daemon stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from tidemesh.core.errors import NotJoined, Unavailable
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.paths import DaemonPaths, meshes_dir
from tidemesh.daemon.link.dial import dial_first
from tidemesh.daemon.link.websocket import HandshakeRejected, LinkError
from tidemesh.daemon.membership import revocation
from tidemesh.daemon.membership.identity import load_ephemeral, load_or_create_keypair
from tidemesh.daemon.membership.join import MeshConfig

# The files that make a host a member of a mesh; reset moves them aside, config stays.
DATA_FILES = ("keypair.json", "keypair-archive.json", "keypair-pending.json",
              "host_fingerprint.json", "mesh.json",
              "revoked.json", "outbox.db", "outbox.db-wal", "outbox.db-shm", "inbox.db",
              "inbox.db-wal", "inbox.db-shm")


@dataclass(frozen=True, slots=True)
class Left:
    mesh: str
    member_pubkey: str
    broker: dict[str, Any]          # what the broker removed, or why it had nothing to do
    removed: list[str] = field(default_factory=list)


def aside_dir(mesh: str, why: str, environ: Mapping[str, str]) -> Path:
    """Where moved-aside files go: outside the per-mesh folders, so that nothing takes the
    copy for a joined mesh."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return meshes_dir(environ).parent / "aside" / f"{mesh}-{why}-{stamp}"


async def leave_broker(mesh: MeshConfig, key: SigningKey, timeout_s: float) -> dict[str, Any]:
    """Ask the mesh's broker to remove the member ``key`` signs for; what it removed."""
    pubkey = bytes(key.verify_key).hex()
    try:
        link = await asyncio.wait_for(
            dial_first(BrokerRotation.of(mesh.broker_urls), mesh.mesh_id, key), timeout_s)
    except HandshakeRejected as exc:
        if exc.reason == revocation.REASON:
            return {"left": False, "already": "member_revoked"}
        raise Unavailable(f"the broker refused this member: {exc}") from exc
    except (LinkError, TimeoutError, OSError) as exc:
        raise Unavailable(f"cannot reach the mesh's broker to leave it: {exc}; nothing was "
                          "removed (use `daemon reset` to forget the mesh here only)") from exc
    try:
        answer = await asyncio.wait_for(link.request("member_leave", pubkey),
                                        timeout_s)
    except (LinkError, TimeoutError) as exc:
        raise Unavailable(f"the broker did not confirm the leave: {exc}; run leave again")\
            from exc
    finally:
        with contextlib.suppress(Exception):
            await link.close()
    if answer.get("type") == "error":
        err = answer["error"]
        if err.get("reason") == revocation.REASON:
            return {"left": False, "already": "member_revoked"}
        raise Unavailable(f"the broker refused the leave: {err.get('code')}: "
                          f"{err.get('message')}")
    return {k: v for k, v in answer.items() if k not in ("type", "id", "ok")}


def leave(paths: DaemonPaths, mesh: str, timeout_s: float = 20.0) -> Left:
    """Leave at the broker, then remove this mesh's local folders. The broker goes first:
    were the local files gone and the broker unreachable, the member could never leave."""
    if not paths.mesh_file.exists() or not (paths.keypair.exists()
                                            or paths.ephemeral_keypair.exists()):
        raise NotJoined(f"mesh {mesh} is not joined here (no mesh.json and keypair)")
    config = MeshConfig.load(paths.mesh_file)
    broker = asyncio.run(leave_broker(config, _member_key(paths, config), timeout_s))
    return Left(mesh, config.member_pubkey, broker, remove_local(paths))


def _member_key(paths: DaemonPaths, config: MeshConfig) -> SigningKey:
    """The joined member's key: an ephemeral one (joined in CI, no daemon run yet) or the
    data folder's."""
    ephemeral = load_ephemeral(paths.ephemeral_keypair)
    if ephemeral is not None and ephemeral.keypair.public_hex == config.member_pubkey:
        return ephemeral.keypair.signing_key
    return load_or_create_keypair(paths.keypair)[0].signing_key


def remove_local(paths: DaemonPaths) -> list[str]:
    removed = []
    for folder in sorted({paths.data_dir, paths.config_dir, paths.state_dir,
                          paths.runtime_dir}):
        if folder.exists():
            shutil.rmtree(folder)
            removed.append(str(folder))
    return removed


def reset(paths: DaemonPaths, mesh: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """Move this mesh's data files aside; the configuration (daemon.toml, hooks) stays."""
    present = [paths.data_dir / n for n in DATA_FILES if (paths.data_dir / n).exists()]
    if not present:
        return {"mesh": mesh, "moved": [], "to": None}
    to = aside_dir(mesh, "reset", environ)
    to.mkdir(parents=True, mode=0o700)
    for f in present:
        f.rename(to / f.name)
    return {"mesh": mesh, "moved": [f.name for f in present], "to": str(to)}
