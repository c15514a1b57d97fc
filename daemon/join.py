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
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon import revocation
from tidemesh.daemon.identity import load_or_create_keypair, write_private
from tidemesh.daemon.link import BrokerLink


@dataclass(frozen=True, slots=True)
class MeshConfig:
    broker_url: str
    mesh_id: str
    mesh: str
    member_pubkey: str
    joined_at: int

    @classmethod
    def load(cls, path: Path) -> MeshConfig:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(data["broker_url"], data["mesh_id"], data["mesh"], data["member_pubkey"],
                   int(data["joined_at"]))


async def join(invite_text: str, paths: DaemonPaths, display_name: str | None = None,
               broker_url: str | None = None) -> MeshConfig:
    """Redeem ``invite_text``; ``broker_url`` overrides the address inside the invite."""
    inv = invites.decode(invite_text)
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    keypair, _ = load_or_create_keypair(paths.keypair)
    url = broker_url or inv.url
    link = await BrokerLink.connect(url, inv.mesh_id, keypair.signing_key,
                                    invite_token=inv.token, display_name=display_name)
    await link.close()
    config = MeshConfig(url, inv.mesh_id, link.hello_ack["mesh_name"], keypair.public_hex,
                        int(time.time() * 1000))
    write_private(paths.mesh_file, {"version": 1, **asdict(config)})
    revocation.clear(paths.revoked_file)   # accepted again: an old revocation no longer holds
    return config
