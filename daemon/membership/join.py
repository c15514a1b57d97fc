"""``tidemesh daemon join INVITE``: make (or reuse) the member keypair, register it with the
broker by redeeming the invite over the WebSocket (a signed ``join`` frame), and save the
mesh config to ``mesh.json`` so that ``daemon up`` can connect. A local mesh name stays
bound to the mesh id it was joined to (DESIGN §11): re-binding it is ``--move-aside``.

Imports ``core`` and the daemon's identity and link; never ``broker``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nacl.signing import SigningKey

from tidemesh.core import invite as invites
from tidemesh.core.errors import MemberRevoked, MeshNameBound
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon.link.dial import dial_first
from tidemesh.daemon.link.websocket import HandshakeRejected
from tidemesh.daemon.membership import revocation
from tidemesh.daemon.membership.identity import (
    load_or_create_keypair,
    save_ephemeral,
    save_keypair,
    write_private,
)
from tidemesh.storage.lock import InstanceLock


@dataclass(frozen=True, slots=True)
class MeshConfig:
    broker_url: str
    mesh_id: str
    mesh: str
    member_pubkey: str
    joined_at: int
    # The mesh's other brokers (several on one PostgreSQL): the relay fails over to them.
    fallback_urls: tuple[str, ...] = ()

    @property
    def broker_urls(self) -> tuple[str, ...]:
        return (self.broker_url, *self.fallback_urls)

    @classmethod
    def load(cls, path: Path) -> MeshConfig:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(data["broker_url"], data["mesh_id"], data["mesh"], data["member_pubkey"],
                   int(data["joined_at"]), tuple(data.get("fallback_urls", ())))


# What binds a local mesh name to one mesh: its identity, its config and its message state.
# daemon.toml and hooks/ are the operator's and stay; so do the log and the runtime files.
_BOUND = ("mesh.json", "keypair.json", "keypair-archive.json", "keypair-pending.json",
          "host_fingerprint.json", "revoked.json")
_BOUND_DBS = ("outbox.db", "inbox.db")


@dataclass(frozen=True, slots=True)
class Joined:
    config: MeshConfig
    moved_aside: Path | None     # where --move-aside put the old binding's files
    # Other members the broker knows by the display name asked for (to warn the joiner).
    name_taken_by: tuple[str, ...] = ()


def bound_to(paths: DaemonPaths) -> MeshConfig | None:
    """The mesh this local name is bound to, if it was joined."""
    return MeshConfig.load(paths.mesh_file) if paths.mesh_file.exists() else None


def rebind_refused(local: str, bound: MeshConfig, inv: invites.Invite) -> MeshNameBound:
    return MeshNameBound(
        f"the local mesh name {local!r} is bound to mesh {bound.mesh} (id {bound.mesh_id}), "
        f"and this invite is for mesh {inv.mesh} (id {inv.mesh_id}); join it under another "
        f"name (--mesh {inv.mesh} or any free name), or re-bind {local!r} with --move-aside, "
        "which moves its key, outbox and inbox aside first",
        local_mesh=local, bound_mesh=bound.mesh, bound_mesh_id=bound.mesh_id,
        invite_mesh=inv.mesh, invite_mesh_id=inv.mesh_id)


def _revoked(local: str, inv: invites.Invite, pubkey: str) -> MemberRevoked:
    return MemberRevoked(
        f"this host's key {pubkey} was revoked from mesh {inv.mesh}, and the broker never "
        "takes a revoked key back, even with a new invite. To join again with a new key, run "
        f"`tidemesh daemon join INVITE --mesh {local} --move-aside`: it moves the old key, "
        "outbox and inbox aside (unsent rows go with them) and says where",
        mesh=inv.mesh, member_pubkey=pubkey)


async def join(invite_text: str, paths: DaemonPaths, local: str,
               display_name: str | None = None, broker_urls: tuple[str, ...] = (),
               move_aside: bool = False, ephemeral: bool = False,
               remint: bool = False) -> Joined:
    """Redeem ``invite_text`` at the first of its brokers that answers; ``broker_urls``
    replace the addresses inside the invite. ``local`` (the name ``--mesh`` takes) stays
    bound to one mesh id: an invite for another is refused unless ``move_aside``, which
    joins with a new key and moves the old binding's files into ``aside-<time>/`` once the
    broker has accepted it. Nothing is moved if the join fails.

    ``remint`` is ``move_aside`` for the mesh the name is bound to: a cloned image's new
    member key. ``ephemeral`` (CI) makes a new key kept in the runtime folder
    (membership/ephemeral.py), never in the data folder."""
    inv = invites.decode(invite_text)
    urls = broker_urls or inv.urls
    invites.check_broker_urls(urls, "broker_url")
    bound = bound_to(paths)
    if remint and bound is not None and bound.mesh_id != inv.mesh_id:
        raise _remint_refused(local, bound, inv)
    if bound is not None and bound.mesh_id != inv.mesh_id and not move_aside:
        raise rebind_refused(local, bound, inv)
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (move_aside or remint):
        key = (SigningKey.generate() if ephemeral
               else load_or_create_keypair(paths.keypair)[0].signing_key)
        config, taken = await _redeem(inv, urls, local, key, display_name)
        _keep(paths, key, ephemeral)
        _save(paths, config)
        return Joined(config, None, taken)
    # The old files must not move under a running daemon, nor one start meanwhile.
    lock = InstanceLock(paths.lock_file, "a daemon for this mesh")
    lock.acquire()
    try:
        key = SigningKey.generate()
        config, taken = await _redeem(inv, urls, local, key, display_name)
        moved = _move_aside(paths)
        _keep(paths, key, ephemeral)
        _save(paths, config)
        return Joined(config, moved, taken)
    finally:
        lock.release()


def _remint_refused(local: str, bound: MeshConfig, inv: invites.Invite) -> MeshNameBound:
    return MeshNameBound(
        f"--remint gives the member of mesh {bound.mesh} (id {bound.mesh_id}), which "
        f"{local!r} is bound to, a new key; this invite is for mesh {inv.mesh} (id "
        f"{inv.mesh_id}). Use an invite of mesh {bound.mesh}, or --move-aside to re-bind "
        f"{local!r} to the other mesh",
        local_mesh=local, bound_mesh=bound.mesh, bound_mesh_id=bound.mesh_id,
        invite_mesh=inv.mesh, invite_mesh_id=inv.mesh_id)


def _keep(paths: DaemonPaths, key: SigningKey, ephemeral: bool) -> None:
    if ephemeral:
        save_ephemeral(paths.ephemeral_keypair, key)
    else:
        save_keypair(paths.keypair, key)


async def _redeem(inv: invites.Invite, urls: tuple[str, ...], local: str, key: SigningKey,
                  display_name: str | None) -> tuple[MeshConfig, tuple[str, ...]]:
    rotation = BrokerRotation.of(urls)
    try:
        link = await dial_first(rotation, inv.mesh_id, key, invite_token=inv.token,
                                display_name=display_name)
    except HandshakeRejected as exc:
        if exc.reason == revocation.REASON:
            raise _revoked(local, inv, bytes(key.verify_key).hex()) from exc
        raise
    await link.close()
    taken = link.hello_ack.get("name_taken_by")
    return (MeshConfig(rotation.urls[0], inv.mesh_id, link.hello_ack["mesh_name"],
                       bytes(key.verify_key).hex(), int(time.time() * 1000), rotation.urls[1:]),
            tuple(str(k) for k in taken) if isinstance(taken, list) else ())


def _save(paths: DaemonPaths, config: MeshConfig) -> None:
    saved = asdict(config)
    if not config.fallback_urls:  # one broker: mesh.json stays as hosts before failover read it
        del saved["fallback_urls"]
    write_private(paths.mesh_file, {"version": 1, **saved})
    revocation.clear(paths.revoked_file)   # accepted again: an old revocation no longer holds


def _move_aside(paths: DaemonPaths) -> Path | None:
    """Move the files of the old binding into a new ``aside-<UTC time>/`` of the data
    folder (kept, never deleted); None when there was nothing to move."""
    names = [n for n in _BOUND if (paths.data_dir / n).exists()]
    names += sorted(p.name for p in paths.data_dir.iterdir()
                    if p.is_file() and p.name.startswith(_BOUND_DBS))
    if not names:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = paths.data_dir / f"aside-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = paths.data_dir / f"aside-{stamp}-{n}"
    target.mkdir(mode=0o700)
    for name in names:
        os.replace(paths.data_dir / name, target / name)
    return target
