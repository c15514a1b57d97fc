"""``tidemesh daemon join INVITE``: make (or reuse) the member keypair, register it with the
broker by redeeming the invite over the WebSocket (a signed ``join`` frame), and save the
mesh config to ``mesh.json`` so that ``daemon up`` can connect.

Imports ``core`` and the daemon's identity and link; never ``broker``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tidemesh.core import invite as invites
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon import revocation
from tidemesh.daemon.dial import dial_first
from tidemesh.daemon.identity import load_or_create_keypair, write_private


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


async def join(invite_text: str, paths: DaemonPaths, display_name: str | None = None,
               broker_urls: tuple[str, ...] = ()) -> MeshConfig:
    """Redeem ``invite_text`` at the first of its brokers that answers; ``broker_urls``
    replace the addresses inside the invite."""
    inv = invites.decode(invite_text)
    urls = broker_urls or inv.urls
    invites.check_broker_urls(urls, "broker_url")
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    keypair, _ = load_or_create_keypair(paths.keypair)
    rotation = BrokerRotation.of(urls)
    link = await dial_first(rotation, inv.mesh_id, keypair.signing_key,
                            invite_token=inv.token, display_name=display_name)
    await link.close()
    config = MeshConfig(rotation.urls[0], inv.mesh_id, link.hello_ack["mesh_name"],
                        keypair.public_hex, int(time.time() * 1000), rotation.urls[1:])
    saved = asdict(config)
    if not config.fallback_urls:  # one broker: mesh.json stays as hosts before failover read it
        del saved["fallback_urls"]
    write_private(paths.mesh_file, {"version": 1, **saved})
    revocation.clear(paths.revoked_file)   # accepted again: an old revocation no longer holds
    return config
