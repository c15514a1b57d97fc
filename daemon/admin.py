"""The daemon's admin facade: everything the CLI may use of the daemon besides starting it
(``daemon.main``). A running daemon is reached over IPC only (``cli/client.py``); what is
here works on a daemon's files while it is stopped, joins a mesh, checks the lock and the
host, reads settings, and sends on the cold path. The import contract in pyproject.toml
allows the CLI exactly this module and ``daemon.main``."""

from __future__ import annotations

from tidemesh.daemon import coldpath, offline
from tidemesh.daemon import config as settings
from tidemesh.daemon.identity import accept_host, current_host_fingerprint
from tidemesh.daemon.join import join
from tidemesh.daemon.link import LinkError
from tidemesh.daemon.lock import holder_pid, is_held
from tidemesh.daemon.log import configure as configure_logging
from tidemesh.daemon.log import under_service_manager

__all__ = [
    "LinkError",
    "accept_host",
    "coldpath",
    "configure_logging",
    "current_host_fingerprint",
    "holder_pid",
    "is_held",
    "join",
    "offline",
    "settings",
    "under_service_manager",
]
