"""Dial a mesh's brokers for a one-shot exchange (join, the cold path): from the current
address on, the first that answers wins.

A refusal that waiting cannot fix (revoked, invite used up, a missing feature) ends the
dial at once: every broker of a mesh shares one store, so the next would say the same.
"""

from __future__ import annotations

from typing import Any

from nacl.signing import SigningKey

from tidemesh.core.failover import BrokerRotation
from tidemesh.daemon.link.websocket import BrokerLink, LinkError


async def dial_first(rotation: BrokerRotation, mesh_id: str, key: SigningKey,
                     **options: Any) -> BrokerLink:
    """Connect to the first broker that answers; ``rotation.current`` is left on it."""
    last: LinkError | None = None
    for url in rotation.in_order():
        try:
            return await BrokerLink.connect(url, mesh_id, key, **options)
        except LinkError as exc:
            if not exc.retryable:
                raise
            last = exc
            rotation.failed()
    assert last is not None  # a rotation is never empty
    raise last
