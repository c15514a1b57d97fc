"""DM members named by ``@name`` or a key prefix, resolved for the send routes before any
outbox row exists (``core/names``; the directory is ``PresenceService``'s)."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from tidemesh.core.errors import InvalidRequest, NotFound
from tidemesh.core.names import is_key, resolve
from tidemesh.core.send import Destination, DestinationKind, SendRequest
from tidemesh.daemon.api.keys import PRESENCE
from tidemesh.daemon.records import BatchItem


def _unnamed(req: BatchItem) -> bool:
    """Whether ``req`` needs no resolving: not a DM, or a DM to a whole key."""
    return (not isinstance(req, SendRequest) or req.to.kind is not DestinationKind.DM
            or is_key(req.to.ref))


async def named(app: web.Application, req: SendRequest) -> SendRequest:
    """A DM to ``@name`` or a key prefix resolved to its key before any outbox row exists:
    a refusal consumes no id, and a retry by name or by key is the same send."""
    if _unnamed(req):
        return req
    return dataclasses.replace(req, to=await app[PRESENCE].resolved(req.to))


async def batch_named(app: web.Application, items: list[BatchItem]) -> list[BatchItem]:
    """A batch's names resolved against one read of the directory (not one per send)."""
    if all(_unnamed(it) for it in items):
        return items
    directory = await app[PRESENCE].directory()
    out: list[BatchItem] = []
    for it in items:
        if _unnamed(it) or not isinstance(it, SendRequest):
            out.append(it)
            continue
        try:
            key = resolve(it.to.ref, directory)
        except (InvalidRequest, NotFound) as exc:
            out.append(exc)
            continue
        out.append(dataclasses.replace(it, to=Destination(DestinationKind.DM, key)))
    return out
