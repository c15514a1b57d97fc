"""Operator actions on the store (the CLI's cold path): the settings, opening the store,
meshes, invites, members, topics. The server is ``broker.main``'s, loaded only to serve."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidemesh.broker import config as settings
from tidemesh.broker import running, store_source
from tidemesh.broker.config import (
    BrokerSettings,
    broker_home,
    config_file,
    load,
    read_file,
    store_url,
)
from tidemesh.broker.console import ensure_token
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import SQLITE_MIGRATIONS, Member, Mesh, MeshLimits, Store
from tidemesh.core.errors import InvalidRequest, NotFound
from tidemesh.core.invite import (
    Invite,
    check_broker_urls,
    new_token,
    parse_duration_ms,
    token_hash,
)
from tidemesh.storage.migrate import SchemaBehind, SchemaTooNew

# What the CLI uses besides the functions below (the import contract allows it this module
# and broker.main only).
__all__ = ["SQLITE_MIGRATIONS", "BrokerSettings", "SchemaBehind", "SchemaTooNew", "Store",
           "broker_home", "running", "settings", "store_source"]


T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


def settings_from(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
                  ) -> BrokerSettings:
    env = os.environ if environ is None else environ
    settings, _ = load(read_file(config_file(env)), env, flags)
    return settings


async def with_store(settings: BrokerSettings, fn: Callable[[Store], Awaitable[T]],
                     environ: Mapping[str, str] | None = None) -> T:
    """Open the configured store (migrating it forward), run ``fn``, close it."""
    env = os.environ if environ is None else environ
    store = await open_store(store_url(settings, env), pool_size=2)
    try:
        return await fn(store)
    finally:
        await store.close()


def public_url(settings: BrokerSettings) -> str:
    return served_url(settings, settings.host_port[1])


def served_url(settings: BrokerSettings, port: int) -> str:
    """``broker.public_url`` if set, else the address listened on (``port`` once bound)."""
    return settings.broker_public_url or f"ws://{settings.host_port[0]}:{port}"


async def mesh_by_name(store: Store, name: str) -> Mesh:
    mesh = await store.find_mesh(name)
    if mesh is None:
        raise NotFound(f"no mesh named {name!r}; create it with `tidemesh broker mesh create`",
                       field="mesh")
    return mesh


async def set_mesh_limits(store: Store, mesh_name: str, rate: float | None,
                          burst: int | None) -> Mesh:
    """The mesh's own member send budget (None: the broker's setting); brokers on this store
    apply it within ``auth.recheck_s``."""
    if rate is not None and rate < 0:
        raise InvalidRequest("--rate must be >= 0 (0: no limit)", field="rate")
    if burst is not None and burst < 1:
        raise InvalidRequest("--burst must be >= 1", field="burst")
    mesh = await mesh_by_name(store, mesh_name)
    await store.set_mesh_limits(mesh.id, MeshLimits(rate, burst))
    return mesh


@dataclass(frozen=True, slots=True)
class CreatedInvite:
    invite_id: str
    text: str
    expires_at: int | None


# The broker_info key under which a starting broker records the address it serves.
PUBLIC_URL = "public_url"


async def record_public_url(store: Store, url: str) -> None:
    await store.set_info(PUBLIC_URL, url, now_ms())


async def invite_url(store: Store, configured: str | None, default: str) -> str:
    """The address an invite carries: one given (``--url``, ``broker.public_url``), else the
    one the broker recorded when it last started, else the configured listen address."""
    return configured or await store.get_info(PUBLIC_URL) or default


async def create_invite(store: Store, mesh_name: str, urls: Sequence[str], uses: int,
                        expires: str | None) -> CreatedInvite:
    """An invite naming ``urls``, the mesh's brokers in the order daemons try them."""
    check_broker_urls(tuple(urls), "url")
    mesh = await mesh_by_name(store, mesh_name)
    token, now = new_token(), now_ms()
    expires_at = now + parse_duration_ms(expires) if expires else None
    invite_id = await store.create_invite(mesh.id, token_hash(token), uses, expires_at, now)
    invite = Invite(urls[0], mesh.id, mesh.name, token, tuple(urls[1:]))
    return CreatedInvite(invite_id, invite.encode(), expires_at)


async def list_members(store: Store, mesh_name: str) -> list[Member]:
    return await store.list_members((await mesh_by_name(store, mesh_name)).id)


async def revoke(store: Store, mesh_name: str, pubkey: str) -> bool:
    return await store.revoke_member((await mesh_by_name(store, mesh_name)).id, pubkey, now_ms())


async def create_topic(store: Store, mesh_name: str, topic: str) -> None:
    await store.create_topic((await mesh_by_name(store, mesh_name)).id, topic, None, now_ms())


def console_token(environ: Mapping[str, str]) -> str:
    """The broker console's token (made on first ask, 0600), for ``broker console-token``."""
    return ensure_token(broker_home(environ))
