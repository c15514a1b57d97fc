"""The daemon's admin facade: everything the CLI may use of the daemon besides starting it
(``daemon.main``). A running daemon is reached over IPC only (``tidemesh.client``); what is
here works on a daemon's files while it is stopped, joins a mesh, checks the lock and the
host, reads settings, and sends on the cold path. The import contract in pyproject.toml
allows the CLI exactly this module and ``daemon.main``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tidemesh.storage.lock import AlreadyRunning, holder_pid, is_held

if TYPE_CHECKING:
    from tidemesh.daemon.hooks.dryrun import dry_run as dry_run_hook
    from tidemesh.daemon.hooks.files import describe as describe_hooks
    from tidemesh.daemon.link.websocket import LinkError
    from tidemesh.daemon.membership import (
        departure,
        ephemeral,
        key_rotation,
        keyarchive,
        revocation,
        token_rotation,
    )
    from tidemesh.daemon.membership.identity import accept_host, current_host_fingerprint
    from tidemesh.daemon.membership.join import join
    from tidemesh.daemon.offline import backup, coldpath, recovery
    from tidemesh.daemon.offline import outbox as offline
    from tidemesh.daemon.process import config as settings
    from tidemesh.daemon.process import fleet
    from tidemesh.daemon.process.log import configure as configure_logging
    from tidemesh.daemon.process.log import under_service_manager

# Loaded on first use: a command that only checks the lock (status, ps, down) should not
# import the WebSocket link, the cold path and the stores (about 0.4 s) to do it.
_LAZY = {
    "backup": ("tidemesh.daemon.offline.backup", None),
    "fleet": ("tidemesh.daemon.process.fleet", None),
    "departure": ("tidemesh.daemon.membership.departure", None),
    "ephemeral": ("tidemesh.daemon.membership.ephemeral", None),
    "recovery": ("tidemesh.daemon.offline.recovery", None),
    "key_rotation": ("tidemesh.daemon.membership.key_rotation", None),
    "keyarchive": ("tidemesh.daemon.membership.keyarchive", None),
    "token_rotation": ("tidemesh.daemon.membership.token_rotation", None),
    "coldpath": ("tidemesh.daemon.offline.coldpath", None),
    "offline": ("tidemesh.daemon.offline.outbox", None),
    "revocation": ("tidemesh.daemon.membership.revocation", None),
    "settings": ("tidemesh.daemon.process.config", None),
    "dry_run_hook": ("tidemesh.daemon.hooks.dryrun", "dry_run"),
    "describe_hooks": ("tidemesh.daemon.hooks.files", "describe"),
    "accept_host": ("tidemesh.daemon.membership.identity", "accept_host"),
    "current_host_fingerprint": ("tidemesh.daemon.membership.identity", "current_host_fingerprint"),
    "join": ("tidemesh.daemon.membership.join", "join"),
    "LinkError": ("tidemesh.daemon.link.websocket", "LinkError"),
    "configure_logging": ("tidemesh.daemon.process.log", "configure"),
    "under_service_manager": ("tidemesh.daemon.process.log", "under_service_manager"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    loaded = importlib.import_module(module)
    return loaded if attr is None else getattr(loaded, attr)


__all__ = [
    "AlreadyRunning",
    "LinkError",
    "accept_host",
    "backup",
    "coldpath",
    "configure_logging",
    "current_host_fingerprint",
    "departure",
    "describe_hooks",
    "dry_run_hook",
    "ephemeral",
    "fleet",
    "holder_pid",
    "is_held",
    "join",
    "key_rotation",
    "keyarchive",
    "offline",
    "recovery",
    "revocation",
    "settings",
    "token_rotation",
    "under_service_manager",
]
